"""When the default `train` compiles (transformer_lab.compile_policy): the break-even n* = C / (t_e (1 - 1/s)), the
choice either side of it, the costs recorded beside the kernels (and what happens to a damaged record), and the
eager probe that leaves the random generators as they were."""

import json
import math

import pytest
import sympy as sp
import torch
from hypothesis import given
from hypothesis import strategies as st

from transformer_lab import compile_policy as policy
from transformer_lab.gpt import GPT, GPTConfig
from transformer_lab.information import cross_entropy


def test_the_break_even_is_where_the_saved_time_equals_the_start_up():
    n, C, t, s = sp.symbols("n C t_e s", positive=True)
    [n_star] = sp.solve(sp.Eq(n * t - n * t / s, C), n)  # eager time = compiled time + start-up
    f = sp.lambdify((C, t, s), n_star)
    for args in [(60.0, 0.05, 1.5), (22.0, 0.004, 1.3), (1e-3, 2.0, 10.0)]:
        assert policy.break_even(*args) == pytest.approx(f(*args), rel=1e-12)


COSTS = {"blocks": policy.Costs(cold_s=10.0, warm_s=2.0, speedup=1.25),  # 12 ms of a 60 ms step saved
         "whole": policy.Costs(cold_s=40.0, warm_s=8.0, speedup=1.5)}  # 20 ms saved


@pytest.mark.parametrize("speedup", [1.0, 0.8])
def test_no_speed_up_never_breaks_even(speedup):
    assert math.isinf(policy.break_even(1.0, 0.05, speedup))
    costs = {m: policy.Costs(1.0, 1.0, speedup) for m in policy.MODES}
    choice = policy.decide(10**9, 0.05, costs, cached=dict.fromkeys(policy.MODES, True))
    assert choice.mode is None and choice.reason.count("never breaks even") == 2


@pytest.mark.parametrize(("cached", "steps", "mode"), [
    (False, 830, None), (False, 840, "blocks"), (False, 3700, "blocks"), (False, 3800, "whole"),
    (True, 160, None), (True, 170, "blocks"), (True, 740, "blocks"), (True, 760, "whole")])
def test_the_choice_saves_the_most_time(cached, steps, mode):
    """Blocks: C + 0.048 n; whole: C + 0.04 n; eager: 0.06 n. Cold (C = 10 and 40), the blocks repay their
    compile after 834 steps and the whole step saves more than the blocks after 3,750; warm (C = 2 and 8), after
    167 and 750."""
    assert policy.decide(steps, 0.06, COSTS, cached=dict.fromkeys(policy.MODES, cached)).mode == mode


@given(steps=st.integers(1, 10**6), eager=st.floats(1e-4, 10.0), cold=st.floats(0.1, 300.0),
       warm=st.floats(0.0, 1.0), speedup=st.floats(1.0, 3.0), more=st.floats(1.0, 3.0),
       cached=st.sampled_from([(False, False), (True, False), (False, True), (True, True)]))
def test_the_choice_is_the_least_predicted_time(steps, eager, cold, warm, speedup, more, cached):
    costs = {"blocks": policy.Costs(cold, warm * cold, speedup),
             "whole": policy.Costs(4 * cold, 4 * warm * cold, speedup * more)}
    cached = dict(zip(policy.MODES, cached, strict=True))
    times = {None: steps * eager}
    for m, c in costs.items():
        times[m] = (c.warm_s if cached[m] else c.cold_s) + steps * eager / c.speedup
    choice = policy.decide(steps, eager, costs, cached=cached)
    assert times[choice.mode] <= min(times.values()) * (1 + 1e-9)


def test_the_line_says_which_and_why():
    eager = policy.decide(200, 0.06, COSTS, cached={"blocks": False, "whole": False})
    assert eager.reason.startswith("training eagerly: 200 steps would not repay a compile (the blocks: break-even "
                                   "834 steps, start-up about 10 s with an empty compile cache; the whole training "
                                   "step: break-even ")
    assert eager.reason.endswith("start-up about 40 s with an empty compile cache); --compile compiles anyway")
    blocks = policy.decide(500, 0.06, COSTS, cached={"blocks": True, "whole": False})
    assert blocks.reason == ("compiling the blocks: 500 steps, break-even 167 steps, start-up about 2 s "
                             "with its kernels cached, about 4 s saved in all; --no-compile trains eagerly")


def test_costs_come_from_the_record_else_the_priors(tmp_path):
    assert policy.costs_for(tmp_path, "k", 0.05) == policy.PRIOR
    policy.remember(tmp_path, "k", "whole", compiled=True, cold_s=30.0, compiled_step_s=0.02)
    c = policy.costs_for(tmp_path, "k", 0.05)
    prior = policy.PRIOR["whole"]
    assert (c["whole"].cold_s, c["whole"].warm_s, c["whole"].speedup) == pytest.approx(
        (30.0, prior.warm_s * 30 / prior.cold_s, 2.5))
    assert c["blocks"] == policy.PRIOR["blocks"]
    policy.remember(tmp_path, "k", "whole", warm_s=5.0)  # merged with what was there
    policy.remember(tmp_path, "k", eager_step_s=0.03)
    whole = policy.costs_for(tmp_path, "k", 0.05)["whole"]
    assert (whole.cold_s, whole.warm_s, whole.speedup) == pytest.approx((30.0, 5.0, 1.5))
    assert policy.costs_for(tmp_path, "other", 0.05) == policy.PRIOR
    assert [p.name for p in tmp_path.iterdir()] == [policy.COSTS_FILE]  # no temporary file left


