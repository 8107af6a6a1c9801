"""Chapter 5 (information theory) exercises: automatic checks.

* ``cross_entropy_from_logits(logits, targets)`` — the mean loss in nats, stable for huge logits
* ``kl_div(p, q)`` — KL(p ‖ q) along the last dimension, 0 where p is 0
* ``bigram_entropy(text)`` — H(X_t | X_{t-1}) of a text's characters in bits per character
* ``head_entropy(weights)`` — the entropy of each attention row in nats, 0 for a fully masked (all-zero) row
"""

from __future__ import annotations

import itertools
import math
from collections import Counter

import torch

from transformer_lab import information as info
from transformer_lab.attention import scaled_dot_product_attention
from transformer_lab.exercises import CheckResult, check_function, describe_difference, generator


# ---------------------------------------------------------------- 1. cross-entropy from logits
def _ref_cross_entropy(logits, targets):
    return info.cross_entropy(logits, targets)


def _scalar_hint(got, expected, *, quantity: str) -> str:
    """A hint for a typical slip, read off the ratio of two numbers: sign, bits for nats, a sum for a mean."""
    if not isinstance(got, torch.Tensor) or got.numel() != 1 or not isinstance(expected, torch.Tensor):
        return ""
    g, e = float(got), float(expected)
    if not math.isfinite(g):
        return " — exp overflowed: subtract each row's max before exponentiating, and add it back after the log"
    if abs(g + e) <= 1e-6 * max(1.0, abs(e)):
        return f" — the sign is flipped: {quantity} is ≥ 0"
    if abs(g - e / math.log(2)) <= 1e-6 * max(1.0, abs(e)):
        return " — that is in bits (log base 2); use the natural log for nats"
    ratio = g / e if e else 0.0
    if ratio > 1.5 and abs(ratio - round(ratio)) < 1e-6:
        return f" — that is {round(ratio)} times the answer: the sum over the rows; return the mean"
    return ""


def _compare_ce(got, expected):
    msg = describe_difference(got, expected, atol=1e-9, rtol=1e-9)
    if msg and isinstance(got, torch.Tensor) and got.dim() == 1:
        return msg + " — return the mean over the rows, a 0-d tensor"
    return msg and msg + _scalar_hint(got, expected, quantity="the loss -log softmax(z)_y")


def check_cross_entropy_from_logits(fn) -> CheckResult:
    """``fn(logits (N, V), targets (N,)) -> scalar``: mean of -log softmax(logits)[i, targets[i]], in nats."""
    g = generator(5)
    cases = [
        {"logits": torch.randn(4, 5, generator=g, dtype=torch.float64),
         "targets": torch.randint(0, 5, (4,), generator=g)},
        {"logits": torch.randn(1, 3, generator=g, dtype=torch.float64), "targets": torch.tensor([2])},
        {"logits": torch.randn(16, 65, generator=g, dtype=torch.float64) * 3,
         "targets": torch.randint(0, 65, (16,), generator=g)},
        {"logits": torch.tensor([[1000.0, 0.0, -1000.0], [0.0, 800.0, 1.0]], dtype=torch.float64),
         "targets": torch.tensor([1, 2])},  # huge logits: exp overflows unless you shift by the max
    ]
    return check_function("cross_entropy_from_logits", fn, _ref_cross_entropy, cases, compare=_compare_ce)


# ---------------------------------------------------------------- 2. KL divergence
def _ref_kl(p, q):
    return info.kl_divergence(p, q)


def _compare_kl(got, expected):
    msg = describe_difference(got, expected, atol=1e-10, rtol=1e-9)
    if not msg or not isinstance(got, torch.Tensor) or got.shape != expected.shape:
        return msg
    if (got < -1e-12).any():
        return msg + " — a KL divergence is never negative (Gibbs' inequality): is the ratio p/q upside down?"
    if torch.isnan(got).any():
        return msg + " — 0 · log 0 gave NaN: use torch.special.xlogy, which makes 0 · log(0) = 0"
    if torch.allclose(got, expected / math.log(2), rtol=1e-9, atol=1e-12):
        return msg + " — that is in bits (log base 2); use the natural log for nats"
    return msg + (_average_hint(got, expected)
                  or " — KL(p ‖ q) = Σ p log(p / q): the weights are p, and the order of p and q matters")


def _average_hint(got: torch.Tensor, expected: torch.Tensor) -> str:
    """' — … averaged' when got = expected / k for one integer k > 1 (a mean over k entries instead of a sum)."""
    nonzero = expected.abs() > 1e-12
    if not nonzero.any():
        return ""
    k = expected[nonzero] / got[nonzero]
    k0 = k.flatten()[0].item()
    if k0 > 1.5 and abs(k0 - round(k0)) < 1e-6 and torch.allclose(k, torch.full_like(k, k0), rtol=1e-9):
        return f" — that is 1/{round(k0)} of the answer: sum over the last dimension, do not average"
    return ""


