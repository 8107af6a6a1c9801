"""Chapter 5 exercise checkers: each accepts the solution and correct alternatives in other styles, and rejects the
typical wrong answers (CATALOGUE) with a message that says what differs and, where it can, why."""

from __future__ import annotations

import itertools
import math
from collections import Counter, defaultdict

import numpy as np
import pytest
import sympy as sp
import torch
import torch.nn.functional as F
from conftest import assert_accepted, assert_rejected, right_answers, wrong_answers

from transformer_lab import information as info
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


def head_entropy(weights):
    return -torch.special.xlogy(weights, weights).sum(dim=-1)


def mutual_information(joint):
    px, py = joint.sum(dim=1), joint.sum(dim=0)  # p(x), p(y)
    h_y = -torch.special.xlogy(py, py).sum()  # H(Y)
    h_y_given_x = -(torch.special.xlogy(joint, joint).sum() - torch.special.xlogy(px, px).sum())  # H(X,Y) - H(X)
    return h_y - h_y_given_x


def processed_information(joint, f):
    merged = torch.zeros(int(f.max()) + 1, joint.shape[1], dtype=joint.dtype).index_add_(0, f, joint)
    return torch.stack([mutual_information(joint), mutual_information(merged)])


def maxent_distribution(z, T):
    p, lam, u = sp.symbols(f"p1:{len(z) + 1}", positive=True), sp.Symbol("lambda"), sp.Symbol("u")
    lagrangian = (sum(pi * zi for pi, zi in zip(p, z, strict=True)) - T * sum(pi * sp.log(pi) for pi in p)
                  - lam * (sum(p) - 1))
    # ∂/∂pᵢ = zᵢ − T(log pᵢ + 1) − λ = 0 is linear in u = log pᵢ
    stationary = [sp.exp(sp.solve(sp.diff(lagrangian, pi).subs(sp.log(pi), u), u)[0]) for pi in p]
    (lam_value,) = sp.solve(sum(stationary) - 1, lam)  # Σ pᵢ = 1 fixes λ
    return [sp.simplify(pi.subs(lam, lam_value)) for pi in stationary]


def loss_units(loss, tokens_per_char):
    per_char = loss * tokens_per_char  # nats per character
    return per_char / math.log(2), torch.exp(loss), torch.exp(per_char)


SOLUTIONS = {"cross_entropy_from_logits": cross_entropy_from_logits, "kl_div": kl_div,
             "mutual_information": mutual_information, "bigram_entropy": bigram_entropy,
             "head_entropy": head_entropy, "processed_information": processed_information,
             "maxent_distribution": maxent_distribution, "loss_units": loss_units}


# ---------------------------------------------------------------- correct alternatives, in other styles
def _ce_row_loop(logits, targets):  # one row at a time, shift by the row's max
    losses = []
    for z, y in zip(logits, targets, strict=True):
        m = z.max()
        losses.append(m + (z - m).exp().sum().log() - z[y])
    return torch.stack(losses).mean()


def _ce_indexing(logits, targets):  # fancy indexing instead of gather, amax instead of max
    m = logits.amax(-1)
    lse = m + torch.log(torch.sum(torch.exp(logits - m[:, None]), -1))
    return torch.mean(lse - logits[torch.arange(len(targets)), targets])


def _kl_where(p, q):
    return torch.where(p > 0, p * (torch.log(p) - torch.log(q)), torch.zeros_like(p)).sum(-1)


def _kl_torch(p, q):
    return F.kl_div(q.log(), p, reduction="none").sum(-1)


def _mi_kl(joint):  # KL(p(x, y) ‖ p(x) p(y)), the definition
    outer = joint.sum(1, keepdim=True) * joint.sum(0, keepdim=True)
    return torch.where(joint > 0, joint * (joint / outer).log(), torch.zeros_like(joint)).sum()


def _mi_symmetric(joint):  # H(X) - H(X | Y): mutual information is symmetric
    return mutual_information(joint.T)


