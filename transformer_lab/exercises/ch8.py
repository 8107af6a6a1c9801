"""Chapter 8 exercises (the mini-GPT): count its parameters, cut a text into training windows, attend through a
key/value cache, measure how spread a head's attention is, decide from their logits whether two implementations
compute the same function, read what each rung of the ladder adds, read a residual stream through the logit lens,
save what a training loop needs to resume exactly, place a model's loss among the n-gram baselines, compute the
distribution that temperature, top-k and top-p leave to sample from.

Each ``check_<name>(fn)`` compares a student's function with ours and returns a
:class:`~transformer_lab.exercises.CheckResult` saying what differs.
"""

from __future__ import annotations

import copy
import itertools
import math
import operator
import re

import numpy as np
import torch
from torch import nn

from transformer_lab import ladder
from transformer_lab.attention import scaled_dot_product_attention
from transformer_lab.exercises import CheckResult, check_function, describe_difference, generator, randn
from transformer_lab.gpt import GPT, GPTConfig
from transformer_lab.norm import layer_norm
from transformer_lab.reference import ReferenceGPT
from transformer_lab.sampling import filter_logits

__all__ = ["EXERCISES", "check_attend_with_cache", "check_attention_entropy", "check_checkpoint",
           "check_count_params", "check_ladder_gains", "check_lm_windows", "check_logit_lens",
           "check_next_char_probs", "check_ngram_place", "check_same_function"]


def _count_reference(vocab_size, block_size, n_layer, d_model):
    config = GPTConfig(vocab_size=vocab_size, block_size=block_size, n_layer=n_layer, n_head=1, d_model=d_model)
    return GPT(config).num_params()


def check_count_params(fn) -> CheckResult:
    """``count_params(vocab_size, block_size, n_layer, d_model) -> int``: the GPT's parameters, tied head once."""
    cases = [dict(vocab_size=64, block_size=64, n_layer=4, d_model=128),
             dict(vocab_size=10, block_size=8, n_layer=1, d_model=4),
             dict(vocab_size=3, block_size=300, n_layer=6, d_model=24)]

    def compare(got, expected):
        if isinstance(got, bool) or not isinstance(got, int | np.integer):
            head = f"count must be an int, got {type(got).__name__} {got!r}"
            if isinstance(got, float):
                return head + (" (the right number: use // or int(), not /)" if got == expected
                               else f", expected {expected}")
            try:  # an exact integer of another type (a SymPy Integer, a 0-d integer tensor)
                value = operator.index(got)
            except TypeError:
                return head + f", expected {expected}"
            return head + (" (the right number: convert it with int())" if value == expected
                           else f", which is {value} ({value - expected:+d}), expected {expected}")
        if int(got) != expected:
            return f"count is {int(got)} ({int(got) - expected:+d}), expected {expected}"
        return None

    result = check_function("count_params", fn, _count_reference, cases, compare=compare)
    failed = re.search(r"on case (\d+):", result.message)
    if result.passed or not failed:
        return result
    case = cases[int(failed[1]) - 1]
    try:
        got = operator.index(fn(**case))
    except Exception:  # not an integer, or it raised: the message already says so
        return result
    hint = _count_hint(got - _count_reference(**case), **case)
    return result if hint is None else CheckResult(result.name, False, f"{result.message}. Hint: {hint}")


def _count_hint(diff: int, vocab_size: int, block_size: int, n_layer: int, d_model: int) -> str | None:
    """The slip a count off by ``diff`` most likely made, named; None when no single slip explains it."""
    C = d_model
    slips = {vocab_size * C: "the head is tied to the embedding: count the V × C matrix once",
             -block_size * C: "the position table, T × C, is a parameter too",
             -2 * C: "the final LayerNorm before the head has γ and β, 2C",
             -n_layer * 4 * C: "each block has two LayerNorms, each with γ and β: 4C per block",
             -n_layer * 9 * C: "the linear layers have biases: 4C in attention and 5C in the MLP, per block",
             -n_layer * 13 * C: "the biases and LayerNorms: 13C per block",
             -n_layer * 6 * C * C - n_layer * 3 * C: "the MLP's hidden layer is 4C wide, not C"}
    return slips.get(diff)


def _windows_reference(ids, block_size):
    n = (len(ids) - 1) // block_size
    starts = torch.arange(n)[:, None] * block_size + torch.arange(block_size)  # (N, T)
    return ids[starts], ids[starts + 1]


def check_lm_windows(fn) -> CheckResult:
    """``lm_windows(ids, block_size) -> (x, y)``: consecutive non-overlapping windows x (N, T), y = x shifted by 1."""
    gen = generator(8)
    cases = [dict(ids=torch.arange(10), block_size=3), dict(ids=torch.arange(13), block_size=4),
             dict(ids=torch.randint(0, 60, (101,), generator=gen), block_size=10),
             dict(ids=torch.arange(5), block_size=4),
             dict(ids=torch.arange(12), block_size=4)]  # T divides the length: N = 2, not 12 // 4 = 3
    result = check_function("lm_windows", fn, _windows_reference, cases, atol=0, rtol=0)
    if not result.passed and "on case 5" in result.message:
        hint = "; hint: N = (len - 1) // T: the last window needs one more token for its targets"
        try:
            rows = fn(*cases[4].values())[0].shape[0]
        except Exception:  # a student's crash only drops the count below
            rows = None
        n_ids, t = len(cases[4]["ids"]), cases[4]["block_size"]
        if isinstance(rows, int) and rows > (n_ids - 1) // t:
            hint += f" ({n_ids} tokens give {(n_ids - 1) // t} windows whose targets all exist; you made {rows})"
        return CheckResult(result.name, False, result.message + hint)
    return result


