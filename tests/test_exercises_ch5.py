"""Chapter 5 exercise checkers: each accepts the solution and rejects wrong ones with a message naming the fault."""

from __future__ import annotations

import itertools
import math
from collections import Counter

import torch
from conftest import assert_rejected

from transformer_lab.exercises import ch5, registry


# ---------------------------------------------------------------- solutions (as in the chapter)
def cross_entropy_from_logits(logits, targets):
    m = logits.max(dim=-1, keepdim=True).values
    lse = m.squeeze(-1) + torch.log(torch.exp(logits - m).sum(dim=-1))
    return (lse - logits.gather(-1, targets[:, None]).squeeze(-1)).mean()


def kl_div(p, q):
    return (torch.special.xlogy(p, p) - torch.special.xlogy(p, q)).sum(dim=-1)


def bigram_entropy(text):
    pairs = Counter(itertools.pairwise(text))
    first = Counter()
    for (a, _), c in pairs.items():
        first[a] += c
    n = sum(pairs.values())
    return -sum(c / n * math.log2(c / first[a]) for (a, _), c in pairs.items())


def test_registry():
    assert set(registry(5)) == {"cross_entropy_from_logits", "kl_div", "bigram_entropy"}


def test_solutions_pass():
    for name, fn in [("cross_entropy_from_logits", cross_entropy_from_logits), ("kl_div", kl_div),
                     ("bigram_entropy", bigram_entropy)]:
        result = ch5.EXERCISES[name](fn)
        assert result.passed, result.message


def test_stub_reports_not_written():
    def kl_div(p, q):
        raise NotImplementedError

    assert_rejected(ch5.check_kl_div, kl_div, "not written yet")


def test_cross_entropy_rejects_wrong():
    def naive(logits, targets):  # overflows on huge logits
        p = torch.exp(logits) / torch.exp(logits).sum(-1, keepdim=True)
        return -torch.log(p[torch.arange(len(targets)), targets]).mean()

    def summed(logits, targets):
        return cross_entropy_from_logits(logits, targets) * len(targets)

    def wrong_sign(logits, targets):
        return -cross_entropy_from_logits(logits, targets)

    r = assert_rejected(ch5.check_cross_entropy_from_logits, naive, "case 4")  # only the huge-logit case fails
    assert "NaN" in r.message or "differs" in r.message
    assert_rejected(ch5.check_cross_entropy_from_logits, summed, "differs", "case 1")
    assert_rejected(ch5.check_cross_entropy_from_logits, wrong_sign, "expected")


def test_kl_rejects_wrong():
    def swapped(p, q):
        return kl_div(q, p)

    def naive(p, q):  # 0 * log(0 / q) = 0 * -inf = NaN
        return (p * torch.log(p / q)).sum(-1)

    def bits(p, q):
        return kl_div(p, q) / math.log(2)

    assert_rejected(ch5.check_kl_div, swapped, "differs")
    assert_rejected(ch5.check_kl_div, naive, "NaN", "case 3")
    assert_rejected(ch5.check_kl_div, bits, "worst at")


def test_bigram_rejects_wrong():
    def joint(text):  # H(X_{t-1}, X_t) instead of the conditional
        pairs = Counter(itertools.pairwise(text))
        n = sum(pairs.values())
        return -sum(c / n * math.log2(c / n) for c in pairs.values())

    def nats(text):
        return bigram_entropy(text) * math.log(2)

    def unigram(text):
        counts = Counter(text)
        return -sum(c / len(text) * math.log2(c / len(text)) for c in counts.values())

    assert_rejected(ch5.check_bigram_entropy, joint, "expected 0.000000")  # "abababab": b always follows a
    assert_rejected(ch5.check_bigram_entropy, nats, "nats")
    assert_rejected(ch5.check_bigram_entropy, unigram, "bits/char")
    assert_rejected(ch5.check_bigram_entropy, lambda text: "1.0")