def check_kl_div(fn) -> CheckResult:
    """``fn(p (..., V), q (..., V)) -> (...)``: Σ_i p_i log(p_i / q_i) in nats, with 0 · log(0 / q) = 0."""
    g = generator(6)
    p = torch.softmax(torch.randn(3, 6, generator=g, dtype=torch.float64), -1)
    q = torch.softmax(torch.randn(3, 6, generator=g, dtype=torch.float64), -1)
    cases = [
        {"p": p[0], "q": q[0]},
        {"p": p, "q": q},
        {"p": torch.tensor([0.5, 0.5, 0.0, 0.0], dtype=torch.float64),
         "q": torch.tensor([0.25, 0.25, 0.25, 0.25], dtype=torch.float64)},  # zeros in p
        {"p": torch.tensor([0.9, 0.1], dtype=torch.float64), "q": torch.tensor([0.1, 0.9], dtype=torch.float64)},
    ]
    return check_function("kl_div", fn, _ref_kl, cases, compare=_compare_kl)


# ---------------------------------------------------------------- 3. bigram conditional entropy
def _ref_bigram_entropy(text):
    pairs = Counter(itertools.pairwise(text))  # c(a, b) over t = 1 … len-1
    first = Counter()
    for (a, _), c in pairs.items():
        first[a] += c  # c(a, ·) over the same pairs
    N = sum(pairs.values())
    return 0.0 - sum(c / N * math.log2(c / first[a]) for (a, _), c in pairs.items())  # 0.0 -: no -0.0


def _compare_float(got, expected):
    if not isinstance(got, int | float) and not (isinstance(got, torch.Tensor) and got.numel() == 1):
        return f"output should be a number (bits per character), got {type(got).__name__}"
    got = float(got)
    if abs(got - expected) > 1e-9:
        hint = ""
        if abs(got - expected * math.log(2)) < 1e-6:
            hint = " — that is the answer in nats; divide by ln 2"
        return f"got {got:.6f} bits/char, expected {expected:.6f} (|diff| = {abs(got - expected):.3g}){hint}"
    return None


def check_bigram_entropy(fn) -> CheckResult:
    """``fn(text: str) -> float``: H(X_t | X_{t-1}) in bits from the counts of the pairs (text[t-1], text[t])."""
    cases = [
        {"text": "abababab"},
        {"text": "abracadabra"},
        {"text": "to be, or not to be, that is the question"},
        {"text": "the cat sat on the mat; the dog sat on the log. " * 5},
    ]
    return check_function("bigram_entropy", fn, _ref_bigram_entropy, cases, compare=_compare_float)


# ---------------------------------------------------------------- 4. entropy of attention rows
def _ref_head_entropy(weights):
    return info.attention_entropy(weights)


def _compare_head_entropy(got, expected):
    msg = describe_difference(got, expected, atol=1e-10, rtol=1e-9)
    if not msg or not isinstance(got, torch.Tensor) or got.shape != expected.shape:
        return msg
    if torch.isnan(got).any():
        return msg + " — 0 · log 0 gave NaN (a masked key, or a fully masked row): use torch.special.xlogy"
    if (got < -1e-12).any():
        return msg + " — the sign is flipped: H = -Σ w log w is ≥ 0"
    if torch.allclose(got, expected / math.log(2), rtol=1e-9, atol=1e-12):
        return msg + " — that is in bits (log base 2); use the natural log for nats"
    return msg + (_average_hint(got, expected) or " — sum -w log w over the keys, the last dimension")


def check_head_entropy(fn) -> CheckResult:
    """``fn(weights (..., T_q, T_k)) -> (..., T_q)``: -Σ_k w log w per row in nats; an all-zero row gives 0."""
    g = generator(7)
    q, k = torch.randn(2, 5, 4, generator=g, dtype=torch.float64), torch.randn(2, 5, 4, generator=g,
                                                                                dtype=torch.float64)
    causal = torch.ones(5, 5, dtype=torch.bool).tril()
    no_key = causal.clone()
    no_key[3] = False  # query 3 may see no key: attention gives it all-zero weights
    cases = [
        {"weights": torch.softmax(torch.randn(4, 4, generator=g, dtype=torch.float64), -1)},
        {"weights": scaled_dot_product_attention(query=q, key=k, value=k, mask=causal)[1]},  # zeros above the diagonal
        {"weights": torch.softmax(torch.randn(3, 2, 6, 5, generator=g, dtype=torch.float64) * 2, -1)},  # T_q != T_k
        {"weights": scaled_dot_product_attention(query=q, key=k, value=k, mask=no_key)[1]},  # a fully masked row
    ]
    return check_function("head_entropy", fn, _ref_head_entropy, cases, compare=_compare_head_entropy)


EXERCISES = {
    "cross_entropy_from_logits": check_cross_entropy_from_logits,
    "kl_div": check_kl_div,
    "bigram_entropy": check_bigram_entropy,
    "head_entropy": check_head_entropy,
}