def _cache_reference(q, k_cache, v_cache, k_new, v_new):
    k = torch.cat((k_cache, k_new), dim=-2)
    v = torch.cat((v_cache, v_new), dim=-2)
    out, _ = scaled_dot_product_attention(query=q, key=k, value=v)
    return out, k, v


def check_attend_with_cache(fn) -> CheckResult:
    """``attend_with_cache(q, k_cache, v_cache, k_new, v_new) -> (out, k, v)``: append the new key (B, h, 1, d)
    and value (B, h, 1, d_v) to the caches (B, h, t, d) and (B, h, t, d_v), then attend with the one new query
    q (B, h, 1, d), scores scaled by 1/sqrt(d); out is (B, h, 1, d_v).

    Case 4 gives the new key a score of 1000 (float64): a softmax that does not subtract the row maximum overflows
    there.
    """
    gen = generator(9)

    def r(*shape):
        return randn(gen, *shape)

    big = r(1, 2, 1, 4)
    cases = [dict(q=r(1, 1, 1, 4), k_cache=r(1, 1, 3, 4), v_cache=r(1, 1, 3, 4), k_new=r(1, 1, 1, 4),
                  v_new=r(1, 1, 1, 4)),
             dict(q=r(2, 3, 1, 8), k_cache=r(2, 3, 5, 8), v_cache=r(2, 3, 5, 2), k_new=r(2, 3, 1, 8),
                  v_new=r(2, 3, 1, 2)),
             dict(q=r(1, 2, 1, 4), k_cache=r(1, 2, 0, 4), v_cache=r(1, 2, 0, 4), k_new=r(1, 2, 1, 4),
                  v_new=r(1, 2, 1, 4)),
             dict(q=2e3 * big / (big**2).sum(-1, keepdim=True), k_cache=r(1, 2, 3, 4), v_cache=r(1, 2, 3, 4),
                  k_new=big, v_new=r(1, 2, 1, 4))]  # the new key's score is 1000 whatever the draw: e^1000 = inf

    def compare(got, expected):
        if isinstance(got, tuple | list) and len(got) == len(expected):
            for i, (g, e) in enumerate(zip(got, expected, strict=True)):
                if isinstance(g, torch.Tensor) and g.dtype != e.dtype:
                    return (f"output[{i}] has dtype {g.dtype}, expected {e.dtype}; hint: compute in the inputs' "
                            f"dtype ({e.dtype}): a .float() or a tensor made without dtype= rounds to float32")
        msg = describe_difference(got, expected, atol=1e-10, rtol=1e-8)
        if not msg or not isinstance(got, tuple | list) or not got or not isinstance(got[0], torch.Tensor):
            return msg
        out, v = got[0].to(expected[0].dtype), expected[2]
        if out.shape == expected[0].shape and not torch.isfinite(out).all():
            return msg + ("; hint: the output is not finite: exp overflowed, so subtract each row's maximum "
                          "score before exp (softmax does not change)")
        if out.shape == expected[0].shape:
            err = float(((out - expected[0]).abs() / expected[0].abs().clamp(min=1)).max())
            if 1e-10 < err < 1e-5:
                return msg + (f"; hint: a relative error of {err:.1e} is float32's round-off (its epsilon is "
                              "1.2e-07): compute in float64 throughout, not in float32 and cast back")
        if v.shape[-2] > 1 and out.shape == v[..., :1, :].shape and torch.allclose(out, v[..., :1, :]):
            return msg + ("; hint: the output is the first value only, as if the query saw key 0 alone: a causal "
                          "mask aligned top-left (is_causal=True, or tril of a 1 × (t + 1) matrix) hides the "
                          "cache; the newest query may see every key, so no mask is needed")
        return msg

    return check_function("attend_with_cache", fn, _cache_reference, cases, compare=compare)


def _entropy_reference(w):
    return -torch.special.xlogy(w, w).sum(-1) + 0.0  # xlogy(0, 0) = 0: masked keys add nothing; + 0.0: no -0


def _causal_weights(gen, *shape, scale=1.0):
    """Softmax rows of random scores (..., T, T) under a causal mask: zeros above the diagonal."""
    s = randn(gen, *shape, scale=scale)
    mask = torch.ones(shape[-2:], dtype=torch.bool).tril()
    return torch.softmax(s.masked_fill(~mask, float("-inf")), dim=-1)


