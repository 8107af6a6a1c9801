"""Chapter 5 (information theory) exercises: automatic checks.

* ``cross_entropy_from_logits(logits, targets)`` — the mean loss in nats, stable for huge logits
* ``kl_div(p, q)`` — KL(p ‖ q) along the last dimension, 0 where p is 0
* ``mutual_information(joint)`` — I(X; Y) = H(Y) - H(Y | X) in nats from a joint table P(X = i, Y = j)
* ``bigram_entropy(text)`` — H(X_t | X_{t-1}) of a text's characters in bits per character
* ``head_entropy(weights)`` — the entropy of each attention row in nats, 0 for a fully masked (all-zero) row
* ``processed_information(joint, f)`` — (I(X; Y), I(f(X); Y)): the data-processing inequality on a table
* ``maxent_distribution(z, T)`` — the maximiser of Σ pᵢzᵢ + T·H(p), derived with a Lagrange multiplier (SymPy)
* ``loss_units(loss, tokens_per_char)`` — a loss in nats per token as bits per character, perplexity per token and
  perplexity per character

A hint is added to a "differs" message only when its condition holds: the answer equals what the typical slip
computes on that case (the slips are computed from the case's inputs), or is within 0.1 % of the answer. Hints are
computed through :func:`_hint`, so a hint that cannot be computed on a strange answer is left out, never raised.
"""

from __future__ import annotations

import itertools
import math
import numbers
from collections import Counter

import sympy as sp
import torch

from transformer_lab import information as info
from transformer_lab.attention import scaled_dot_product_attention
from transformer_lab.exercises import CheckResult, check_expression, check_function, describe_difference, generator
from transformer_lab.exercises.forbid import CROSS_ENTROPY

_CLOSE = " — close but not exact: did you add an eps inside the log? torch.special.xlogy makes 0 · log 0 = 0 exactly"


def _hint(*candidates) -> str:
    """The first non-empty hint that the zero-argument ``candidates`` return; one that raises counts as '' (a hint
    is advice on an answer already known to be wrong: computing it must never crash the check)."""
    for make in candidates:
        try:
            hint = make()
        except Exception:  # any arithmetic on a student's output may fail
            continue
        if hint:
            return hint
    return ""


def _slip_hint(got, slips) -> str:
    """The hint of the first ``(value, hint)`` in ``slips`` that ``got`` equals (float64, rtol 1e-9), else ''."""
    if not isinstance(got, torch.Tensor) or not got.is_floating_point():
        return ""
    got = got.detach().to(torch.float64)
    for value, hint in slips:
        if got.shape == value.shape and torch.allclose(got, value, rtol=1e-9, atol=1e-12, equal_nan=False):
            return hint
    return ""


def _close_hint(got, expected) -> str:
    """A dtype hint when ``got`` is not in ``expected``'s dtype; :data:`_CLOSE` when every entry is within 0.1 %
    (or 1e-6) of ``expected``; else ''."""
    if not isinstance(got, torch.Tensor) or got.shape != expected.shape or not got.is_floating_point():
        return ""
    if got.dtype != expected.dtype:
        return f" — the result is {got.dtype}: keep the inputs' {expected.dtype} (no .float(), no float32 constants)"
    return _CLOSE if torch.allclose(got.detach().to(torch.float64), expected, rtol=1e-3, atol=1e-6) else ""


def _case_index(expected, expecteds) -> int:
    """Which case ``expected`` belongs to (the checker's compare sees only the two values)."""
    return next(i for i, e in enumerate(expecteds) if e.shape == expected.shape and torch.equal(e, expected))


# ---------------------------------------------------------------- 1. cross-entropy from logits
def _ref_cross_entropy(logits, targets):
    return info.cross_entropy(logits, targets)


def _scalar_hint(got, expected, *, quantity: str) -> str:
    """A hint for a typical slip, read off the ratio of two numbers: sign, bits for nats, a sum for a mean."""
    if not isinstance(got, torch.Tensor) or got.numel() != 1 or not isinstance(expected, torch.Tensor):
        return ""
    g, e = float(got), float(expected)
    if g == -math.inf:
        return (" — a row's exponentials all underflowed to 0 (log 0 = -inf): shift each row by its own max, "
                "not by one max over the whole batch")
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