def _bigram_numpy(text):  # H(X_{t-1}, X_t) - H(X_{t-1}) over the same pairs
    pairs = np.array(list(Counter(text[i:i + 2] for i in range(len(text) - 1)).values()), dtype=float)
    firsts = np.array(list(Counter(text[:-1]).values()), dtype=float)
    n = pairs.sum()
    return float(-(pairs / n * np.log2(pairs / n)).sum() + (firsts / n * np.log2(firsts / n)).sum())


def _bigram_dicts(text):  # P(b | a) as nested dicts
    follow = defaultdict(Counter)
    for i in range(len(text) - 1):
        follow[text[i]][text[i + 1]] += 1
    n = len(text) - 1
    h = 0.0
    for counts in follow.values():
        total = sum(counts.values())
        h -= sum(c / n * math.log2(c / total) for c in counts.values())
    return h


def _bigram_numpy_scalar(text):  # a numpy float64 is a number too
    return np.float64(bigram_entropy(text))


def _head_where(weights):
    return torch.where(weights > 0, -weights * weights.log(), torch.zeros_like(weights)).sum(-1)


def _head_clamped(weights):  # log of a clamped weight: 0 · log(tiny) = 0 exactly
    return -(weights * torch.log(weights.clamp_min(1e-300))).sum(dim=-1)


# ---------------------------------------------------------------- typical wrong answers
def _ce_naive(logits, targets):  # softmax first, log second: overflows on huge logits
    p = torch.exp(logits) / torch.exp(logits).sum(-1, keepdim=True)
    return -torch.log(p[torch.arange(len(targets)), targets]).mean()


def _ce_forgot_max_back(logits, targets):  # shifted, but did not add m back
    m = logits.max(dim=-1, keepdim=True).values
    lse = torch.log(torch.exp(logits - m).sum(dim=-1))
    return (lse - logits.gather(-1, targets[:, None]).squeeze(-1)).mean()


def _ce_mean_shift(logits, targets):  # shift by the mean: e^{1000 - 0} still overflows
    m = logits.mean(dim=-1, keepdim=True)
    lse = m.squeeze(-1) + torch.log(torch.exp(logits - m).sum(dim=-1))
    return (lse - logits.gather(-1, targets[:, None]).squeeze(-1)).mean()


def _ce_global_max(logits, targets):  # one max for the whole batch: a row far below it underflows
    m = logits.max()
    lse = m + torch.log(torch.exp(logits - m).sum(dim=-1))
    return (lse - logits.gather(-1, targets[:, None]).squeeze(-1)).mean()


def _ce_library(logits, targets):
    return F.cross_entropy(logits, targets)


def _ce_logsumexp(logits, targets):
    return (torch.logsumexp(logits, -1) - logits[torch.arange(len(targets)), targets]).mean()


def _ce_module(logits, targets):  # the nn.Module spelling of the same library loss
    return torch.nn.CrossEntropyLoss()(logits, targets)


def _ce_nll(logits, targets):  # a hand-written stable log-softmax, then the library's NLL
    m = logits.max(dim=-1, keepdim=True).values
    return F.nll_loss(logits - m - torch.log(torch.exp(logits - m).sum(-1, keepdim=True)), targets)


def _ce_distribution(logits, targets):  # another torch route to the same library normalisation
    return -torch.distributions.Categorical(logits=logits).log_prob(targets).mean()


_ALIAS_LSE = getattr(torch.special, "logsum" + "exp")  # torch.logsumexp under a name assembled at run time


def _ce_alias(logits, targets):
    return (_ALIAS_LSE(logits, -1) - logits.gather(-1, targets[:, None]).squeeze(-1)).mean()


def _ce_private(logits, targets):  # PyTorch's private entry point, below torch.nn.functional
    return torch._C._nn.cross_entropy_loss(logits, targets)


def _ce_documented(logits, targets):
    """Equals F.cross_entropy(logits, targets), written out: a name in a docstring is not a call."""
    shifted = logits - logits.max(-1, keepdim=True).values  # same as torch.logsumexp(z) - max, by hand
    log_p = shifted - shifted.exp().sum(-1, keepdim=True).log()
    return -log_p.gather(-1, targets[:, None]).mean()