def check_attention_entropy(fn) -> CheckResult:
    """``attention_entropy(w) -> (..., T)``: the entropy in nats, -Σ_j w_ij ln w_ij, of each row of attention
    weights w (..., T, T), a zero weight (a masked key) adding 0 since x ln x -> 0 as x -> 0."""
    gen = generator(10)
    cases = [dict(w=_causal_weights(gen, 4, 4)), dict(w=_causal_weights(gen, 2, 3, 6, 6, scale=3.0)),
             dict(w=torch.full((1, 5), 0.2, dtype=torch.float64)),  # one uniform row: ln 5
             dict(w=torch.eye(3, dtype=torch.float64))]  # one-hot rows: entropy 0

    def compare(got, expected):
        msg = describe_difference(got, expected, atol=1e-10, rtol=1e-8)
        if not msg or not isinstance(got, torch.Tensor) or got.shape != expected.shape:
            return msg
        if got.dtype != expected.dtype:
            return msg + (f"; hint: the answer has dtype {got.dtype}, the weights {expected.dtype}: compute in the "
                          "weights' dtype (a .float() or a tensor made without dtype= rounds to float32)")
        g = got
        if torch.isnan(g).any():
            return msg + "; hint: 0 · ln 0 gave NaN: a zero weight (a masked key) must add 0 (torch.special.xlogy)"
        if torch.allclose(g, -expected, atol=1e-8):
            return msg + "; hint: the sign: entropy is -Σ w ln w, which is >= 0"
        if torch.allclose(g * math.log(2), expected, atol=1e-8):
            return msg + "; hint: these are bits (log2); the page measures nats, with the natural log"
        return msg

    return check_function("attention_entropy", fn, _entropy_reference, cases, compare=compare)


SAME_TOLERANCE = 1000  # round-off allowance, in units of the dtype's epsilon times the logits' scale


def _same_reference(a, b):
    if a.shape != b.shape:
        return False
    eps = torch.finfo(b.dtype).eps
    return bool((a - b).abs().max() <= SAME_TOLERANCE * eps * max(1.0, float(b.abs().max())))