def _ce_slips(logits, targets) -> list:
    """What the typical slips compute on one case, each with its hint."""
    m = logits.max(dim=-1, keepdim=True).values
    no_add = (torch.log(torch.exp(logits - m).sum(-1)) - logits.gather(-1, targets[:, None]).squeeze(-1)).mean()
    return [(no_add, " — the max is not added back: log Σ e^(z - m) is LSE(z) - m, so add m back after the log")]


def _compare_ce_with(slips: list):
    def compare(got, expected):
        msg = describe_difference(got, expected, atol=1e-9, rtol=1e-9)
        if msg and isinstance(got, torch.Tensor) and got.dim() == 1:
            return msg + " — return the mean over the rows, a 0-d tensor"
        return msg and msg + _hint(
            lambda: _slip_hint(got, slips[_case_index(expected, [e for e, _ in slips])][1]),
            lambda: _scalar_hint(got, expected, quantity="the loss -log softmax(z)_y"))
    return compare


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
        {"logits": torch.tensor([[1000.0, 0.0, -1000.0], [-1000.0, -1001.0, -999.0]], dtype=torch.float64),
         "targets": torch.tensor([1, 2])},  # rows far apart: one max for the whole batch underflows row 2
    ]
    slips = [(_ref_cross_entropy(**c), _ce_slips(**c)) for c in cases]
    return check_function("cross_entropy_from_logits", fn, _ref_cross_entropy, cases,
                          compare=_compare_ce_with(slips), forbidden=CROSS_ENTROPY)


# ---------------------------------------------------------------- 2. KL divergence
def _ref_kl(p, q):
    return info.kl_divergence(p, q)


def _kl_slips(p, q, expected) -> list:
    """What the typical slips compute on one case, each with its hint."""
    return [(info.kl_divergence(q, p), " — that is KL(q ‖ p): the weights are p, Σ p log(p / q), and the order "
                                       "of p and q matters"),
            (expected / math.log(2), " — that is in bits (log base 2); use the natural log for nats"),
            (-expected, " — a KL divergence is never negative (Gibbs' inequality): is the ratio p/q upside down?"),
            (info.distribution_cross_entropy(p, q), " — that is the cross-entropy H(p, q) = -Σ p log q = H(p) + "
                                                    "KL(p ‖ q): subtract H(p), i.e. add Σ p log p")]


def _compare_kl_with(slips: list):
    def compare(got, expected):
        msg = describe_difference(got, expected, atol=1e-10, rtol=1e-9)
        if not msg or not isinstance(got, torch.Tensor) or got.shape != expected.shape:
            return msg
        infinite = torch.isposinf(expected)
        if infinite.any() and not torch.isposinf(got[infinite]).all():  # q_i = 0 < p_i: the answer must be +inf
            shown = "NaN" if torch.isnan(got[infinite]).any() else "a finite number"
            return msg + (f" — where q_i = 0 < p_i the term p_i log(p_i / q_i) is +inf, so KL(p ‖ q) = +inf (q rules"
                          f" out an outcome p can produce), not {shown}: do not clamp q, add an eps, drop the terms"
                          " where q = 0 or replace inf (nan_to_num); p_i log p_i - p_i log q_i with"
                          " torch.special.xlogy gives +inf there and 0 where p_i = 0")
        if torch.isnan(got).any():
            return msg + " — 0 · log 0 gave NaN: use torch.special.xlogy, which makes 0 · log(0) = 0"
        return msg + _hint(lambda: _slip_hint(got, slips[_case_index(expected, [e for e, _ in slips])][1]),
                           lambda: _average_hint(got, expected), lambda: _close_hint(got, expected),
                           lambda: " — a KL divergence is never negative (Gibbs' inequality)"
                           if (got < -1e-12).any() else "")
    return compare