def _mi_conditional(joint):  # returns H(Y | X), not what it removes
    return mutual_information(joint) * 0 + (-(torch.special.xlogy(joint, joint).sum()
                                              - torch.special.xlogy(joint.sum(1), joint.sum(1)).sum()))


def _mi_unweighted(joint):  # H(Y) minus the plain average of the rows' entropies
    py = joint.sum(0)
    rows = joint / joint.sum(1, keepdim=True)
    return -torch.special.xlogy(py, py).sum() + torch.special.xlogy(rows, rows).sum(1).mean()


def _mi_naive_log(joint):  # p log p with p = 0 gives NaN
    px, py = joint.sum(1), joint.sum(0)
    return (joint * (joint / (px[:, None] * py[None, :])).log()).sum()


def _mi_wrong_marginal(joint):  # H(Y | X) as H(X, Y) - H(Y): the marginal of the wrong variable subtracted
    py = joint.sum(0)
    h_y = -torch.special.xlogy(py, py).sum()
    return h_y - (-torch.special.xlogy(joint, joint).sum() - h_y)


def _mi_mixed(joint):  # H(X) - H(Y | X): the marginal of the wrong variable
    px, py = joint.sum(1), joint.sum(0)
    h_x, h_y = -torch.special.xlogy(px, px).sum(), -torch.special.xlogy(py, py).sum()
    return h_x - (h_y - mutual_information(joint))


def _bigram_len_text(text):  # N = len(text) instead of the number of pairs
    return bigram_entropy(text) * (len(text) - 1) / len(text)


def _bigram_backwards(text):  # H(X_{t-1} | X_t): conditioned on the second character
    pairs = Counter(itertools.pairwise(text))
    second = Counter()
    for (_, b), c in pairs.items():
        second[b] += c
    n = sum(pairs.values())
    return -sum(c / n * math.log2(c / second[b]) for (_, b), c in pairs.items())


def _bigram_per_context_mean(text):  # the contexts' entropies averaged, not weighted by c(a) / N
    follow = defaultdict(Counter)
    for a, b in itertools.pairwise(text):
        follow[a][b] += 1
    hs = [-sum(c / sum(cs.values()) * math.log2(c / sum(cs.values())) for c in cs.values()) for cs in follow.values()]
    return sum(hs) / len(hs)


def _bigram_joint(text):  # H(X_{t-1}, X_t) instead of the conditional
    pairs = Counter(itertools.pairwise(text))
    n = sum(pairs.values())
    return -sum(c / n * math.log2(c / n) for c in pairs.values())


def _bigram_unigram(text):
    counts = Counter(text)
    return -sum(c / len(text) * math.log2(c / len(text)) for c in counts.values())


def _bigram_circular(text):  # reads the text as a circle, like the package's ngram_entropy_bits
    return bigram_entropy(text + text[0])


def _bigram_all_first_chars(text):  # c(a) counted over the whole text, not over the pairs' first characters
    pairs = Counter(itertools.pairwise(text))
    first = Counter(text)
    n = sum(pairs.values())
    return -sum(c / n * math.log2(c / first[a]) for (a, _), c in pairs.items())


def dpi_loops(joint, f):  # plain Python: the merged table by loops, I = Σ p log(p / (p_x p_y))
    def mi(table):
        px, py = table.sum(1), table.sum(0)
        return sum(table[i, j] * math.log(table[i, j] / (px[i] * py[j]))
                   for i in range(table.shape[0]) for j in range(table.shape[1]) if table[i, j] > 0)
    n_z = int(f.max()) + 1
    merged = torch.zeros(n_z, joint.shape[1], dtype=torch.float64)
    for x, z in enumerate(f.tolist()):
        merged[z] += joint[x]
    return torch.tensor([float(mi(joint)), float(mi(merged))], dtype=torch.float64)


def dpi_one_hot(joint, f):  # merging is a product with the one-hot matrix of f: p(z, y) = Fᵀ p(x, y)
    onehot = F.one_hot(f).to(joint.dtype)  # (n_x, n_z)
    return torch.stack([info.mutual_information(joint), info.mutual_information(onehot.T @ joint)])


