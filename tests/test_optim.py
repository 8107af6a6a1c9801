"""AdamW and WarmupCosine (chapter 3) against torch.optim.AdamW and torch's LR schedulers.

Tolerances: in float64 our update performs the same floating-point operations in the same order as
torch's single-tensor AdamW, so parameters agree to 1e-13 over 120 steps (observed: bit-for-bit); the schedule
agrees with torch's SequentialLR(LinearLR, CosineAnnealingLR), whose cosine is computed recursively, to 1e-15.
"""

import copy
import itertools
import math
import warnings

import numpy as np
import pytest
import torch
from torch import nn

from transformer_lab.mlp import MLP
from transformer_lab.optim import AdamW, WarmupCosine, decay_groups

TOL = dict(atol=1e-13, rtol=1e-12)


def tiny_model(seed=0):
    """A real small model: embedding → LayerNorm → our MLP block → LayerNorm → head (2 layers + norms)."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Embedding(11, 8), nn.LayerNorm(8), MLP(8, 32), nn.LayerNorm(8), nn.Linear(8, 11))
    return model.double()


def batches(n, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randint(0, 11, (4, 6), generator=g), torch.randint(0, 11, (4, 6), generator=g))
            for _ in range(n)]


def train_step(model, opt, x, y):
    opt.zero_grad()
    logits = model(x)
    loss = nn.functional.cross_entropy(logits.reshape(-1, 11), y.reshape(-1))
    loss.backward()
    opt.step()
    return loss.item()


@pytest.mark.parametrize(("betas", "weight_decay"), [((0.9, 0.999), 0.1), ((0.8, 0.95), 0.5), ((0.0, 0.9), 0.0)])
def test_adamw_matches_torch_step_by_step(betas, weight_decay):
    ours_m, ref_m = tiny_model(), tiny_model()
    ours = AdamW(decay_groups(ours_m, weight_decay), lr=3e-3, betas=betas, eps=1e-8)
    ref = torch.optim.AdamW(decay_groups(ref_m, weight_decay), lr=3e-3, betas=betas, eps=1e-8, foreach=False)
    sched = WarmupCosine(3e-3, 3e-4, warmup=10, total=100)
    losses = []
    for step, (x, y) in enumerate(batches(120)):
        sched.apply(ours, step)
        sched.apply(ref, step)
        losses.append(train_step(ours_m, ours, x, y))
        train_step(ref_m, ref, x, y)
        for (name, p), q in zip(ours_m.named_parameters(), ref_m.parameters(), strict=True):
            torch.testing.assert_close(p, q, **TOL, msg=lambda m, n=name, s=step: f"{n} at step {s}: {m}")
            s_ours, s_ref = ours.state[p], ref.state[q]
            assert s_ours["step"] == int(s_ref["step"]) == step + 1
            torch.testing.assert_close(s_ours["exp_avg"], s_ref["exp_avg"], **TOL)
            torch.testing.assert_close(s_ours["exp_avg_sq"], s_ref["exp_avg_sq"], **TOL)
    assert losses[-1] < losses[0]  # it learned something: the match is not on a frozen model


def test_decay_groups_really_decay_differently():
    model = tiny_model()
    groups = decay_groups(model, 0.1)
    assert [g["weight_decay"] for g in groups] == [0.1, 0.0]
    assert all(p.dim() >= 2 for p in groups[0]["params"])
    assert all(p.dim() == 1 for p in groups[1]["params"])
    assert len(groups[0]["params"]) + len(groups[1]["params"]) == len(list(model.parameters()))
    # with zero gradients, Adam's step is 0 and only decoupled decay moves the weights: θ(1 − ηλ)
    before = [p.detach().clone() for p in model.parameters()]
    opt = AdamW(groups, lr=0.5, weight_decay=0.1)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    for p, b in zip(model.parameters(), before, strict=True):
        expected = b * (1 - 0.5 * 0.1) if p.dim() >= 2 else b
        torch.testing.assert_close(p.detach(), expected, atol=0, rtol=1e-15)


def test_decay_groups_tied_weights_once():
    emb = nn.Embedding(5, 4)
    head = nn.Linear(4, 5, bias=False)
    head.weight = emb.weight
    model = nn.ModuleDict({"emb": emb, "head": head})
    groups = decay_groups(model, 0.1)
    assert len(groups[0]["params"]) == 1
    assert len(groups[1]["params"]) == 0


def test_first_step_is_lr_times_sign():
    # at t = 1, m̂ = g and v̂ = g², so the step is −η g / (|g| + ε) whatever β₁, β₂ are
    p = nn.Parameter(torch.tensor([3.0, -0.02, 1e-3], dtype=torch.float64))
    opt = AdamW([p], lr=0.1, betas=(0.7, 0.9), eps=1e-8, weight_decay=0.0)
    g = torch.tensor([5.0, -2.0, 1e-4], dtype=torch.float64)
    p.grad = g.clone()
    start = p.detach().clone()
    opt.step()
    torch.testing.assert_close(p.detach() - start, -0.1 * g / (g.abs() + 1e-8), atol=1e-15, rtol=1e-13)


def test_state_dict_round_trip_is_exact():
    data = batches(60)
    full_m = tiny_model()
    full = AdamW(decay_groups(full_m, 0.1), lr=2e-3)
    for x, y in data:
        train_step(full_m, full, x, y)

    part_m = tiny_model()
    part = AdamW(decay_groups(part_m, 0.1), lr=2e-3)
    for x, y in data[:30]:
        train_step(part_m, part, x, y)
    saved_model = copy.deepcopy(part_m.state_dict())
    saved_opt = copy.deepcopy(part.state_dict())
    resumed_m = tiny_model(seed=5)  # different init, overwritten by the checkpoint
    resumed_m.load_state_dict(saved_model)
    resumed = AdamW(decay_groups(resumed_m, 0.1), lr=2e-3)
    resumed.load_state_dict(saved_opt)
    assert resumed.state_dict()["state"][0]["step"] == 30
    for x, y in data[30:]:
        train_step(resumed_m, resumed, x, y)
    for p, q in zip(resumed_m.parameters(), full_m.parameters(), strict=True):
        assert torch.equal(p, q)


def test_loads_torch_adamw_state():
    ours_m, ref_m = tiny_model(), tiny_model()
    ref = torch.optim.AdamW(ref_m.parameters(), lr=1e-3, foreach=False)
    data = batches(20)
    for x, y in data[:10]:
        train_step(ref_m, ref, x, y)
    ours_m.load_state_dict(ref_m.state_dict())
    ours = AdamW(ours_m.parameters(), lr=1e-3)
    ours.load_state_dict(copy.deepcopy(ref.state_dict()))  # state_dict() returns references, not copies
    assert isinstance(next(iter(ours.state.values()))["step"], int)
    for x, y in data[10:]:
        train_step(ref_m, ref, x, y)
        train_step(ours_m, ours, x, y)
    for p, q in zip(ours_m.parameters(), ref_m.parameters(), strict=True):
        torch.testing.assert_close(p, q, **TOL)


def test_float32_matches_too():
    ours_m, ref_m = tiny_model().float(), tiny_model().float()
    ours = AdamW(ours_m.parameters(), lr=1e-3)
    ref = torch.optim.AdamW(ref_m.parameters(), lr=1e-3, foreach=False)
    for x, y in batches(20):
        train_step(ours_m, ours, x, y)
        train_step(ref_m, ref, x, y)
    for p, q in zip(ours_m.parameters(), ref_m.parameters(), strict=True):
        torch.testing.assert_close(p, q, atol=0, rtol=0)  # the same float32 operations in the same order


@pytest.mark.parametrize(("dtype", "value"), [(torch.float16, 1e4), (torch.float32, 3e19), (torch.float64, 1e160)])
def test_large_finite_gradient_is_accepted(dtype, value):
    """Finite entries whose L2 norm overflows (100 × 1e4 in float16) are finite: we step like torch does."""
    ours_p, ref_p = nn.Parameter(torch.ones(100, dtype=dtype)), nn.Parameter(torch.ones(100, dtype=dtype))
    ours = AdamW([ours_p], lr=1e-3)
    ref = torch.optim.AdamW([ref_p], lr=1e-3, foreach=False)
    for p, opt in ((ours_p, ours), (ref_p, ref)):
        p.grad = torch.full((100,), value, dtype=dtype)
        assert not torch.isfinite(torch.linalg.vector_norm(p.grad))  # the L2 norm would have said "non-finite"
        opt.step()
    torch.testing.assert_close(ours_p, ref_p, atol=0, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_half_gradient_raises(dtype, bad):
    p = nn.Parameter(torch.zeros(5, dtype=dtype))
    opt = AdamW([p], lr=1e-3)
    p.grad = torch.tensor([1.0, 2.0, bad, 3.0, 4.0], dtype=dtype)
    with pytest.raises(ValueError, match="non-finite gradient"):
        opt.step()


@pytest.mark.parametrize("flag", ["maximize", "amsgrad"])
def test_refuses_a_torch_state_it_would_misread(flag):
    ref_p, ours_p = nn.Parameter(torch.ones(3)), nn.Parameter(torch.ones(3))
    ref = torch.optim.AdamW([ref_p], lr=1e-3, **{flag: True})
    ref_p.grad = torch.ones(3)
    ref.step()
    ours = AdamW([ours_p], lr=1e-3)
    with pytest.raises(ValueError, match=f"{flag}=True"):
        ours.load_state_dict(ref.state_dict())


# ---------------------------------------------------------------- schedule
def test_schedule_closed_form_points():
    s = WarmupCosine(max_lr=1e-3, min_lr=1e-4, warmup=10, total=110)
    assert s(0) == pytest.approx(1e-4)  # (0 + 1)/10 of the peak
    assert s(9) == pytest.approx(1e-3)
    assert s(10) == pytest.approx(1e-3)
    assert s(60) == pytest.approx(5.5e-4)  # halfway: the mean of max and min
    assert s(110) == pytest.approx(1e-4)
    assert s(5000) == 1e-4
    lrs = [s(t) for t in range(10, 111)]
    assert all(a >= b for a, b in itertools.pairwise(lrs))  # non-increasing after warm-up


@pytest.mark.parametrize(("warmup", "total", "min_lr"), [(10, 100, 1e-4), (1, 50, 0.0), (25, 26, 5e-4)])
def test_schedule_matches_torch_schedulers(warmup, total, min_lr):
    from torch.optim.lr_scheduler import CosineAnnealingLR, LinearLR, SequentialLR

    s = WarmupCosine(1e-3, min_lr, warmup, total)
    p = nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=1e-3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = SequentialLR(opt, [LinearLR(opt, start_factor=1 / warmup, end_factor=1.0, total_iters=warmup - 1),
                                 CosineAnnealingLR(opt, T_max=total - warmup, eta_min=min_lr)],
                           milestones=[warmup])
        for step in range(total + 1):
            assert opt.param_groups[0]["lr"] == pytest.approx(s(step), abs=1e-15), step
            opt.step()
            ref.step()


def test_schedule_zero_warmup_starts_at_peak_and_apply_sets_groups():
    s = WarmupCosine(2e-3, 0.0, 0, 10)
    assert s(0) == 2e-3
    assert s(10) == pytest.approx(0.0, abs=1e-18)
    opt = AdamW([{"params": [nn.Parameter(torch.zeros(2))]}, {"params": [nn.Parameter(torch.zeros(3))]}])
    lr = s.apply(opt, 5)
    assert lr == pytest.approx(1e-3)
    assert [g["lr"] for g in opt.param_groups] == [lr, lr]


def test_zero_learning_rate_during_training_leaves_the_parameter_but_advances_the_state():
    """Refused at construction, accepted from a schedule: η = 0 leaves θ (decay included) and advances m, v, t,
    so a warm-up ramp from 0 would waste step 0 (the chapter says so)."""
    p = nn.Parameter(torch.ones(3, dtype=torch.float64))
    opt = AdamW([p], lr=1e-3, weight_decay=0.1)
    opt.param_groups[0]["lr"] = 0.0
    p.grad = torch.tensor([0.5, -1.0, 2.0], dtype=torch.float64)
    opt.step()
    assert torch.equal(p.detach(), torch.ones(3, dtype=torch.float64))
    assert opt.state[p]["step"] == 1
    assert torch.allclose(opt.state[p]["exp_avg"], (1 - 0.9) * p.grad, rtol=1e-15, atol=0)
    assert opt.state[p]["exp_avg_sq"].abs().min() > 0


# ---------------------------------------------------------------- bad input
@pytest.mark.parametrize(("kwargs", "match"), [
    (dict(lr=0.0), "learning rate"), (dict(lr=-1e-3), "learning rate"), (dict(lr=math.nan), "learning rate"),
    (dict(betas=(1.0, 0.999)), r"betas\[0\]"), (dict(betas=(-0.1, 0.999)), r"betas\[0\]"),
    (dict(betas=(0.9, 1.0)), r"betas\[1\]"), (dict(betas=(0.9,)), "pair"),
    (dict(eps=0.0), "eps"), (dict(weight_decay=-0.1), "weight_decay"),
])
def test_bad_hyperparameters(kwargs, match):
    with pytest.raises(ValueError, match=match):
        AdamW([nn.Parameter(torch.zeros(2))], **kwargs)


def test_bad_group_hyperparameters():
    with pytest.raises(ValueError, match="learning rate"):
        AdamW([{"params": [nn.Parameter(torch.zeros(2))], "lr": -1.0}])


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_gradient_raises(bad):
    p = nn.Parameter(torch.zeros(3))
    q = nn.Parameter(torch.ones(2, 2))
    opt = AdamW([p, q], lr=1e-3)
    p.grad = torch.zeros(3)
    q.grad = torch.tensor([[0.0, bad], [1.0, 2.0]])
    with pytest.raises(ValueError, match=r"non-finite gradient .* shape \(2, 2\)"):
        opt.step()
    assert torch.equal(q.detach(), torch.ones(2, 2))  # nothing was updated


def test_negative_lr_set_by_hand_raises_at_step():
    p = nn.Parameter(torch.zeros(3))
    opt = AdamW([p], lr=1e-3)
    opt.param_groups[0]["lr"] = -1.0
    p.grad = torch.ones(3)
    with pytest.raises(ValueError, match="learning rate"):
        opt.step()


def test_mismatched_state_shape_raises():
    src = nn.Linear(3, 2)
    src_opt = AdamW(src.parameters())
    src.weight.grad, src.bias.grad = torch.ones(2, 3), torch.ones(2)
    src_opt.step()
    dst = nn.Linear(2, 3)  # same number of tensors, other shapes
    dst_opt = AdamW(dst.parameters())
    dst_opt.load_state_dict(src_opt.state_dict())
    dst.weight.grad, dst.bias.grad = torch.ones(3, 2), torch.ones(3)
    with pytest.raises(ValueError, match=r"state 'exp_avg' has shape \(2, 3\), parameter has \(3, 2\)"):
        dst_opt.step()


@pytest.mark.parametrize(("args", "match"), [
    ((0.0, 0.0, 1, 10), "max_lr"), ((1e-3, 2e-3, 1, 10), "min_lr"), ((1e-3, -1e-4, 1, 10), "min_lr"),
    ((1e-3, 1e-4, -1, 10), "warmup"), ((1e-3, 1e-4, 10, 10), "total"), ((1e-3, 1e-4, 2.5, 10), "warmup"),
])
def test_bad_schedule(args, match):
    with pytest.raises(ValueError, match=match):
        WarmupCosine(*args)


def test_schedule_accepts_numpy_integers():
    s = WarmupCosine(1e-3, 1e-4, 2, 10)
    assert s(np.int64(5)) == s(5) and s(np.int32(0)) == s(0)


@pytest.mark.parametrize("step", [-1, 1.5, True, np.float64(3.0), np.int64(-1)])
def test_bad_schedule_step(step):
    with pytest.raises(ValueError, match="step"):
        WarmupCosine(1e-3, 1e-4, 2, 10)(step)


def test_decay_groups_bad_input():
    with pytest.raises(ValueError, match="weight_decay"):
        decay_groups(nn.Linear(2, 2), -1.0)
    with pytest.raises(ValueError, match="no trainable"):
        decay_groups(nn.ReLU(), 0.1)


def test_non_finite_gradient_in_a_later_group_changes_nothing():
    """A NaN in group 2 raises before group 1 is touched: every parameter, moment and step counter unchanged."""
    model = tiny_model()
    opt = AdamW(decay_groups(model, 0.1), lr=1e-2)
    x, y = batches(1)[0]
    train_step(model, opt, x, y)  # a state to preserve
    before = {k: v.clone() for k, v in model.state_dict().items()}
    state_before = copy.deepcopy(opt.state_dict())
    opt.zero_grad()
    nn.functional.cross_entropy(model(x).reshape(-1, 11), y.reshape(-1)).backward()
    bad = opt.param_groups[1]["params"][-1]  # a 1-D tensor: the second (not decayed) group
    bad.grad[0] = math.nan
    with pytest.raises(ValueError, match="non-finite gradient"):
        opt.step()
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k
    after = opt.state_dict()
    assert after["state"].keys() == state_before["state"].keys()
    for i, s in state_before["state"].items():
        assert after["state"][i]["step"] == s["step"]
        assert torch.equal(after["state"][i]["exp_avg"], s["exp_avg"])
        assert torch.equal(after["state"][i]["exp_avg_sq"], s["exp_avg_sq"])


def test_bad_lr_in_a_later_group_creates_no_state():
    p, q = nn.Parameter(torch.zeros(3)), nn.Parameter(torch.zeros(2))
    opt = AdamW([{"params": [p]}, {"params": [q]}], lr=1e-3)
    opt.param_groups[1]["lr"] = math.nan
    p.grad, q.grad = torch.ones(3), torch.ones(2)
    with pytest.raises(ValueError, match="learning rate"):
        opt.step()
    assert len(opt.state) == 0 and torch.equal(p.detach(), torch.zeros(3))


def test_zero_size_parameter_steps_like_torch():
    """A parameter with no elements (inf-norm undefined) is skipped by the finiteness check, as torch steps it."""
    ps = [[nn.Parameter(torch.zeros(0, dtype=torch.float64)), nn.Parameter(torch.zeros(3, dtype=torch.float64))]
          for _ in range(2)]
    opts = [AdamW(ps[0], lr=0.1), torch.optim.AdamW(ps[1], lr=0.1)]
    for group, opt in zip(ps, opts, strict=True):
        for p in group:
            p.grad = torch.ones_like(p)
        opt.step()
    assert torch.equal(ps[0][1], ps[1][1]) and ps[0][0].shape == (0,)
    ps[0][1].grad = torch.tensor([0.0, float("nan"), 0.0], dtype=torch.float64)
    with pytest.raises(ValueError, match="non-finite"):
        opts[0].step()