def _average_hint(got: torch.Tensor, expected: torch.Tensor) -> str:
    """' — … averaged' when got = expected / k for one integer k > 1 (a mean over k entries instead of a sum)."""
    if not got.is_floating_point():
        return ""
    got = got.detach().to(torch.float64)
    nonzero = (expected.abs() > 1e-12) & (got != 0)  # got = 0 where expected is not: no ratio to read
    if not nonzero.any():
        return ""
    k = expected[nonzero] / got[nonzero]
    k0 = k.flatten()[0].item()
    if (math.isfinite(k0) and k0 > 1.5 and abs(k0 - round(k0)) < 1e-6
            and torch.allclose(k, torch.full_like(k, k0), rtol=1e-9)):
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
        {"p": torch.tensor([[0.5, 0.3, 0.2], [0.2, 0.8, 0.0]], dtype=torch.float64),  # q = 0 < p: KL = +inf (row 1)
         "q": torch.tensor([[0.6, 0.4, 0.0], [0.5, 0.25, 0.25]], dtype=torch.float64)},
    ]
    slips = [(e := _ref_kl(**c), _kl_slips(c["p"], c["q"], e)) for c in cases]
    return check_function("kl_div", fn, _ref_kl, cases, compare=_compare_kl_with(slips))


# ---------------------------------------------------------------- 3. mutual information from a joint table
def _ref_mutual_information(joint):
    return info.mutual_information(joint)


def _mi_slips(joint, expected) -> list:
    """What the typical slips compute on one joint table, each with its hint."""
    px, py = joint.sum(1), joint.sum(0)
    h_y = info.entropy(py)
    h_y_given_x = h_y - expected
    rows = torch.where(px[:, None] > 0, joint / px[:, None].clamp_min(1e-300), 0.0)  # p(y | x)
    unweighted = -torch.special.xlogy(rows, rows).sum(1)[px > 0].mean()  # rows' entropies, not weighted by p(x)
    return [(h_y_given_x, " — that is H(Y | X); the information is what it removes, H(Y) - H(Y | X)"),
            (h_y, " — that is H(Y) alone; subtract H(Y | X)"),
            (-expected, " — the sign is flipped: H(Y) - H(Y | X) is ≥ 0"),
            (expected / math.log(2), " — that is in bits (log base 2); use the natural log for nats"),
            (h_y - unweighted, " — H(Y | X) weights each row's entropy H(Y | X = x) by p(x); you averaged the rows"),
            (2 * h_y - info.entropy(joint.flatten()), " — H(Y | X) = H(X, Y) - H(X): subtract the entropy of the "
                                                      "variable you condition on, p(x) = joint.sum(1), not H(Y)")]


def _compare_mi_with(slips: list):
    def compare(got, expected):
        msg = describe_difference(got, expected, atol=1e-10, rtol=1e-9)
        if not msg or not isinstance(got, torch.Tensor) or got.shape != expected.shape:
            return msg
        if torch.isnan(got).any():
            return msg + " — 0 · log 0 gave NaN (a cell of probability 0): use torch.special.xlogy"
        return msg + _hint(lambda: _slip_hint(got, slips[_case_index(expected, [e for e, _ in slips])][1]),
                           lambda: _close_hint(got, expected))
    return compare


def check_mutual_information(fn) -> CheckResult:
    """``fn(joint (n_x, n_y)) -> scalar``: I(X; Y) = H(Y) - H(Y | X) in nats, with 0 · log 0 = 0."""
    g = generator(8)
    with_zeros = torch.tensor([[0.3, 0.0, 0.1], [0.0, 0.2, 0.0], [0.1, 0.1, 0.2]], dtype=torch.float64)
    cases = [
        {"joint": torch.softmax(torch.randn(12, generator=g, dtype=torch.float64) * 2, 0).view(3, 4)},
        {"joint": torch.tensor([[0.1, 0.3], [0.15, 0.45]], dtype=torch.float64)},  # independent: I = 0
        {"joint": torch.diag(torch.tensor([0.5, 0.25, 0.25], dtype=torch.float64))},  # Y = X: I = H(X)
        {"joint": with_zeros},  # zero cells: 0 · log 0 = 0
        {"joint": torch.softmax(torch.randn(10, generator=g, dtype=torch.float64), 0).view(2, 5)},  # n_x != n_y
    ]
    slips = [(e := _ref_mutual_information(**c), _mi_slips(c["joint"], e)) for c in cases]
    return check_function("mutual_information", fn, _ref_mutual_information, cases, compare=_compare_mi_with(slips))


