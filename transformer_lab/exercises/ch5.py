"""Chapter 5 (information theory) exercises: automatic checks.

* ``cross_entropy_from_logits(logits, targets)`` — the mean loss in nats, stable for huge logits
* ``kl_div(p, q)`` — KL(p ‖ q) along the last dimension, 0 where p is 0
* ``bigram_entropy(text)`` — H(X_t | X_{t-1}) of a text's characters in bits per character
"""

from __future__ import annotations

import itertools
import math
from collections import Counter

import torch

from transformer_lab import information as info
from transformer_lab.exercises import CheckResult, check_function, generator


# ---------------------------------------------------------------- 1. cross-entropy from logits
def _ref_cross_entropy(logits, targets):
    return info.cross_entropy(logits, targets)


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
    return check_function("cross_entropy_from_logits", fn, _ref_cross_entropy, cases, atol=1e-9, rtol=1e-9)


# ---------------------------------------------------------------- 2. KL divergence
def _ref_kl(p, q):
    return info.kl_divergence(p, q)


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
    return check_function("kl_div", fn, _ref_kl, cases, atol=1e-10, rtol=1e-9)


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


EXERCISES = {
    "cross_entropy_from_logits": check_cross_entropy_from_logits,
    "kl_div": check_kl_div,
    "bigram_entropy": check_bigram_entropy,
}
