"""When the default `train` compiles (transformer_lab.compile_policy): the break-even n* = C / (t_e (1 - 1/s)), the
choice either side of it, the costs recorded beside the kernels (and what happens to a damaged record), and the
eager probe that leaves the random generators as they were."""

import json
import math

import pytest
import sympy as sp
import torch

from transformer_lab import compile_policy as policy
from transformer_lab.gpt import GPT, GPTConfig
from transformer_lab.information import cross_entropy


def test_the_break_even_is_where_the_saved_time_equals_the_start_up():
    n, C, t, s = sp.symbols("n C t_e s", positive=True)
    [n_star] = sp.solve(sp.Eq(n * t - n * t / s, C), n)  # eager time = compiled time + start-up
    f = sp.lambdify((C, t, s), n_star)
    for args in [(60.0, 0.05, 1.5), (22.0, 0.004, 1.3), (1e-3, 2.0, 10.0)]:
        assert policy.break_even(*args) == pytest.approx(f(*args), rel=1e-12)


@pytest.mark.parametrize("speedup", [1.0, 0.8])
def test_no_speed_up_never_breaks_even(speedup):
    assert math.isinf(policy.break_even(1.0, 0.05, speedup))
    choice = policy.decide(10**9, 0.05, policy.Costs(1.0, 1.0, speedup), cached=True)
    assert not choice.compile and "break-even of never" in choice.reason


def test_the_choice_either_side_of_the_break_even_cold_and_warm():
    costs = policy.Costs(cold_s=60.0, warm_s=20.0, speedup=1.5)  # 0.05 s a step: 1/60 s saved, n* = 3600 and 1200
    assert policy.decide(3601, 0.05, costs, cached=False).compile
    assert not policy.decide(3599, 0.05, costs, cached=False).compile
    assert policy.decide(1201, 0.05, costs, cached=True).compile
    assert not policy.decide(1199, 0.05, costs, cached=True).compile
    eager = policy.decide(200, 0.05, costs, cached=False)
    assert not eager.compile
    assert eager.reason == ("training eagerly: 200 steps against a break-even of 3,600 (start-up about 60 s with an "
                            "empty compile cache, 16.7 ms saved a step); --compile compiles anyway")
    assert policy.decide(2000, 0.05, costs, cached=True).reason.startswith(
        "compiling the training step: 2,000 steps against a break-even of 1,200 (start-up about 20 s with its "
        "kernels cached")


def test_costs_come_from_the_record_else_the_priors(tmp_path):
    assert policy.costs_for(tmp_path, "k", 0.05) == policy.PRIOR
    policy.remember(tmp_path, "k", compiled=True, cold_s=30.0, compiled_step_s=0.02)
    c = policy.costs_for(tmp_path, "k", 0.05)
    assert (c.cold_s, c.warm_s, c.speedup) == pytest.approx((30.0, policy.PRIOR.warm_s * 30 / policy.PRIOR.cold_s,
                                                             2.5))
    policy.remember(tmp_path, "k", warm_s=5.0, eager_step_s=0.03)  # merged with what was there
    assert policy.costs_for(tmp_path, "k", 0.05) == pytest.approx(policy.Costs(30.0, 5.0, 1.5))
    assert policy.costs_for(tmp_path, "other", 0.05) == policy.PRIOR
    assert [p.name for p in tmp_path.iterdir()] == [policy.COSTS_FILE]  # no temporary file left


@pytest.mark.parametrize("text", ["", "{", "[1, 2]", '{"k": 3}', '{"k": {"cold_s": -1, "warm_s": "fast", '
                                                                 '"compiled_step_s": NaN}}'])
def test_a_damaged_record_falls_back_to_the_priors(tmp_path, text):
    (tmp_path / policy.COSTS_FILE).write_text(text)
    assert policy.costs_for(tmp_path, "k", 0.05) == policy.PRIOR
    assert not policy.is_cached(tmp_path, "k")
    policy.remember(tmp_path, "k", eager_step_s=0.04)  # and a new record replaces it
    assert json.loads((tmp_path / policy.COSTS_FILE).read_text())["k"]["eager_step_s"] == 0.04


def test_cached_needs_a_finished_compiled_run_and_kernels_still_there(tmp_path):
    policy.remember(tmp_path, "k", eager_step_s=0.04)
    assert not policy.is_cached(tmp_path, "k")
    policy.remember(tmp_path, "k", compiled=True)
    assert not policy.is_cached(tmp_path, "k")  # the kernels were cleared away
    (tmp_path / "fxgraph" / "xy").mkdir(parents=True)
    assert policy.is_cached(tmp_path, "k") and not policy.is_cached(tmp_path, "other")


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