# ---------------------------------------------------------------- 4. bigram conditional entropy
def _ref_bigram_entropy(text):
    pairs = Counter(itertools.pairwise(text))  # c(a, b) over t = 1 … len-1
    first = Counter()
    for (a, _), c in pairs.items():
        first[a] += c  # c(a, ·) over the same pairs
    N = sum(pairs.values())
    return 0.0 - sum(c / N * math.log2(c / first[a]) for (a, _), c in pairs.items())  # 0.0 -: no -0.0


def _bigram_slips(text) -> list:
    """What the typical slips compute on one text, each with its hint."""
    pairs = Counter(itertools.pairwise(text))
    N, H = sum(pairs.values()), _ref_bigram_entropy(text)
    first, second, follow = Counter(), Counter(), {}
    for (a, b), c in pairs.items():
        first[a] += c
        second[b] += c
        follow.setdefault(a, []).append(c)
    backwards = -sum(c / N * math.log2(c / second[b]) for (_, b), c in pairs.items())  # H(X_{t-1} | X_t)
    per_context = sum(-sum(c / sum(cs) * math.log2(c / sum(cs)) for c in cs) for cs in follow.values()) / len(follow)
    joint = -sum(c / N * math.log2(c / N) for c in pairs.values())  # H(X_{t-1}, X_t)
    everywhere = Counter(text)  # c(a) over every character, the last one included
    all_chars = -sum(c / N * math.log2(c / everywhere[a]) for (a, _), c in pairs.items())
    return [(H * math.log(2), " — that is the answer in nats; divide by ln 2"),
            (joint, " — that is the joint entropy H(X_{t-1}, X_t); inside the log use c(a, b) / c(a), P(b | a)"),
            (H * N / len(text), " — N is the number of pairs, len(text) - 1, not len(text)"),
            (backwards, " — that is H(X_{t-1} | X_t): condition on the first character of each pair, c(a) = Σ_b "
                        "c(a, b)"),
            (per_context, " — each context's entropy must be weighted by how often it occurs, c(a) / N, not "
                          "averaged over the contexts"),
            (all_chars, " — count c(a) over the pairs' first characters, c(a) = Σ_b c(a, b), not over all "
                        "characters: the last character starts no pair"),
            (info.ngram_entropy_bits(text, 2), " — that is information.ngram_entropy_bits(text, 2), which reads the "
                                               "text as a circle: don't wrap around, count only the len(text) - 1 "
                                               "pairs")]


def _compare_float_with(slips: list):
    def compare(got, expected):
        if isinstance(got, bool) or not (isinstance(got, numbers.Real)
                                         or (isinstance(got, torch.Tensor) and got.numel() == 1)):
            return f"output should be a number (bits per character), got {type(got).__name__}"
        kind = str(got.dtype).removeprefix("torch.") if isinstance(got, torch.Tensor) else type(got).__name__
        try:
            got = float(got)
        except (TypeError, ValueError, RuntimeError):  # a complex tensor, say
            return f"output should be a real number (bits per character), got {kind}"
        if not abs(got - expected) <= 1e-9:  # NaN differs too
            case = slips[[e for e, _ in slips].index(expected)][1]
            hint = _hint(lambda: next((h for v, h in case if abs(got - v) <= 1e-9 * max(1.0, abs(v))), ""),
                         lambda: f" — a {kind} keeps about 7 digits: return a Python float (float64)"
                         if kind in ("float32", "float16", "bfloat16") else "",
                         lambda: " — close but not exact: count the pairs exactly, with no smoothing or eps"
                         if abs(got - expected) <= 1e-3 * abs(expected) else "")
            return f"got {got:.9g} bits/char, expected {expected:.9g} (|diff| = {abs(got - expected):.3g}){hint}"
        return None
    return compare