class _InFloat32(nn.Module):
    """A linear layer computing in float32 whatever its input's dtype: the bug of a stray ``.float()``."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.linear = linear

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear.float()(x.float()).to(x.dtype)


class _TanhGELU(nn.Module):
    """The tanh GELU, 0.5 x (1 + tanh(c (x + 0.044715 x³))), with the constant c ≈ √(2/π) as typed."""

    def __init__(self, c: float):
        super().__init__()
        self.c = c

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 0.5 * x * (1 + torch.tanh(self.c * (x + 0.044715 * x**3)))


def _logit_pairs(gen) -> list[tuple[dict, str]]:
    """Logits of our GPT and of the reference GPT loaded with its weights, on the same tokens: equal up to round-off
    in float64 and float32, then four with a bug (three in the reference, one in the shape), then a GELU constant typed
    to 11 digits (round-off sized: the same) and to 9 digits (a tiny bug: not the same), each with the hint for a
    wrong verdict there."""
    c = GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=2, d_model=16)
    idx = torch.randint(0, c.vocab_size, (2, c.block_size), generator=gen)
    with torch.random.fork_rng():  # the models' initialisation draws from the global generator: leave it as it was
        torch.manual_seed(int(torch.randint(0, 2**31, (1,), generator=gen)))
        ours, ref = GPT(c).double().eval(), ReferenceGPT(c).double().eval()
    ref.load_state_dict(ours.state_dict())
    in_float32, exact_gelu, transposed = copy.deepcopy(ref), copy.deepcopy(ref), copy.deepcopy(ref)
    in_float32.blocks[0].mlp.fc = _InFloat32(in_float32.blocks[0].mlp.fc)
    for block in exact_gelu.blocks:
        block.gelu = nn.GELU()  # erf GELU where the model uses the tanh approximation
    # √(2/π) = 0.7978845608028654 typed to 11 digits (an error of 3e-12: ~100 ε in the logits, round-off sized) and
    # to 9 digits (1.4e-10: ~6000 ε, a tiny real bug that only a tolerance tied to the dtype's ε catches)
    typed11, typed9 = copy.deepcopy(ref), copy.deepcopy(ref)
    for a, b in zip(typed11.blocks, typed9.blocks, strict=True):
        a.gelu, b.gelu = _TanhGELU(0.79788456080), _TanhGELU(0.797884561)
    with torch.no_grad():
        transposed.blocks[0].attn.out_proj.weight.copy_(transposed.blocks[0].attn.out_proj.weight.T.clone())
        run = {name: m(idx) for name, m in (("ours", ours), ("ref", ref), ("float32", in_float32),
                                            ("gelu", exact_gelu), ("transposed", transposed),
                                            ("typed11", typed11), ("typed9", typed9))}
        run["ours32"], run["ref32"] = ours.float()(idx), ref.float()(idx)

    def gap(a, b):
        return f"max |a - b| = {float((a - b).abs().max()):.2g}"

    def in_eps(a, b):  # the gap in units of ε · max(1, max |b|), as the exercise measures it
        return float((a - b).abs().max()) / (torch.finfo(b.dtype).eps * max(1.0, float(b.abs().max())))

    round_off = ("; hint: the two implementations add in different orders (a fused kernel against ours), so their "
                 "logits differ by round-off ({}); bitwise equality is too strict: allow a multiple of "
                 "torch.finfo(dtype).eps times the logits' scale, in the logits' own dtype")
    return [(dict(a=run["ours"], b=run["ref"]), round_off.format(gap(run["ours"], run["ref"]) + ", float64")),
            (dict(a=run["ours32"], b=run["ref32"]), round_off.format(gap(run["ours32"], run["ref32"]) + ", float32")),
            (dict(a=run["ours"], b=run["float32"]),
             f"; hint: these come from a reference whose first MLP layer computes in float32 (a stray .float()): "
             f"{gap(run['ours'], run['float32'])}, far above float64's round-off, yet allclose's default "
             f"rtol = 1e-5, atol = 1e-8 and any fixed tolerance near 1e-6 accept it: tie the tolerance to the dtype"),
            (dict(a=run["ours"], b=run["gelu"]),
             f"; hint: these come from a reference with the exact (erf) GELU where the model uses the tanh "
             f"approximation: {gap(run['ours'], run['gelu'])}, far above float64 round-off, yet the argmax (or a "
             f"sampled text) agrees: compare the logits themselves"),
            (dict(a=run["ours"], b=run["transposed"]),
             "; hint: these come from a reference with a transposed projection weight "
             f"({gap(run['ours'], run['transposed'])})"),
            (dict(a=run["ours"][:, 1:], b=run["ref"]),
             "; hint: logits of different shapes (here one position short) are not the same function's output"),
            (dict(a=run["ours"], b=run["typed11"]),
             f"; hint: these come from a reference whose GELU types √(2/π) as 0.79788456080, 11 digits: "
             f"{gap(run['ours'], run['typed11'])}, about {in_eps(run['ours'], run['typed11']):.0f} ε · max(1, |b|), "
             f"the size of float64 round-off in a deeper model: a tolerance of a few ε is too strict; allow about "
             f"{SAME_TOLERANCE} ε times the logits' scale"),
            (dict(a=run["ours"], b=run["typed9"]),
             f"; hint: these come from a reference whose GELU types √(2/π) as 0.797884561, 9 digits, a tiny real "
             f"bug: {gap(run['ours'], run['typed9'])}, about {in_eps(run['ours'], run['typed9']):.0f} ε · max(1, |b|),"
             f" far above float64's round-off yet below a loose tolerance (1e-10, or 10⁵ ε): allow about "
             f"{SAME_TOLERANCE} ε times the logits' scale, no more")]


def check_same_function(fn) -> CheckResult:
    """``same_function(a, b) -> bool``: do logits a and b (same dtype) agree up to round-off, max |a - b| <=
    1000 · ε · max(1, max |b|) with ε = torch.finfo(dtype).eps? False for different shapes."""
    pairs = _logit_pairs(generator(13))
    hints = iter([h for _, h in pairs])

    def compare(got, expected):
        hint = next(hints)
        if isinstance(got, torch.Tensor) and got.numel() == 1 and got.dtype == torch.bool:
            got = bool(got)
        if not isinstance(got, bool | np.bool_):
            return f"the answer should be one bool (True or False), got {type(got).__name__}"
        return None if bool(got) == expected else f"answered {bool(got)}, expected {expected}{hint}"

    return check_function("same_function", fn, _same_reference, [c for c, _ in pairs], compare=compare)


def _gains_reference(rungs):
    loss = {r["name"]: r["val_loss"] for r in rungs}
    return {r["name"]: (loss[r["parent"]] - r["val_loss"], (loss[r["parent"]] - r["val_loss"]) / math.log(2))
            for r in rungs if r["parent"] is not None}


def _gains_slips(rungs) -> list:
    """What the typical slips compute on one ladder, each with its hint: (name → (nats, bits), hint)."""
    loss = {r["name"]: r["val_loss"] for r in rungs}
    right = _gains_reference(rungs)
    previous = {r["name"]: q["val_loss"] - r["val_loss"] for q, r in itertools.pairwise(rungs) if r["parent"]}
    return [({k: (-n, -b) for k, (n, b) in right.items()},
             "the sign: a component that helps lowers the loss, so its gain is loss(parent) - loss(rung) > 0"),
            ({k: (n, n * math.log(2)) for k, (n, b) in right.items()},
             "bits = nats / ln 2 (1 bit = ln 2 ≈ 0.693 nats), not nats · ln 2"),
            ({k: (n, n / math.log(10)) for k, (n, b) in right.items()},
             "bits use log base 2: divide the nats by ln 2, not by ln 10"),
            ({k: (n, n / math.log(2)) for k, n in previous.items()},
             "compare each rung with its parent (the rung it adds to), not with the row above it: the three "
             "position rungs all add to 'layernorm'"),
            ({k: (n / loss[r], n / loss[r] / math.log(2)) for k, (n, b) in right.items()
              for r in [next(x["parent"] for x in rungs if x["name"] == k)]},
             "the gain is a difference of losses in nats, not a fraction of the parent's loss")]


def _compare_gains_with(ladders: list):
    def compare(got, expected):
        if not isinstance(got, dict):
            return f"the answer should be a dict {{rung name: (nats, bits)}}, got {type(got).__name__}"
        extra, missing = sorted(set(got) - set(expected), key=str), sorted(set(expected) - set(got))
        if extra:
            return (f"the answer has rungs {extra} it should not; only rungs with a parent get a gain (the "
                    "root has nothing below it to compare with)")
        if missing:
            return f"the answer misses the rungs {missing}"
        case = next(i for i, e in enumerate(ladders) if e[0] == expected)
        for name, value in expected.items():
            msg = describe_difference(got[name], value, atol=1e-9, rtol=1e-9, what=f"answer[{name!r}]")
            if msg:
                for slip, hint in ladders[case][1]:
                    if describe_difference(got[name], slip.get(name), atol=1e-9, rtol=1e-9) is None:
                        return f"{msg}; hint: {hint}"
                return msg
        return None

    return compare


def check_ladder_gains(fn) -> CheckResult:
    """``ladder_gains(rungs) -> {name: (nats, bits)}``: for each rung with a parent, how much it lowers the
    validation loss of the rung it adds to, loss(parent) - loss(rung), in nats and in bits (÷ ln 2). ``rungs`` is a
    list of ``{"name", "parent", "val_loss"}`` dicts, as in ``ladder.json``; the root's parent is None."""
    table = [{k: r[k] for k in ("name", "parent", "val_loss")} for r in ladder.load_table()["rungs"]]
    gen = generator(11)
    noise = randn(gen, len(table), scale=0.05).tolist()
    noisy = [dict(r, val_loss=r["val_loss"] + e) for r, e in zip(table, noise, strict=True)]
    order = torch.randperm(len(noisy) - 1, generator=gen).tolist()  # the root first, the others in any order
    shuffled = [noisy[0], *(noisy[i + 1] for i in order)]
    cases = [dict(rungs=table), dict(rungs=shuffled),
             dict(rungs=[{"name": "a", "parent": None, "val_loss": 3.0}, {"name": "b", "parent": "a", "val_loss": 2.5},
                         {"name": "c", "parent": "a", "val_loss": 2.75}])]  # a worse sibling after a better one
    ladders = [(_gains_reference(**c), _gains_slips(**c)) for c in cases]
    return check_function("ladder_gains", fn, _gains_reference, cases, compare=_compare_gains_with(ladders))