def test_without_vector_code_only_a_record_makes_a_compile_pay(tmp_path):
    """On PyTorch's portable CPU kernel set inductor writes scalar loops, and a compiled step can be slower than an
    eager one: the priors then assume no speed-up, so a long first run stays eager; a recorded run still counts."""
    scalar = policy.costs_for(tmp_path, "k", 0.05, vector_code=False)
    assert all(c.speedup == 1.0 for c in scalar.values())
    assert policy.decide(10**6, 0.05, scalar, cached={m: False for m in policy.MODES}).mode is None
    policy.remember(tmp_path, "k", "blocks", compiled=True, cold_s=5.0, compiled_step_s=0.025)
    assert policy.costs_for(tmp_path, "k", 0.05, vector_code=False)["blocks"].speedup == pytest.approx(2.0)


@pytest.mark.parametrize("capability", [None, "default"])
def test_vector_code_is_read_from_the_kernel_set_as_inductor_picks_it(monkeypatch, capability):
    """The cheap reading agrees with inductor's own pick, which builds and loads a test library per instruction
    set; the decision never runs that check."""
    from torch._inductor.cpu_vec_isa import pick_vec_isa

    if capability:
        monkeypatch.setenv("ATEN_CPU_CAPABILITY", capability)
    assert policy.writes_vector_code("cuda")
    assert policy.writes_vector_code("cpu") == bool(pick_vec_isa())


@pytest.mark.parametrize("text", ["", "{", "[1, 2]", '{"k": 3}', '{"k": {"whole": 3}}',
                                  '{"k": {"eager_step_s": "x", "whole": {"cold_s": -1, "warm_s": "fast", '
                                  '"compiled_step_s": NaN, "compiled": 1}}}'])
def test_a_damaged_record_falls_back_to_the_priors(tmp_path, text):
    (tmp_path / policy.COSTS_FILE).write_text(text)
    (tmp_path / "fxgraph" / "xy").mkdir(parents=True)
    assert policy.costs_for(tmp_path, "k", 0.05) == policy.PRIOR
    assert policy.is_cached(tmp_path, "k") == {"blocks": False, "whole": False}
    policy.remember(tmp_path, "k", eager_step_s=0.04)  # and a new record replaces it
    assert json.loads((tmp_path / policy.COSTS_FILE).read_text())["k"]["eager_step_s"] == 0.04


def test_cached_needs_a_finished_compiled_run_and_kernels_still_there(tmp_path):
    policy.remember(tmp_path, "k", eager_step_s=0.04)
    assert policy.is_cached(tmp_path, "k") == {"blocks": False, "whole": False}
    policy.remember(tmp_path, "k", "blocks", compiled=True)
    assert policy.is_cached(tmp_path, "k") == {"blocks": False, "whole": False}  # the kernels were cleared away
    (tmp_path / "fxgraph" / "xy").mkdir(parents=True)
    assert policy.is_cached(tmp_path, "k") == {"blocks": True, "whole": False}
    assert policy.is_cached(tmp_path, "other") == {"blocks": False, "whole": False}


def test_a_record_in_a_file_where_the_folder_should_be_is_skipped(tmp_path):
    (tmp_path / "plain").write_text("x")
    policy.remember(tmp_path / "plain", "k", eager_step_s=0.04)
    assert [p.name for p in tmp_path.iterdir()] == ["plain"]


def test_the_key_changes_with_what_the_kernels_depend_on():
    base = dict(model={"n_layer": 4}, batch=12, block=64, dtype="float32")
    assert policy.config_key(**base) == policy.config_key(**dict(reversed(base.items())))
    for change in [dict(model={"n_layer": 5}), dict(batch=6), dict(dtype="bfloat16")]:
        assert policy.config_key(**{**base, **change}) != policy.config_key(**base)


def test_the_eager_probe_leaves_the_random_generators_as_they_were():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=20, block_size=8, n_layer=1, n_head=2, d_model=16, dropout=0.3)).train()
    x = torch.zeros(3, 8, dtype=torch.long)
    state = torch.get_rng_state()
    seconds = policy.eager_step_seconds(lambda a, b: cross_entropy(model(a), b), x, x)
    assert 0 < seconds < 10 and torch.equal(torch.get_rng_state(), state)
    assert all(p.grad is not None for p in model.parameters())  # it ran backward


def test_the_start_up_is_the_first_step_less_a_later_one():
    assert policy.start_up_seconds([10.0, 0.1, 0.3, 0.2]) == pytest.approx((9.8, 0.2))
    assert policy.start_up_seconds([0.1, 0.2, 0.3]) == (0.0, 0.3)  # never below zero
    assert policy.start_up_seconds([10.0, 0.1]) is None