def check_bigram_entropy(fn) -> CheckResult:
    """``fn(text: str) -> float``: H(X_t | X_{t-1}) in bits from the counts of the pairs (text[t-1], text[t])."""
    cases = [
        {"text": "abababab"},
        {"text": "abracadabra"},
        {"text": "to be, or not to be, that is the question"},
        {"text": "the cat sat on the mat; the dog sat on the log. " * 5},
    ]
    slips = [(_ref_bigram_entropy(**c), _bigram_slips(c["text"])) for c in cases]
    return check_function("bigram_entropy", fn, _ref_bigram_entropy, cases, compare=_compare_float_with(slips))


# ---------------------------------------------------------------- 5. entropy of attention rows
def _ref_head_entropy(weights):
    return info.attention_entropy(weights)


def _head_slips(weights, expected) -> list:
    """What the typical slips compute on one case, each with its hint."""
    return [(-expected, " — the sign is flipped: H = -Σ w log w is ≥ 0"),
            (expected / math.log(2), " — that is in bits (log base 2); use the natural log for nats"),
            (-torch.special.xlogy(weights, weights).sum(-2), " — that sums over the queries; sum -w log w over the "
                                                              "keys, the last dimension")]


def _compare_head_entropy_with(slips: list):
    def compare(got, expected):
        msg = describe_difference(got, expected, atol=1e-10, rtol=1e-9)
        if not msg or not isinstance(got, torch.Tensor) or got.shape != expected.shape:
            return msg
        if torch.isnan(got).any():
            return msg + " — 0 · log 0 gave NaN (a masked key, or a fully masked row): use torch.special.xlogy"
        return msg + _hint(lambda: _slip_hint(got, slips[_case_index(expected, [e for e, _ in slips])][1]),
                           lambda: _average_hint(got, expected), lambda: _close_hint(got, expected))
    return compare


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
    slips = [(e := _ref_head_entropy(**c), _head_slips(c["weights"], e)) for c in cases]
    return check_function("head_entropy", fn, _ref_head_entropy, cases, compare=_compare_head_entropy_with(slips))


# ---------------------------------------------------------------- 6. the data-processing inequality
def _merge_rows(joint, f, n_z: int, *, average=False):
    """p(z, y) = Σ_{x: f(x) = z} p(x, y) (``average``: the slip that takes the rows' mean instead)."""
    merged = torch.zeros(n_z, joint.shape[1], dtype=joint.dtype).index_add_(0, f, joint)
    if average:
        merged = merged / torch.bincount(f, minlength=n_z).clamp_min(1)[:, None].to(joint.dtype)
    return merged


def _ref_processed_information(joint, f):
    """(I(X; Y), I(Z; Y)) in nats for Z = f(X), f an integer tensor giving z = f[x] ∈ {0, …, max f}."""
    n_z = int(f.max()) + 1
    return torch.stack([info.mutual_information(joint), info.mutual_information(_merge_rows(joint, f, n_z))])


def _dpi_slips(joint, f, expected) -> list:
    """What the typical slips compute on one case, each with its hint."""
    n_z = int(f.max()) + 1
    i_x, i_z = expected
    slips = [(torch.stack([i_x, i_x]), " — the second value equals the first: Z = f(X) merges the rows x with the "
                                       "same f(x), p(z, y) = Σ_{x: f(x) = z} p(x, y); compute I(Z; Y) from that table"),
             (torch.stack([i_z, i_x]), " — the order: first I(X; Y), then I(Z; Y)"),
             (expected / math.log(2), " — that is in bits (log base 2); use the natural log for nats")]
    avg = _merge_rows(joint, f, n_z, average=True)
    slips.append((torch.stack([i_x, info.mutual_information(avg / avg.sum())]),
                  " — add the merged rows' probabilities (the events x with f(x) = z are disjoint); averaging them "
                  "and renormalising weights each x wrongly"))
    if joint.shape[0] == joint.shape[1]:
        cols = _merge_rows(joint.T, f, n_z).T
        slips.append((torch.stack([i_x, info.mutual_information(cols)]),
                      " — f acts on X, the rows of the table (joint[x, y]); you merged the columns (Y)"))
    return slips