LENS_EPS = 1e-5  # the final LayerNorm's eps: transformer_lab.norm.LayerNorm's default, as nn.LayerNorm's


def _lens_reference(x, ln_weight, ln_bias, emb):
    return layer_norm(x, ln_weight, ln_bias, eps=LENS_EPS) @ emb.T  # (..., C) @ (C, V) -> (..., V)


def _lens_slips(x, ln_weight, ln_bias, emb) -> list:
    """What the typical slips compute on one case, each with its hint."""
    mu, var = x.mean(-1, keepdim=True), x.var(-1, keepdim=True, unbiased=False)
    right = _lens_reference(x, ln_weight, ln_bias, emb)
    return [(x @ emb.T, "the residual went straight to the head: the lens reads it through the model's final "
                        "LayerNorm LN_f first, as the model's own output does"),
            ((x - mu) / (var + LENS_EPS).sqrt() @ emb.T, "LN_f has a learned scale γ and shift β: apply them"),
            ((((x - mu) / (x.var(-1, keepdim=True) + LENS_EPS).sqrt()) * ln_weight + ln_bias) @ emb.T,
             "LayerNorm divides by the population variance (mean of squares, unbiased=False), not the unbiased one"),
            ((((x - mu) / var.sqrt()) * ln_weight + ln_bias) @ emb.T,
             f"eps = {LENS_EPS:g} belongs inside the square root, sqrt(σ² + eps): it matters for a residual of "
             "small variance"),
            (torch.softmax(right, -1), "return the logits LN_f(x) Eᵀ, not their softmax")]


def check_logit_lens(fn) -> CheckResult:
    """``logit_lens(x, ln_weight, ln_bias, emb) -> (..., V)``: the logit lens of a residual stream x (..., C),
    LN_f(x) Eᵀ, through the final LayerNorm (γ = ln_weight, β = ln_bias, eps 1e-5, population variance) and the
    head tied to the token embedding E (V, C); :func:`transformer_lab.lens.read`'s ``lens_logits``."""
    gen = generator(12)

    def case(*lead, C=8, V=11, scale=1.0):
        return dict(x=randn(gen, *lead, C, scale=scale) + randn(gen, *lead, 1), ln_weight=1 + 0.3 * randn(gen, C),
                    ln_bias=0.2 * randn(gen, C), emb=randn(gen, V, C, scale=0.5))

    cases = [case(3, 5), case(2, 4, 6, C=4, V=7), case(3, 2, scale=1e-3)]  # case 3: σ² ≈ 1e-6, below eps
    slips = [(_lens_reference(**c), _lens_slips(**c)) for c in cases]

    def compare(got, expected):
        msg = describe_difference(got, expected, atol=1e-9, rtol=1e-9)
        if not msg or not isinstance(got, torch.Tensor) or got.shape != expected.shape:
            return msg
        if got.dtype != expected.dtype:
            return msg + (f"; hint: the answer has dtype {got.dtype}, the inputs {expected.dtype}: compute in "
                          "their dtype (a .float() or a tensor made without dtype= rounds to float32)")
        index = next(i for i, (e, _) in enumerate(slips) if torch.equal(e, expected))
        for slip, hint in slips[index][1]:
            if torch.allclose(got, slip, atol=1e-9, rtol=1e-9):
                return f"{msg}; hint: {hint}"
        return msg

    return check_function("logit_lens", fn, _lens_reference, cases, compare=compare)


RESUME_NEEDS = {  # what the loop's future depends on, and the hint when a checkpoint leaves it out
    "params": "the parameters themselves: without them the resumed run starts again from the initial weights",
    "velocity": "the momentum buffer v: it carries the past gradients into every later step; restarting it at "
                "zero changes the steps after the resume",
    "step": "the step count s: the warm-up learning rate η(s) depends on it, and without it the schedule starts "
            "again at step 0",
    "rng": "the random generator's state: without it the resumed run draws again the batches and dropout masks "
           "of the run's beginning (a fresh generator seeded with the run's seed)",
}
RESUME_STEPS = (6, 4)  # steps before the interruption, steps after it


