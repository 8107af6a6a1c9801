"""Chapter 6 exercise checkers: each accepts the solution and rejects wrong ones with a message naming the fault."""

from __future__ import annotations

import torch
from conftest import assert_rejected

from transformer_lab.exercises import ch6, registry


# ---------------------------------------------------------------- solutions (as in the chapter)
def sinusoidal(n_pos, d_model):
    pos = torch.arange(n_pos, dtype=torch.float64)[:, None]
    omega = 10000.0 ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    pe = torch.zeros(n_pos, d_model, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(pos * omega)
    pe[:, 1::2] = torch.cos(pos * omega)
    return pe


def rotation_for_offset(k, d_model):
    omega = 10000.0 ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    R = torch.zeros(d_model, d_model, dtype=torch.float64)
    for i, w in enumerate(omega.tolist()):
        c, s = torch.cos(torch.tensor(k * w)), torch.sin(torch.tensor(k * w))
        R[2 * i:2 * i + 2, 2 * i:2 * i + 2] = torch.tensor([[c, s], [-s, c]])
    return R


def rope(x, sign=1.0, start=0):
    T, d = x.shape
    omega = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    angle = sign * (torch.arange(T, dtype=torch.float64)[:, None] + start) * omega
    x1, x2 = x[:, 0::2], x[:, 1::2]
    out = torch.empty_like(x)
    out[:, 0::2] = x1 * torch.cos(angle) - x2 * torch.sin(angle)
    out[:, 1::2] = x1 * torch.sin(angle) + x2 * torch.cos(angle)
    return out


def kv_causal_mask(T, T_k):
    return torch.ones(T, T_k, dtype=torch.bool).tril(diagonal=T_k - T)


def test_registry():
    assert set(registry(6)) == {"sinusoidal", "rotation_for_offset", "rope", "kv_causal_mask"}


def test_solutions_pass():
    for name, fn in [("sinusoidal", sinusoidal), ("rotation_for_offset", rotation_for_offset),
                     ("rope", lambda x: rope(x)), ("kv_causal_mask", kv_causal_mask)]:
        result = ch6.EXERCISES[name](fn)
        assert result.passed, f"{name}: {result.message}"


def test_sinusoidal_rejects_wrong():
    def swapped(n_pos, d_model):
        return sinusoidal(n_pos, d_model)[:, [i ^ 1 for i in range(d_model)]]  # cos first

    def exponent_i_over_d(n_pos, d_model):
        pos = torch.arange(n_pos, dtype=torch.float64)[:, None]
        omega = 10000.0 ** (-torch.arange(d_model // 2, dtype=torch.float64) / d_model)
        return torch.stack((torch.sin(pos * omega), torch.cos(pos * omega)), -1).flatten(1)

    def blocks(n_pos, d_model):  # sin half then cos half: a different layout
        pe = sinusoidal(n_pos, d_model)
        return torch.cat((pe[:, 0::2], pe[:, 1::2]), dim=1)

    for wrong in (swapped, exponent_i_over_d, blocks):
        assert_rejected(ch6.check_sinusoidal, wrong, "differs", "worst at")
    r = ch6.check_sinusoidal(lambda n_pos, d_model: sinusoidal(n_pos, d_model)[:, :-1])
    assert "shape" in r.message


def test_rotation_rejects_wrong():
    def transposed(k, d_model):
        return rotation_for_offset(k, d_model).T

    def no_frequencies(k, d_model):
        return rotation_for_offset(k, 2).repeat(1, 1).kron(torch.eye(d_model // 2, dtype=torch.float64))

    assert_rejected(ch6.check_rotation_for_offset, transposed, "differs")
    # d_model = 2 has only ω_0 = 1: case 1 passes
    assert_rejected(ch6.check_rotation_for_offset, no_frequencies, "case 2")


def test_rope_rejects_wrong():
    assert_rejected(ch6.check_rope, lambda x: rope(x, sign=-1.0), "differs")
    assert_rejected(ch6.check_rope, lambda x: rope(x, start=1))

    def half_split(x):  # GPT-NeoX layout: pairs (i, i + d/2) instead of (2i, 2i+1)
        d = x.shape[-1]
        perm = torch.cat((torch.arange(0, d, 2), torch.arange(1, d, 2)))
        out = torch.empty_like(x)
        out[:, perm] = rope(x[:, perm])
        return out

    assert_rejected(ch6.check_rope, half_split, "case 2")  # with d = 2 both layouts agree


def test_kv_mask_rejects_wrong():
    assert_rejected(ch6.check_kv_causal_mask, lambda T, T_k: torch.ones(T, T_k, dtype=torch.bool).tril(),
                    "case 2", "entries")
    assert_rejected(ch6.check_kv_causal_mask, lambda T, T_k: kv_causal_mask(T, T_k).float(), "bool")
    assert_rejected(ch6.check_kv_causal_mask, lambda T, T_k: torch.ones(T_k, T_k, dtype=torch.bool).tril(), "shape")