def dpi_not_merged(joint, f):
    return torch.stack([info.mutual_information(joint)] * 2)


def dpi_swapped(joint, f):
    return processed_information(joint, f).flip(0)


def dpi_bits(joint, f):
    return processed_information(joint, f) / math.log(2)


def dpi_averaged(joint, f):
    n_z = int(f.max()) + 1
    merged = torch.zeros(n_z, joint.shape[1], dtype=joint.dtype).index_add_(0, f, joint)
    merged = merged / torch.bincount(f, minlength=n_z)[:, None]
    return torch.stack([info.mutual_information(joint), info.mutual_information(merged / merged.sum())])


def dpi_columns(joint, f):
    merged = torch.zeros(joint.shape[0], int(f.max()) + 1, dtype=joint.dtype).index_add_(1, f, joint)
    return torch.stack([info.mutual_information(joint), info.mutual_information(merged)])


def maxent_closed(z, T):
    return [1 / sum(sp.exp((zj - zi) / T) for zj in z) for zi in z]


def maxent_logsumexp(z, T):  # plain symbols, pᵢ = exp(zᵢ/T − log Σⱼ exp(zⱼ/T))
    z, T = [sp.Symbol(str(zi)) for zi in z], sp.Symbol("T")
    return sp.Matrix([sp.exp(zi / T - sp.log(sum(sp.exp(zj / T) for zj in z))) for zi in z])


def units_via_bits(loss, tokens_per_char):  # bits per token first, then per character; perplexity as 2^bits
    bits_per_token = loss / math.log(2)
    bpc = bits_per_token * tokens_per_char
    return bpc, 2 ** bits_per_token, 2 ** bpc


def units_numpy(loss, tokens_per_char):
    nats = loss.numpy()
    return (torch.from_numpy(nats * tokens_per_char * np.log2(np.e)), torch.from_numpy(np.exp(nats)),
            torch.from_numpy(np.exp(nats) ** tokens_per_char))


def _units(bpc=None, ppl_token=None, ppl_char=None):
    """``loss_units`` with some of its three outputs replaced by a slip f(loss, tokens_per_char)."""
    def fn(loss, tokens_per_char):
        right = loss_units(loss, tokens_per_char)
        return tuple(right[i] if slip is None else slip(loss, tokens_per_char)
                     for i, slip in enumerate((bpc, ppl_token, ppl_char)))
    return fn


