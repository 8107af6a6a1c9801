"""Chapter 6 (combinatorics) exercises: automatic checks.

* ``sinusoidal(n_pos, d_model)`` — the sinusoidal encoding, (n_pos, d_model), float64
* ``rotation_for_offset(k, d_model)`` — R(k) with PE(pos + k) = R(k) · PE(pos), (d_model, d_model)
* ``rope(x)`` — rotary encoding of x (T, d) at positions 0 … T-1, interleaved pairs
* ``kv_causal_mask(T, T_k)`` — the causal mask when the T queries are the last T of T_k positions
* ``kv_pair_count(T, T_k)`` — how many (query, key) pairs that mask admits, an int
* ``alibi(T, n_head)`` — ALiBi's score bias m_h · (j - i), (n_head, T, T), m_h = 2^{-8h/H}, H a power of 2
* ``head_splits(d_model, n_head)`` — ways to deal d_model coordinates into n_head unordered heads, an int
"""

from __future__ import annotations

import math

import numpy as np
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

    def compare(got, expected):
        msg = describe_difference(got, expected, atol=1e-6, rtol=1e-5)  # float32 ok
        if msg is None or not isinstance(got, torch.Tensor | np.ndarray) or tuple(got.shape) != tuple(expected.shape):
            return msg
        if torch.allclose(torch.as_tensor(got).double(), expected.T, atol=1e-6, rtol=1e-5):
            return msg + ("; hint: that is the transpose, Rot(kω) per block: the pair is stored as (sin, cos), "
                          "so the block is [[cos kω, sin kω], [-sin kω, cos kω]]")
        return msg

    return check_function("rotation_for_offset", fn, _ref_rotation, cases, compare=compare)


def _ref_rope(x):
    return P.apply_rope(x)


def check_rope(fn) -> CheckResult:
    """``fn(x (T, d)) -> (T, d)``: pair (x[m, 2i], x[m, 2i+1]) rotated by m·ω_i, ω_i = 10000^{-2i/d}."""
    g = torch.Generator().manual_seed(7)
    cases = [{"x": torch.randn(3, 2, generator=g, dtype=torch.float64)},
             {"x": torch.randn(6, 8, generator=g, dtype=torch.float64)},
             {"x": torch.randn(12, 16, generator=g, dtype=torch.float64)}]
    return check_function("rope", fn, _ref_rope, cases, atol=1e-6, rtol=1e-5)  # angles in float32 are right too


def _ref_kv_mask(T, T_k):
    return P.causal_mask(T, T_k)


def check_kv_causal_mask(fn) -> CheckResult:
    """``fn(T, T_k) -> bool (T, T_k)``: True where query i (position T_k - T + i) may see key j."""
    cases = [{"T": 3, "T_k": 3}, {"T": 1, "T_k": 5}, {"T": 2, "T_k": 6}, {"T": 4, "T_k": 7}]

    def compare(got, expected):
        if isinstance(got, np.ndarray):  # a NumPy mask is accepted, as check_sinusoidal accepts NumPy arrays
            got = torch.from_numpy(got)
        if not isinstance(got, torch.Tensor):
            return f"output should be a bool torch.Tensor (True = may attend), got a {type(got).__name__}"
        if got.dtype != torch.bool:
            return f"output should have dtype bool (True = may attend), got dtype {got.dtype}"
        return describe_difference(got, expected)

    return check_function("kv_causal_mask", fn, _ref_kv_mask, cases, compare=compare)


def _ref_kv_pair_count(T, T_k):
    return P.causal_mask(T, T_k).sum().item()  # counted from the mask itself, not from the formula


