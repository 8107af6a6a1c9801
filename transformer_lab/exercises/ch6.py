"""Chapter 6 (combinatorics) exercises: automatic checks.

* ``sinusoidal(n_pos, d_model)`` — the sinusoidal encoding, (n_pos, d_model), float64
* ``rotation_for_offset(k, d_model)`` — R(k) with PE(pos + k) = R(k) · PE(pos), (d_model, d_model)
* ``rope(x)`` — rotary encoding of x (T, d) at positions 0 … T-1, interleaved pairs
* ``kv_causal_mask(T, T_k)`` — the causal mask when the T queries are the last T of T_k positions
* ``alibi(T, n_head)`` — ALiBi's score bias m_h · (j - i), (n_head, T, T), m_h = 2^{-8h/H}, H a power of 2
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


def _ref_alibi(T, n_head):
    return P.alibi_bias(T, n_head=n_head, dtype=torch.float64)


def check_alibi(fn) -> CheckResult:
    """``fn(T, n_head) -> (n_head, T, T)``: entry (h-1, i, j) = m_h · (j - i), m_h = 2^{-8h/H}, h = 1 … H."""
    cases = [{"T": 4, "n_head": 8}, {"T": 5, "n_head": 4}, {"T": 3, "n_head": 2}, {"T": 1, "n_head": 1}]

    def compare(got, expected):
        msg = describe_difference(got, expected, atol=1e-12, rtol=1e-9)
        if msg is None or not isinstance(got, torch.Tensor) or got.shape != expected.shape:
            return msg
        H, T = expected.shape[0], expected.shape[1]
        if T > 1 and torch.allclose(got.double(), -expected):
            return msg + "; hint: the sign is flipped — keys behind the query (j < i) get a penalty, m_h·(j - i) < 0"
        first = got[0, -1, 0].item() / (1 - T) if T > 1 else None  # the slope of head 1, read off the matrix
        if first is not None and abs(first - 1.0) < 1e-9:
            return msg + "; hint: head h runs from 1 to H, so the first slope is 2^{-8/H}, not 2^0 = 1"
        if first is not None and H != 8 and abs(first - 0.5) < 1e-9:
            return msg + (f"; hint: the slopes are 2^{{-8h/H}} with H = {H}, not 2^{{-h}} "
                          "(which is right for H = 8 only)")
        return msg

    return check_function("alibi", fn, _ref_alibi, cases, compare=compare)


EXERCISES = {
    "sinusoidal": check_sinusoidal,
    "rotation_for_offset": check_rotation_for_offset,
    "rope": check_rope,
    "kv_causal_mask": check_kv_causal_mask,
    "alibi": check_alibi,
}