CATALOGUE = {
    "loss_units": {
        "wrong": [
            (_units(bpc=lambda n, r: n / math.log(2)), ["on case 2", "output[0] (bits per character)",
                                                        "bits per *token*"]),
            (_units(bpc=lambda n, r: n / r / math.log(2)), ["on case 2", "loss · tokens_per_char", "not ÷"]),
            (_units(bpc=lambda n, r: n * r / math.log(10)), ["output[0]", "not by ln 10"]),
            (_units(bpc=lambda n, r: n * r * math.log(2)), ["output[0]", "not nats · ln 2"]),
            (_units(bpc=lambda n, r: n * r), ["output[0]", "still nats per character"]),
            (_units(ppl_token=lambda n, r: 2 ** n), ["output[1] (perplexity per token)", "e^loss"]),
            (_units(ppl_token=lambda n, r: 10 ** n), ["output[1]", "not 10^loss"]),
            (_units(ppl_char=lambda n, r: torch.exp(n)), ["on case 2", "output[2] (perplexity per character)",
                                                          "that is the perplexity per token"]),
            (_units(ppl_char=lambda n, r: torch.exp(n / r)), ["output[2]", "not loss / tokens_per_char"]),
            (_units(ppl_char=lambda n, r: 2 ** (n * r)), ["output[2]", "need e^x"]),
            (_units(ppl_char=lambda n, r: (n * r / math.log(2)).float().exp2()), ["output[2]", "torch.float32"]),
            (lambda n, r: torch.stack(loss_units(n, r)), ["return a tuple of 3 tensors", "got Tensor"]),
        ],
        "right": [units_via_bits, units_numpy],
    },
    "processed_information": {
        "wrong": [(dpi_not_merged, ["differs", "merges the rows"]),
                  (dpi_swapped, ["differs", "the order"]),
                  (dpi_bits, ["differs", "in bits"]),
                  (dpi_averaged, ["differs", "add the merged rows"]),
                  (dpi_columns, ["differs", "case 1", "you merged the columns"]),
                  (lambda joint, f: (dpi_one_hot(joint, f)[0], dpi_one_hot(joint, f)[1]), ["should be a Tensor"])],
        "right": [dpi_loops, dpi_one_hot],
    },
    "maxent_distribution": {
        "wrong": [(lambda z, T: [sp.exp(zi) / sum(sp.exp(zj) for zj in z) for zi in z], ["softmax(z/T)"]),
                  (lambda z, T: [sp.exp(zi * T) / sum(sp.exp(zj * T) for zj in z) for zi in z], ["do not multiply"]),
                  (lambda z, T: [sp.exp(-zi / T) / sum(sp.exp(-zj / T) for zj in z) for zi in z], ["the sign"]),
                  (lambda z, T: [sp.exp(zi / T) for zi in z], ["normalise"]),
                  (lambda z, T: [sp.exp(zi / T - 1) for zi in z], ["λ = 0"]),
                  (lambda z, T: [sp.Rational(1, len(z))] * len(z), ["uniform distribution"]),
                  (lambda z, T: sp.exp(z[0] / T) / sum(sp.exp(zj / T) for zj in z), ["should be a 2×1 matrix"]),
                  (lambda z, T: [sp.exp(zi / T) / sum(sp.exp(zj / T) for zj in z) for zi in z[:-1]],
                   ["shape (1, 1), expected (2, 1)"])],
        "right": [maxent_closed, maxent_logsumexp],
    },
    "cross_entropy_from_logits": {
        "wrong": [
            (_ce_naive, ["case 4", "exp overflowed", "subtract each row's max"]),
            (lambda logits, targets: cross_entropy_from_logits(logits, targets) * len(targets),
             ["differs", "case 1", "4 times the answer", "return the mean"]),
            (lambda logits, targets: -cross_entropy_from_logits(logits, targets), ["expected", "sign is flipped"]),
            (lambda logits, targets: cross_entropy_from_logits(logits, targets) / math.log(2), ["in bits"]),
            (_ce_forgot_max_back, ["differs", "case 1", "not added back", "add m back after the log"]),
            (_ce_mean_shift, ["case 4", "exp overflowed"]),
            (_ce_global_max, ["case 5", "underflowed", "its own max"]),
            (_ce_library, ["ForbiddenCall", "F.cross_entropy", "write yourself"]),
            (_ce_logsumexp, ["ForbiddenCall", "torch.logsumexp"]),
            (_ce_module, ["ForbiddenCall", "F.cross_entropy"]),
            (_ce_nll, ["ForbiddenCall", "F.nll_loss"]),
            (_ce_distribution, ["ForbiddenCall", "torch.logsumexp"]),
            (_ce_alias, ["ForbiddenCall", "torch.logsumexp"]),
            (_ce_private, ["ForbiddenCall", "F.cross_entropy"]),
            (lambda logits, targets: (cross_entropy_from_logits(logits[i:i + 1], targets[i:i + 1])
                                      for i in range(len(targets))), ["should be a Tensor", "got generator"]),
            (lambda logits, targets: torch.stack([cross_entropy_from_logits(logits[i:i + 1], targets[i:i + 1])
                                                  for i in range(len(targets))]),
             ["shape (4,), expected ()", "return the mean over the rows"]),
        ],
        "right": [_ce_row_loop, _ce_indexing, _ce_documented],
    },
    "kl_div": {
        "wrong": [
            (lambda p, q: kl_div(q, p), ["differs", "KL(q ‖ p)", "the order of p and q matters"]),
            (lambda p, q: kl_div(p, q).float(), ["differs", "torch.float32", "keep the inputs' torch.float64"]),
            (lambda p, q: (p * torch.log((p + 1e-9) / (q + 1e-9))).sum(-1), ["differs", "eps inside the log"]),
            (lambda p, q: (p * torch.log(p / q)).sum(-1), ["NaN", "case 3", "xlogy"]),
            (lambda p, q: kl_div(p, q) / math.log(2), ["worst at", "in bits"]),
            (lambda p, q: (torch.special.xlogy(p, q) - torch.special.xlogy(p, p)).sum(-1), ["never negative"]),
            (lambda p, q: (torch.special.xlogy(p, p) - torch.special.xlogy(p, q)).mean(-1),
             ["differs", "1/6 of the answer", "do not average"]),
            (lambda p, q: (torch.special.xlogy(p, p) - torch.special.xlogy(p, q)).sum(), ["case 2", "shape ()"]),
            (lambda p, q: -torch.special.xlogy(p, q).sum(-1), ["differs", "the cross-entropy H(p, q)",
                                                               "subtract H(p)"]),
            (lambda p, q: torch.zeros(p.shape[:-1], dtype=p.dtype), ["differs", "case 1"]),  # used to crash a hint
            (lambda p, q: torch.nan_to_num((p * (p.log() - q.log())).sum(-1)), ["differs", "case 3"]),
            (lambda p, q: (torch.special.xlogy(p, p) - torch.special.xlogy(p, q.clamp_min(1e-12))).sum(-1),
             ["case 5", "q_i = 0 < p_i", "KL(p ‖ q) = +inf", "not a finite number", "do not clamp q"]),
            (lambda p, q: torch.where((p > 0) & (q > 0), p * (p / q).log(), torch.zeros_like(p)).sum(-1),
             ["case 5", "+inf", "not a finite number", "drop the terms"]),  # skips the terms where q = 0
            (lambda p, q: torch.nan_to_num(kl_div(p, q), posinf=0.0), ["case 5", "not a finite number"]),
            (lambda p, q: kl_div(p, q).where(kl_div(p, q).isfinite(), torch.tensor(math.nan, dtype=p.dtype)),
             ["case 5", "NaN", "+inf", "not NaN"]),  # an undefined divergence reported as NaN
        ],
        "right": [_kl_where, _kl_torch],
    },
    "mutual_information": {
        "wrong": [
            (_mi_conditional, ["differs", "that is H(Y | X)"]),
            (lambda joint: -mutual_information(joint), ["sign is flipped"]),
            (lambda joint: mutual_information(joint) / math.log(2), ["in bits"]),
            (_mi_unweighted, ["weights each row's entropy", "by p(x)"]),
            (_mi_naive_log, ["NaN", "case 3", "xlogy"]),  # the zeros off the diagonal
            (lambda joint: -torch.special.xlogy(joint.sum(0), joint.sum(0)).sum(), ["that is H(Y) alone"]),
            (_mi_mixed, ["differs", "case 1"]),
            (_mi_wrong_marginal, ["differs", "H(X, Y) - H(X)", "the variable you condition on"]),
        ],
        "right": [_mi_kl, _mi_symmetric],
    },
    "bigram_entropy": {
        "wrong": [
            (_bigram_joint, ["expected 0 (", "joint entropy H(X_{t-1}, X_t)"]),  # "abababab": b always follows a
            (lambda text: bigram_entropy(text) * math.log(2), ["nats", "divide by ln 2"]),
            (_bigram_unigram, ["bits/char"]),
            (lambda text: "1.0", ["should be a number"]),
            (_bigram_circular, ["bits/char", "expected", "as a circle", "don't wrap around"]),
            (lambda text: info.ngram_entropy_bits(text, 2), ["information.ngram_entropy_bits", "don't wrap around"]),
            (_bigram_all_first_chars, ["bits/char", "over the pairs' first characters", "starts no pair"]),
            (lambda text: float("nan"), ["got nan bits/char"]),
            (_bigram_len_text, ["number of pairs, len(text) - 1"]),
            (_bigram_backwards, ["H(X_{t-1} | X_t)"]),
            (_bigram_per_context_mean, ["weighted by how often it occurs"]),
            (lambda text: np.float32(bigram_entropy(text)), ["a float32 keeps about 7 digits",
                                                             "return a Python float"]),
        ],
        "right": [_bigram_numpy, _bigram_dicts, _bigram_numpy_scalar],
    },
    "head_entropy": {
        "wrong": [
            (lambda w: -(w * w.log()).sum(-1), ["NaN", "case 2", "xlogy"]),  # 0 · log 0 on a masked key
            (lambda w: torch.special.xlogy(w, w).sum(-1), ["sign is flipped"]),
            (lambda w: -torch.special.xlogy(w, w).sum(-1) / math.log(2), ["in bits"]),
            (lambda w: -torch.special.xlogy(w, w).sum(-2), ["case 1", "sums over the queries",
                                                            "the last dimension"]),
            (lambda w: -torch.special.xlogy(w, w).sum(-1).float(), ["torch.float32"]),
            (lambda w: -(w * torch.log(w + 1e-9)).sum(-1), ["differs", "eps inside the log"]),
            (lambda w: -torch.special.xlogy(w, w).mean(-1), ["differs", "1/4 of the answer", "do not average"]),
            (lambda w: -(w * torch.log(w / w.sum(-1, keepdim=True))).nan_to_num(0.0).sum(-1)
             + torch.where(w.sum(-1) == 0, float("nan"), 0.0), ["NaN", "case 4"]),  # NaN on the all-zero row
            (lambda w: torch.nan_to_num(-(w * w.log()).sum(-1)), ["differs", "case 2"]),  # used to crash a hint
            (lambda w: torch.zeros(w.shape[:-1], dtype=w.dtype), ["differs", "case 1"]),
        ],
        "right": [_head_where, _head_clamped],
    },
}