def check_kv_pair_count(fn) -> CheckResult:
    """``fn(T, T_k) -> int``: the True entries of the key-value-cache mask, T (T_k - T) + T (T + 1) / 2."""
    cases = [{"T": 1, "T_k": 1}, {"T": 3, "T_k": 3}, {"T": 1, "T_k": 9}, {"T": 4, "T_k": 7}, {"T": 50, "T_k": 1000}]
    hints = [
        (lambda T, T_k: T * T_k, "that counts every (query, key) pair: key j is visible only up to the query's own "
                                 "position T_k - T + i"),
        (lambda T, T_k: T * (T + 1) // 2, "that is the count without a cache: each query also sees the T_k - T "
                                          "cached keys before the new ones"),
        (lambda T, T_k: T * (T_k - T) + T * (T - 1) // 2, "one short per query: a query also sees its own key"),
        (lambda T, T_k: T_k * (T_k + 1) // 2, "that counts all T_k queries; only the last T are new"),
    ]

    return _check_count("kv_pair_count", fn, _ref_kv_pair_count, cases, hints)


def _check_count(name: str, fn, reference, cases: list[dict], hints: list) -> CheckResult:
    """Check an exercise whose answer is an int; when the answer equals a typical mistake's formula
    ``wrong(*case)`` on every case, name that mistake (``hints``: (wrong, hint) pairs)."""
    def compare(got, expected):
        msg = describe_difference(got, expected)
        return f"the count is {got}, expected {expected}" if msg and "differs" in msg else msg

    result = check_function(name, fn, reference, cases, compare=compare)
    if result.passed:
        return result
    try:  # a typical mistake gives a known formula on every case: name it
        answers = [fn(*c.values()) for c in cases]
    except Exception:  # check_function has already reported it
        return result
    for wrong, hint in hints:
        if all(a == wrong(*c.values()) and not isinstance(a, bool) for a, c in zip(answers, cases, strict=True)):
            return CheckResult(result.name, False, f"{result.message}; hint: {hint}")
    return result


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
            return msg + ("; hint: the sign is flipped, or i and j are swapped — keys behind the query (j < i) get "
                          "a penalty, m_h·(j - i) < 0")
        if H > 1 and T > 1 and torch.allclose(got.double(), expected.flip(0)):
            return msg + (f"; hint: the heads are in reverse order — head 1 has the steepest slope "
                          f"2^{{-8/H}} = 2^{{-{8 / H:g}}}")
        if T > 1 and torch.isneginf(got[:, 0, 1]).all():
            return msg + "; hint: leave the mask out (-inf above the diagonal): it is applied separately"
        first = got[0, -1, 0].item() / (1 - T) if T > 1 else None  # the slope of head 1, read off the matrix
        if first is not None and abs(first - 1.0) < 1e-9:
            return msg + "; hint: head h runs from 1 to H, so the first slope is 2^{-8/H}, not 2^0 = 1"
        if first is not None and H != 8 and abs(first - 0.5) < 1e-9:
            return msg + (f"; hint: the slopes are 2^{{-8h/H}} with H = {H}, not 2^{{-h}} "
                          "(which is right for H = 8 only)")
        return msg

    return check_function("alibi", fn, _ref_alibi, cases, compare=compare)


def _ref_head_splits(d_model, n_head):
    return P.head_partitions(d_model, n_head)


def check_head_splits(fn) -> CheckResult:
    """``fn(d_model, n_head) -> int``: set partitions into n_head blocks of d_k = d/h, d! / ((d_k!)^h h!)."""
    cases = [{"d_model": 4, "n_head": 2}, {"d_model": 6, "n_head": 3}, {"d_model": 8, "n_head": 2},
             {"d_model": 6, "n_head": 1}, {"d_model": 12, "n_head": 4}, {"d_model": 16, "n_head": 4}]
    f = math.factorial
    hints = [
        (lambda d, h: f(d) // f(d // h) ** h, "that counts labelled heads: each split is counted once per order of "
                                              "its h heads, so divide by h!"),
        (lambda d, h: math.comb(d, d // h), "that is only head 1's choice, C(d, d_k): head 2 then chooses from the "
                                            "d - d_k left, and so on"),
        (lambda d, h: f(d) // (f(d // h) * f(h)), "(d_k!)^h, not d_k!: each of the h heads ignores the order of its "
                                                  "own d_k coordinates"),
        (lambda d, h: f(d) // f(h), "divide by (d_k!)^h as well: the order of the coordinates inside a head does not "
                                    "matter"),
    ]

    return _check_count("head_splits", fn, _ref_head_splits, cases, hints)


EXERCISES = {
    "sinusoidal": check_sinusoidal,
    "rotation_for_offset": check_rotation_for_offset,
    "rope": check_rope,
    "kv_causal_mask": check_kv_causal_mask,
    "kv_pair_count": check_kv_pair_count,
    "alibi": check_alibi,
    "head_splits": check_head_splits,
}