def check_processed_information(fn) -> CheckResult:
    """``fn(joint (n_x, n_y), f (n_x,) int) -> tensor([I(X; Y), I(f(X); Y)])`` in nats."""
    g = generator(9)
    proportional = torch.tensor([[0.10, 0.05, 0.05], [0.05, 0.20, 0.05], [0.20, 0.10, 0.10], [0.05, 0.05, 0.00]],
                                dtype=torch.float64)  # rows 0 and 2 give the same p(y | x): merging them loses nothing
    cases = [
        {"joint": torch.softmax(torch.randn(9, generator=g, dtype=torch.float64) * 2, 0).view(3, 3),
         "f": torch.tensor([1, 0, 1])},
        {"joint": torch.softmax(torch.randn(12, generator=g, dtype=torch.float64) * 2, 0).view(4, 3),
         "f": torch.tensor([0, 0, 1, 1])},
        {"joint": proportional, "f": torch.tensor([0, 1, 0, 2])},
        {"joint": torch.softmax(torch.randn(10, generator=g, dtype=torch.float64), 0).view(5, 2),
         "f": torch.zeros(5, dtype=torch.long)},  # a constant f: I(Z; Y) = 0
        {"joint": torch.softmax(torch.randn(12, generator=g, dtype=torch.float64), 0).view(3, 4),
         "f": torch.tensor([2, 0, 1])},  # a relabelling: nothing lost
    ]
    slips = [(e := _ref_processed_information(**c), _dpi_slips(c["joint"], c["f"], e)) for c in cases]
    return check_function("processed_information", fn, _ref_processed_information, cases,
                          compare=_compare_mi_with(slips))


# ---------------------------------------------------------------- 7. softmax maximises score plus entropy
_T = sp.Symbol("T", positive=True)
_Z = {n: sp.symbols(f"z_1:{n + 1}") for n in (2, 3)}


def _ref_maxent_distribution(z, T):
    """argmax_p Σ pᵢzᵢ + T·H(p) subject to Σ pᵢ = 1: pᵢ = e^{zᵢ/T} / Σⱼ e^{zⱼ/T} = softmax(z/T)ᵢ."""
    weights = [sp.exp(zi / T) for zi in z]
    return sp.Matrix([w / sum(weights) for w in weights])


def _softmax_of(scores):
    weights = [sp.exp(s) for s in scores]
    return sp.Matrix([w / sum(weights) for w in weights])


def check_maxent_distribution(fn) -> CheckResult:
    """``fn(z (tuple of n SymPy symbols), T (positive symbol)) -> the n probabilities`` (a list or a column
    Matrix) that maximise Σ pᵢzᵢ + T·H(p) over distributions p."""
    cases = [{"z": _Z[n], "T": _T} for n in (2, 3)]
    hints = [(lambda z, T: _softmax_of(z), "the entropy is weighted by T: the maximiser is softmax(z/T); "
                                           "softmax(z) is the case T = 1"),
             (lambda z, T: _softmax_of([zi * T for zi in z]), "divide the scores by T, do not multiply: "
                                                              "stationarity gives zᵢ − T(log pᵢ + 1) − λ = 0"),
             (lambda z, T: _softmax_of([-zi / T for zi in z]), "the sign: we maximise Σ pᵢzᵢ, so larger zᵢ must "
                                                               "get more probability"),
             (lambda z, T: sp.Matrix([sp.exp(zi / T) for zi in z]), "normalise: the multiplier λ is fixed by the "
                                                                    "constraint Σ pᵢ = 1"),
             (lambda z, T: sp.Matrix([sp.exp(zi / T - 1) for zi in z]), "that is the stationarity condition with "
                                                                        "λ = 0; λ is fixed by Σ pᵢ = 1"),
             (lambda z, T: sp.Matrix([sp.Integer(1) / len(z)] * len(z)), "the uniform distribution maximises H(p) "
                                                                         "alone (the limit T → ∞); the score term "
                                                                         "favours large zᵢ")]
    return check_expression("maxent_distribution", fn, _ref_maxent_distribution, cases, hints=hints)


