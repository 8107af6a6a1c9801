"""Chapter 6 (combinatorics) exercises: automatic checks.

* ``sinusoidal(n_pos, d_model)`` — the sinusoidal encoding, (n_pos, d_model), float64
* ``rotation_for_offset(k, d_model)`` — R(k) with PE(pos + k) = R(k) · PE(pos), (d_model, d_model)
* ``rope(x)`` — rotary encoding of x (T, d) at positions 0 … T-1, interleaved pairs
* ``kv_causal_mask(T, T_k)`` — the causal mask when the T queries are the last T of T_k positions
"""

from __future__ import annotations

import torch

from transformer_lab import positional as P
from transformer_lab.exercises import CheckResult, check_function, describe_difference


def _ref_sinusoidal(n_pos, d_model):
    return P.sinusoidal_encoding(n_pos, d_model, dtype=torch.float64)


def check_sinusoidal(fn) -> CheckResult:
    """``fn(n_pos, d_model) -> (n_pos, d_model)``: PE[pos, 2i] = sin(pos / 10000^{2i/d}), PE[pos, 2i+1] = cos."""
    cases = [{"n_pos": 4, "d_model": 2}, {"n_pos": 10, "d_model": 8}, {"n_pos": 50, "d_model": 32},
             {"n_pos": 1, "d_model": 6}]
    return check_function("sinusoidal", fn, _ref_sinusoidal, cases, atol=1e-6, rtol=1e-5)


def _ref_rotation(k, d_model):
    return P.relative_rotation(k, d_model, dtype=torch.float64)


def check_rotation_for_offset(fn) -> CheckResult:
    """``fn(k, d_model) -> (d_model, d_model)``: the block-diagonal R(k) with PE(pos + k) = R(k) PE(pos)."""
    cases = [{"k": 1, "d_model": 2}, {"k": 3, "d_model": 4}, {"k": 10, "d_model": 8}, {"k": -2, "d_model": 6}]
    return check_function("rotation_for_offset", fn, _ref_rotation, cases, atol=1e-9, rtol=1e-7)


def _ref_rope(x):
    return P.apply_rope(x)


def check_rope(fn) -> CheckResult:
    """``fn(x (T, d)) -> (T, d)``: pair (x[m, 2i], x[m, 2i+1]) rotated by m·ω_i, ω_i = 10000^{-2i/d}."""
    g = torch.Generator().manual_seed(7)
    cases = [{"x": torch.randn(3, 2, generator=g, dtype=torch.float64)},
             {"x": torch.randn(6, 8, generator=g, dtype=torch.float64)},
             {"x": torch.randn(12, 16, generator=g, dtype=torch.float64)}]
    return check_function("rope", fn, _ref_rope, cases, atol=1e-9, rtol=1e-7)


def _ref_kv_mask(T, T_k):
    return P.causal_mask(T, T_k)


def check_kv_causal_mask(fn) -> CheckResult:
    """``fn(T, T_k) -> bool (T, T_k)``: True where query i (position T_k - T + i) may see key j."""
    cases = [{"T": 3, "T_k": 3}, {"T": 1, "T_k": 5}, {"T": 2, "T_k": 6}, {"T": 4, "T_k": 7}]

    def compare(got, expected):
        if not isinstance(got, torch.Tensor) or got.dtype != torch.bool:
            return f"output should be a bool tensor (True = may attend), got {getattr(got, 'dtype', type(got))}"
        return describe_difference(got, expected)

    return check_function("kv_causal_mask", fn, _ref_kv_mask, cases, compare=compare)


EXERCISES = {
    "sinusoidal": check_sinusoidal,
    "rotation_for_offset": check_rotation_for_offset,
    "rope": check_rope,
    "kv_causal_mask": check_kv_causal_mask,
}