def _loop_fresh(cfg: dict) -> tuple[dict, torch.Generator]:
    """A fresh run's state and generator: the initial weights are the first draw from ``seed``'s generator."""
    gen = torch.Generator().manual_seed(cfg["seed"])
    params = 0.5 * torch.randn(cfg["X"].shape[1], generator=gen, dtype=torch.float64)
    return {"params": params, "velocity": torch.zeros_like(params), "step": 0, "rng": gen.get_state(),
            "loss": float("nan"), "seed": cfg["seed"]}, gen


def _loop_steps(cfg: dict, state: dict, gen: torch.Generator, n: int) -> list[tuple[torch.Tensor, float]]:
    """``n`` steps of SGD with momentum on a least-squares loss, updating ``state`` in place as an optimizer does:
    a random minibatch and dropout mask from ``gen``, learning rate lr · min(1, (s + 1)/warmup), v ← μv + g,
    w ← w − η(s) v. Returns the weights (a copy) and the loss after each step."""
    X, y, w, v = cfg["X"], cfg["y"], state["params"], state["velocity"]
    out = []
    for _ in range(n):
        s = state["step"]
        idx = torch.randint(0, len(X), (cfg["batch"],), generator=gen)
        keep = (torch.rand(X.shape[1], generator=gen, dtype=torch.float64) >= cfg["drop"]) / (1 - cfg["drop"])
        xb = X[idx] * keep  # (B, d): inputs with dropped features
        r = xb @ w - y[idx]  # (B,)
        v.mul_(cfg["momentum"]).add_(2 * xb.T @ r / cfg["batch"])
        w.sub_(cfg["lr"] * min(1.0, (s + 1) / cfg["warmup"]) * v)
        state["step"], state["loss"] = s + 1, float((r**2).mean())
        out.append((w.clone(), state["loss"]))
    state["rng"] = gen.get_state()
    return out


def _loop_resume(cfg: dict, saved: dict) -> tuple[dict, torch.Generator]:
    """A new process's state: a fresh run's, with every entry of ``saved`` put in its place."""
    state, gen = _loop_fresh(cfg)
    for k, value in saved.items():
        state[k] = value.clone() if isinstance(value, torch.Tensor) else value
    gen.set_state(state["rng"])
    return state, gen


def _loop_cases(gen) -> list[dict]:
    cases = []
    for n, d in ((12, 3), (20, 5), (9, 2)):
        X = randn(gen, n, d)
        cfg = dict(X=X, y=X @ randn(gen, d) + 0.1 * randn(gen, n), seed=int(torch.randint(0, 2**31, (1,),
                   generator=gen)), batch=4, drop=0.25, lr=0.05, momentum=0.9, warmup=2 * sum(RESUME_STEPS))
        state, g = _loop_fresh(cfg)
        _loop_steps(cfg, state, g, RESUME_STEPS[0])
        snapshot = copy.deepcopy(state)
        cases.append(dict(cfg=cfg, state=state, gen=g, snapshot=snapshot,
                          expected=_loop_steps(cfg, *_loop_resume(cfg, snapshot), RESUME_STEPS[1])))
    return cases


def _resume_difference(got, case) -> str | None:
    """Continue the interrupted run in place (as the loop does after saving), resume a new run from ``got``, and
    compare the two continuations exactly; a sentence naming what the checkpoint lacks when they differ."""
    if not isinstance(got, dict):
        return f"the checkpoint should be a dict {{name: value}} of the loop state's entries, got {type(got).__name__}"
    unknown = sorted(str(k) for k in got if k not in case["snapshot"])
    if unknown:
        return f"the checkpoint has entries {unknown} the loop state does not; use its names {sorted(RESUME_NEEDS)}"
    for k in ("params", "velocity", "rng"):
        if k in got and not isinstance(got[k], torch.Tensor):
            return f"checkpoint[{k!r}] should be a tensor, got {type(got[k]).__name__}"
    _loop_steps(case["cfg"], case["state"], case["gen"], RESUME_STEPS[1])  # the run goes on after the save
    try:
        resumed = _loop_steps(case["cfg"], *_loop_resume(case["cfg"], got), RESUME_STEPS[1])
    except (RuntimeError, TypeError, ValueError) as exc:
        return f"the run could not resume from the checkpoint: {type(exc).__name__}: {exc}"
    if all(torch.equal(w, e) and loss == f for (w, loss), (e, f) in zip(resumed, case["expected"], strict=True)):
        return None
    s = next(i for i, ((w, _), (e, _)) in enumerate(zip(resumed, case["expected"], strict=True))
             if not torch.equal(w, e))
    msg = describe_difference(resumed[s][0], case["expected"][s][0], atol=0, rtol=0,
                              what=f"the resumed run's w ({s + 1} step(s) after the resume)")
    missing = [k for k in RESUME_NEEDS if k not in got]
    if missing:
        return f"{msg}; the checkpoint misses {missing}; hint: " + "; ".join(RESUME_NEEDS[k] for k in missing)
    for k in ("params", "velocity"):
        if not torch.equal(got[k], case["snapshot"][k]):
            if torch.equal(got[k], case["state"][k]):
                return (f"{msg}; checkpoint[{k!r}] changed after checkpoint returned; hint: it is the loop's own "
                        f"tensor, which the next steps update in place: save a copy (.clone())")
            return f"{msg}; checkpoint[{k!r}] is not the loop's {k} at the interruption"
    return f"{msg}; the saved entries differ from the loop's state at the interruption"