# ---------------------------------------------------------------- 8. nats, bits, bits per character, perplexity
def _ref_loss_units(loss, tokens_per_char):
    """(bits per character, perplexity per token, perplexity per character) of a loss in nats per token: nats per
    character = loss · tokens_per_char; bits = nats / ln 2; perplexity = e^nats = 2^bits."""
    per_char = loss * tokens_per_char  # nats per character
    return per_char / math.log(2), torch.exp(loss), torch.exp(per_char)


def _units_slips(loss, tokens_per_char) -> list:
    """What the typical slips compute on one case, as ``(item, value, hint)``."""
    per_char = loss * tokens_per_char
    return [(0, loss / math.log(2), "that is bits per *token*: a token covers tokens_per_char⁻¹ characters, so "
                                    "first convert to nats per character, loss · tokens_per_char"),
            (0, loss / tokens_per_char / math.log(2), "per character means loss · tokens_per_char (tokens per "
                                                      "character < 1 for tokens longer than a character), not ÷"),
            (0, per_char / math.log(10), "bits use log base 2: divide the nats by ln 2, not by ln 10"),
            (0, per_char * math.log(2), "bits = nats / ln 2 (1 bit = ln 2 ≈ 0.693 nats), not nats · ln 2"),
            (0, per_char, "those are still nats per character: divide by ln 2 for bits"),
            (1, 2 ** loss, "the loss is in nats, so the perplexity is e^loss; 2^x is for a loss in bits"),
            (1, 10 ** loss, "the loss is in nats, so the perplexity is e^loss, not 10^loss"),
            (2, torch.exp(loss), "that is the perplexity per token; per character it is e^(loss · tokens_per_char)"),
            (2, torch.exp(loss / tokens_per_char), "per character the exponent is loss · tokens_per_char, not "
                                                   "loss / tokens_per_char"),
            (2, 2 ** per_char, "the nats per character need e^x: 2^x takes bits (2^bpc is the same number)")]


def check_loss_units(fn) -> CheckResult:
    """``fn(loss (n,) nats per token, tokens_per_char: float) -> (bits per character, perplexity per token,
    perplexity per character)``, each (n,)."""
    gen = generator(17)
    def losses(n, centre, scale):
        return centre + scale * torch.randn(n, generator=gen, dtype=torch.float64).abs()

    cases = [dict(loss=torch.tensor([math.log(64), math.log(2), 0.0], dtype=torch.float64), tokens_per_char=1.0),
             dict(loss=losses(4, 2.5, 0.5), tokens_per_char=0.25),  # a sub-word model: 4 characters a token
             dict(loss=losses(3, 1.0, 1.0), tokens_per_char=float(0.2 + 0.3 * torch.rand(1, generator=gen)))]
    slips = [(_ref_loss_units(**c)[0], _units_slips(**c)) for c in cases]
    names = ("bits per character", "perplexity per token", "perplexity per character")

    def compare(got, expected):
        if not isinstance(got, tuple | list) or len(got) != 3:
            return (f"return a tuple of 3 tensors ({', '.join(names)}), got "
                    f"{type(got).__name__}{f' of {len(got)} items' if isinstance(got, tuple | list) else ''}")
        case = next(i for i, (e, _) in enumerate(slips) if torch.equal(e, expected[0]))
        for i, (g, e) in enumerate(zip(got, expected, strict=True)):
            msg = describe_difference(g, e, atol=1e-9, rtol=1e-9, what=f"output[{i}] ({names[i]})")
            if msg:
                hint = next((h for item, value, h in slips[case][1] if item == i and _slip_hint(g, [(value, h)])),
                            "")
                return msg + (f"; hint: {hint}" if hint else _close_hint(g, e))
        return None

    return check_function("loss_units", fn, _ref_loss_units, cases, compare=compare)


EXERCISES = {
    "cross_entropy_from_logits": check_cross_entropy_from_logits,
    "kl_div": check_kl_div,
    "mutual_information": check_mutual_information,
    "bigram_entropy": check_bigram_entropy,
    "head_entropy": check_head_entropy,
    "processed_information": check_processed_information,
    "maxent_distribution": check_maxent_distribution,
    "loss_units": check_loss_units,
}
