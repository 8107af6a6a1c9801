"""Chapter 8 exercise checkers and derivations: solutions pass, wrong answers fail with a message naming the
difference; the parameter-count formula equals both models' counts."""

import math

import pytest
import sympy as sp
import torch
from conftest import assert_rejected

from transformer_lab.derivations import ch8 as d8
from transformer_lab.exercises import ch8, registry


def count_params(vocab_size, block_size, n_layer, d_model):
    C = d_model
    return vocab_size * C + block_size * C + n_layer * (12 * C * C + 13 * C) + 2 * C


def lm_windows(ids, block_size):
    n = (len(ids) - 1) // block_size
    x = ids[: n * block_size].view(n, block_size)
    y = ids[1: n * block_size + 1].view(n, block_size)
    return x, y


def attend_with_cache(q, k_cache, v_cache, k_new, v_new):
    k = torch.cat((k_cache, k_new), dim=-2)
    v = torch.cat((v_cache, v_new), dim=-2)
    w = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1)
    return w @ v, k, v


def test_registry():
    assert registry(8) == ch8.EXERCISES
    assert set(ch8.EXERCISES) == {"count_params", "lm_windows", "attend_with_cache"}


@pytest.mark.parametrize("fn", [count_params, lm_windows, attend_with_cache])
def test_solutions_pass(fn):
    result = ch8.EXERCISES[fn.__name__](fn)
    assert result.passed, result.message


@pytest.mark.parametrize(("name", "wrong", "words"), [
    ("count_params", lambda vocab_size, block_size, n_layer, d_model:
        count_params(vocab_size, block_size, n_layer, d_model) + vocab_size * d_model,  # head counted twice
     ["count is", "expected"]),
    ("count_params", lambda vocab_size, block_size, n_layer, d_model:
        count_params(vocab_size, block_size, n_layer, d_model) - n_layer * 13 * d_model,  # biases forgotten
     ["count is", "expected"]),
    ("lm_windows", lambda ids, block_size: (lm_windows(ids, block_size)[0], lm_windows(ids, block_size)[0]),
     ["output[1] differs", "entries"]),  # targets not shifted
    ("lm_windows", lambda ids, block_size: tuple(t[:-1] for t in lm_windows(ids, block_size)),
     ["has shape"]),  # one window short
    ("attend_with_cache", lambda q, k_cache, v_cache, k_new, v_new: attend_with_cache(q, k_cache, v_cache,
                                                                                     k_new, v_new)[:1],
     ["should have 3 items"]),
    ("attend_with_cache", lambda q, k_cache, v_cache, k_new, v_new: (
        torch.softmax(q @ torch.cat((k_cache, k_new), -2).transpose(-2, -1), -1) @ torch.cat((v_cache, v_new), -2),
        torch.cat((k_cache, k_new), -2), torch.cat((v_cache, v_new), -2)),  # no 1/sqrt(d)
     ["output[0] differs"]),
])
def test_wrong_answers_fail_with_a_message(name, wrong, words):
    assert_rejected(ch8.EXERCISES[name], wrong, *words)


def test_stub_says_not_written():
    def count_params(vocab_size, block_size, n_layer, d_model):
        raise NotImplementedError
    assert "not written yet" in ch8.check_count_params(count_params).message


def test_derivations():
    V, T, L, C = sp.symbols("V T L C", positive=True, integer=True)
    assert sp.simplify(d8.param_count() - (V * C + T * C + 2 * C + L * (12 * C**2 + 13 * C))) == 0
    n = sp.symbols("n", positive=True, integer=True)
    assert sp.simplify(d8.generation_cost()["ratio"] - (n + 1) / 2) == 0
    assert d8.check() == {"formula vs ours": 0.0, "ours vs reference": 0.0, "cache ratio vs direct sum": 0.0}