def check_checkpoint(fn) -> CheckResult:
    """``checkpoint(state) -> dict``: what to save from the state of a training loop (SGD with momentum, a warm-up
    learning rate, minibatches and dropout drawn from a generator) so that a run resumed from it continues exactly,
    weight for weight, as the run that never stopped; an entry left out is re-initialised as a fresh run's."""
    cases = _loop_cases(generator(14))
    in_order = iter(cases)

    def reference(state):  # the case itself: the comparison runs both continuations
        return next(in_order)

    return check_function("checkpoint", fn, reference, [dict(state=c["state"]) for c in cases],
                          compare=_resume_difference)



# ---------------------------------------------------------------- ngram_place
_BITS = math.log(2)  # nats per bit


def _place_reference(loss, baselines):
    bits = loss / _BITS  # the model's loss in bits per character
    beaten = max((n for n, b in baselines.items() if bits < b), default=0)
    return beaten, (bits - baselines[beaten + 1] if beaten + 1 in baselines else None)


def _place_cases():
    """Held-out n-gram baselines in bits per character, each order below the last, and model losses in nats:
    above every baseline, between two, below every one."""
    gen = generator(15)
    cases = []
    for loss_at in (0.2, 1.5, 2.5, 3.5, 4.9, 5.5):  # where the loss falls: between orders int(loss_at) and + 1
        steps = (torch.rand(4, generator=gen, dtype=torch.float64) * 0.6 + 0.3).tolist()
        bits = [4.0 + float(torch.rand((), generator=gen, dtype=torch.float64)) * 0.6]
        for step in steps:
            bits.append(bits[-1] - step)
        baselines = {n: round(b, 4) for n, b in enumerate(bits, start=1)}
        lo = int(loss_at)  # below baseline lo (if any), above baseline lo + 1 (if any)
        upper = baselines.get(lo, bits[0] + 0.5)
        lower = baselines.get(lo + 1, bits[-1] - 0.4)
        cases.append(dict(loss=round((lower + (upper - lower) * (loss_at - lo)) * _BITS, 4), baselines=baselines))
    return cases


_PLACE_SLIPS = [
    (lambda loss, baselines: _place_reference(loss * _BITS, baselines),
     "the loss is in nats and the baselines in bits: divide the loss by ln 2 (compare like with like)"),
    (lambda loss, baselines: _place_reference(loss * _BITS * _BITS, baselines),
     "bits = nats / ln 2, not nats · ln 2"),
    (lambda loss, baselines: _place_reference(loss / math.log(10) * _BITS, baselines),
     "bits are log base 2: divide nats by ln 2, not by ln 10"),
    (lambda loss, baselines: (lambda b, g: (b + 1, g))(*_place_reference(loss, baselines)),
     "the order to return is the largest n whose baseline the model beats, not the first one it does not beat"),
    (lambda loss, baselines: (lambda b, g: (b, None if g is None else -g))(*_place_reference(loss, baselines)),
     "the gap is the model's loss minus the next baseline (what it must still lose), a positive number"),
    (lambda loss, baselines: (lambda b, g: (b, None if g is None else g * _BITS))(*_place_reference(loss, baselines)),
     "the gap is asked in bits per character, like the baselines"),
]


def _place_compare(got, expected):
    if not isinstance(got, tuple | list) or len(got) != 2:
        return f"the answer should be a pair (order, gap), got {type(got).__name__} {got!r}"
    order, gap = got
    if isinstance(order, bool) or not isinstance(order, int | np.integer):
        return f"order must be an int, got {type(order).__name__} {order!r}"
    if int(order) != expected[0]:
        return f"order is {int(order)}, expected {expected[0]}"
    if expected[1] is None or gap is None:
        return None if gap is expected[1] else f"gap is {gap!r}, expected {expected[1]!r}"
    return describe_difference(float(gap), expected[1], atol=1e-9, rtol=1e-9, what="gap")


def check_ngram_place(fn) -> CheckResult:
    """``ngram_place(loss, baselines) -> (order, gap)``: a model's loss (nats per character) against held-out n-gram
    baselines ``{n: bits per character}``: the largest order n it beats (0 if none), and how many bits per
    character it still must lose to beat order n + 1 (None when it beats every order)."""
    cases = _place_cases()
    result = check_function("ngram_place", fn, _place_reference, cases, compare=_place_compare)
    if result.passed or not callable(fn):
        return result
    for slip, hint in _PLACE_SLIPS:
        try:
            same = all(_place_compare(fn(**case), slip(**case)) is None for case in cases)
        except Exception:  # the answer raises somewhere: no hint to give
            same = False
        if same:
            return CheckResult("ngram_place", False, f"{result.message}; hint: {hint}")
    return result


def _probs_reference(logits, temperature, top_k, top_p):
    return torch.softmax(filter_logits(logits, temperature=temperature, top_k=top_k, top_p=top_p), dim=-1)


def _keep_top_k(p, k):
    """p (..., V) with all but its k largest entries set to 0 (not renormalised)."""
    if k is None or k >= p.shape[-1]:
        return p
    kth = torch.topk(p, k, dim=-1).values[..., -1:]
    return torch.where(p >= kth, p, torch.zeros_like(p))