def test_registry():
    assert set(registry(5)) == set(SOLUTIONS) == set(CATALOGUE)


@pytest.mark.parametrize("name", sorted(SOLUTIONS))
def test_solution_passes(name):
    result = ch5.EXERCISES[name](SOLUTIONS[name])
    assert result.passed, result.message


def test_stub_reports_not_written():
    def kl_div(p, q):
        raise NotImplementedError

    assert_rejected(ch5.check_kl_div, kl_div, "not written yet")


def test_head_entropy_cases_hold_a_fully_masked_row():
    """The last case is attention's own output for a query that may see no key: a row of zeros, entropy 0."""
    result = ch5.check_head_entropy(lambda w: -torch.special.xlogy(w, w).sum(-1).nan_to_num(0.0))
    assert result.passed, result.message


@pytest.mark.parametrize(("name", "wrong", "words"), wrong_answers(CATALOGUE))
def test_typical_wrong_answer_rejected(name, wrong, words):
    assert_rejected(ch5.EXERCISES[name], wrong, *words)


@pytest.mark.parametrize(("name", "right"), right_answers(CATALOGUE))
def test_correct_alternative_accepted(name, right):
    assert_accepted(ch5.EXERCISES[name], right)


_STRANGE = {"zeros": torch.zeros, "inf": lambda *shape, dtype: torch.full(shape, math.inf, dtype=dtype),
            "huge": lambda *shape, dtype: torch.full(shape, 1e308, dtype=dtype),
            "tiny": lambda *shape, dtype: torch.full(shape, 1e-320, dtype=dtype),
            "complex": lambda *shape, dtype: torch.zeros(shape, dtype=torch.complex128)}


@pytest.mark.parametrize("name", sorted(set(SOLUTIONS) - {"maxent_distribution"}))  # a SymPy answer: no numbers
@pytest.mark.parametrize("strange", sorted(_STRANGE))
def test_strange_answers_are_rejected_never_crash(name, strange):
    """A hint is read off the student's numbers: on zeros, inf, 1e308, subnormals or complex it must not raise."""
    make = _STRANGE[strange]

    def answer(*args):
        expected = SOLUTIONS[name](*args)
        shape = expected.shape if isinstance(expected, torch.Tensor) else ()
        return make(*shape, dtype=torch.float64)

    result = ch5.EXERCISES[name](answer)  # must return, not raise
    assert not result.passed, result.message