def _keep_top_p(p, top_p, strict=False, extra=False, keep_first=True):
    """p (..., V) with the nucleus kept (the smallest most-probable set reaching top_p), the rest set to 0.
    ``strict``: the slip that also drops the token whose probability crosses top_p (one token too few);
    ``extra``: the slip that keeps the token after it too (one token too many); ``keep_first=False`` with
    ``strict``: the same slip without keeping the top token, so a row whose top token alone crosses top_p is
    left empty."""
    if top_p is None or top_p >= 1:
        return p
    sorted_p, order = torch.sort(p, dim=-1, descending=True)
    q = sorted_p / sorted_p.sum(-1, keepdim=True)
    cum = torch.cumsum(q, dim=-1)
    drop_sorted = (cum > top_p) if strict else (cum - q >= top_p)
    if extra:  # the drop mask shifted right once more: the first token past the nucleus is kept as well
        drop_sorted = torch.cat((torch.zeros_like(drop_sorted[..., :1]), drop_sorted[..., :-1]), dim=-1)
    if keep_first:  # the top token always stays
        drop_sorted[..., 0] = False
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return torch.where(drop, torch.zeros_like(p), p)


def _normalised(p):
    return p / p.sum(-1, keepdim=True)


def _probs_slips(logits, temperature, top_k, top_p) -> list:
    """What the typical slips compute on one case, each with its hint."""
    tau = temperature
    hot = torch.softmax(logits / tau, -1)
    raw = torch.softmax(logits, -1)
    right = _probs_reference(logits, temperature, top_k, top_p)
    slips = [(_normalised(_keep_top_p(_keep_top_k(torch.softmax(logits * tau, -1), top_k), top_p)),
              "divide the logits by the temperature τ, do not multiply: τ > 1 must flatten the distribution"),
             (_normalised(_keep_top_p(_keep_top_k(hot, top_k), top_p, strict=True)),
              "the nucleus is one token too small: top-p keeps the smallest set whose probability reaches p, so the "
              "token that crosses p is kept (drop a token only when the mass ranked above it already reaches p)"),
             (_normalised(_keep_top_p(_keep_top_k(hot, top_k), top_p, strict=True, keep_first=False)),
              "the nucleus is one token too small, and a row whose top token alone crosses p lost every token "
              "(0 / 0 gave NaN): keep the token that crosses p (drop a token only when the mass ranked above it "
              "already reaches p)"),
             (_normalised(_keep_top_p(_keep_top_k(hot, top_k), top_p, extra=True)),
              "the nucleus is one token too large: it ends with the token that crosses p; the next one, whose mass "
              "ranked above it already reaches p, is dropped (the drop mask is shifted right by one, not by two)"),
             (_keep_top_p(_keep_top_k(hot, top_k), top_p),
              "renormalise: the kept probabilities must sum to 1"),
             (right.log(), "return probabilities, not logits or log-probabilities")]
    if top_p is not None and tau != 1:
        slips.append((_normalised(hot * (_keep_top_p(_keep_top_k(raw, top_k), top_p) > 0)),
                      "apply the temperature first: top-p measures the mass of the distribution after τ"))
    if top_p is not None and top_k is not None:
        slips.append((_normalised(hot * (_keep_top_k(hot, top_k) > 0) * (_keep_top_p(hot, top_p) > 0)),
                      "top-p measures the mass of what top-k kept, renormalised, not of the whole distribution"))
    if top_k is not None:
        for k in (top_k - 1, top_k + 1):
            if k >= 1:
                slips.append((_normalised(_keep_top_p(_keep_top_k(hot, k), top_p)),
                              f"top-k keeps the k most probable tokens: exactly k = {top_k} here, not {k}"))
    return slips


def check_next_char_probs(fn) -> CheckResult:
    """``next_char_probs(logits, temperature, top_k, top_p) -> (..., V)``: the distribution ``GPT.generate``
    samples from: softmax(z / τ), then top-k, then top-p on what top-k left (renormalised), renormalised at the
    end; ``None`` switches a filter off; :func:`transformer_lab.sampling.filter_logits` then softmax."""
    gen = generator(18)

    def case(*lead, V=12, temperature=1.0, top_k=None, top_p=None, scale=2.0):
        return dict(logits=randn(gen, *lead, V, scale=scale), temperature=temperature, top_k=top_k, top_p=top_p)

    cases = [case(3, temperature=0.7, top_p=0.8), case(2, temperature=1.6, top_k=4),
             case(2, 3, temperature=2.0, top_k=6, top_p=0.6), case(4, V=9, temperature=0.5),
             case(3, V=20, temperature=1.0, top_k=8, top_p=0.7)]
    slips = [(_probs_reference(**c), _probs_slips(**c)) for c in cases]

    def compare(got, expected):
        msg = describe_difference(got, expected, atol=1e-9, rtol=1e-7)
        if not msg or not isinstance(got, torch.Tensor) or got.shape != expected.shape:
            return msg
        index = next(i for i, (e, _) in enumerate(slips) if torch.equal(e, expected))
        for slip, hint in slips[index][1]:
            if torch.allclose(got.to(slip.dtype), slip, atol=1e-9, rtol=1e-7, equal_nan=True):
                return f"{msg}; hint: {hint}"
        return msg

    return check_function("next_char_probs", fn, _probs_reference, cases, compare=compare)


EXERCISES = {"count_params": check_count_params, "lm_windows": check_lm_windows,
             "attend_with_cache": check_attend_with_cache, "attention_entropy": check_attention_entropy,
             "same_function": check_same_function, "ladder_gains": check_ladder_gains,
             "logit_lens": check_logit_lens, "checkpoint": check_checkpoint, "ngram_place": check_ngram_place,
             "next_char_probs": check_next_char_probs}
