"""Chapter 2 exercise checkers: each accepts the reference solution and correct alternatives written in another
style, and rejects the typical wrong answers of CATALOGUE with a message that says what differs."""

import math

import numpy as np
import pytest
import torch
from conftest import assert_accepted, assert_rejected, right_answers, wrong_answers

from transformer_lab.exercises import ch2, registry

# ---- the solutions shown in the chapter ----------------------------------------------------------------------


def stable_softmax(z):
    e = torch.exp(z - z.amax(dim=-1, keepdim=True))
    return e / e.sum(dim=-1, keepdim=True)


def top_p_filter(logits, top_p):
    sorted_z, order = torch.sort(logits, dim=-1, descending=True)
    p = torch.softmax(sorted_z, dim=-1)
    drop_sorted = (torch.cumsum(p, dim=-1) - p) >= top_p
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def sequence_log_prob(logits, tokens):
    logp = torch.log_softmax(logits, dim=-1)
    return logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1).sum(-1)


# ---- stable_softmax ------------------------------------------------------------------------------------------


def _shifted_softmax(shift):
    def fn(z):
        e = torch.exp(z - shift(z))
        return e / e.sum(-1, keepdim=True)
    return fn


def _softmax_via_logsumexp(z):  # right: exp(z - logsumexp(z)), logsumexp is stable
    return torch.exp(z - torch.logsumexp(z, dim=-1, keepdim=True))


def _softmax_numpy(z):  # right: NumPy, with the max shift
    a = z.numpy()
    e = np.exp(a - a.max(axis=-1, keepdims=True))
    return torch.from_numpy(e / e.sum(axis=-1, keepdims=True))


def _softmax_by_rows(z):  # right: one row at a time, in Python, with the max shift
    rows = z.reshape(-1, z.shape[-1])
    out = []
    for row in rows:
        m = max(row.tolist())
        e = [math.exp(v - m) for v in row.tolist()]
        out.append([v / sum(e) for v in e])
    return torch.tensor(out, dtype=z.dtype).reshape(z.shape)


# ---- top_p_filter --------------------------------------------------------------------------------------------


def _cum_including_self(logits, top_p):  # drops the token that crosses p: may remove everything
    sorted_z, order = torch.sort(logits, dim=-1, descending=True)
    drop_sorted = torch.cumsum(torch.softmax(sorted_z, -1), -1) > top_p
    return logits.masked_fill(torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted), float("-inf"))


def _unsorted(logits, top_p):  # forgets to sort
    p = torch.softmax(logits, -1)
    return logits.masked_fill((torch.cumsum(p, -1) - p) >= top_p, float("-inf"))


def _strict_boundary(logits, top_p):  # keeps a token while the mass above it is <= p: one token too many at = p
    sorted_z, order = torch.sort(logits, dim=-1, descending=True)
    p = torch.softmax(sorted_z, dim=-1)
    drop_sorted = (torch.cumsum(p, dim=-1) - p) > top_p
    return logits.masked_fill(torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted), float("-inf"))


def _sorted_order_returned(logits, top_p):  # forgets to put the result back in vocabulary order
    sorted_z, _ = torch.sort(logits, dim=-1, descending=True)
    p = torch.softmax(sorted_z, dim=-1)
    return sorted_z.masked_fill((torch.cumsum(p, dim=-1) - p) >= top_p, float("-inf"))


def _top_p_by_count(logits, top_p):  # right: the nucleus size k per row, then keep logits >= the k-th largest
    p = torch.softmax(logits, -1)
    sorted_p = torch.sort(p, dim=-1, descending=True).values
    k = ((torch.cumsum(sorted_p, -1) - sorted_p) < top_p).sum(-1, keepdim=True)  # tokens needed to reach p
    kth = torch.gather(torch.sort(logits, dim=-1, descending=True).values, -1, k - 1)
    return torch.where(logits >= kth, logits, -torch.inf)


def _top_p_loop(logits, top_p):  # right: a Python loop over each row
    rows = logits.reshape(-1, logits.shape[-1])
    out = torch.full_like(rows, -math.inf)
    for r, row in enumerate(rows):
        probs = torch.softmax(row, -1)
        mass = 0.0
        for i in torch.argsort(probs, descending=True).tolist():
            if mass >= top_p:
                break
            out[r, i] = row[i]
            mass += float(probs[i])
    return out.reshape(logits.shape)


# ---- sequence_log_prob ---------------------------------------------------------------------------------------


def _picked(logp, tokens):
    return logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def _shifted_alignment(logits, tokens):  # treats logits[t] as predicting tokens[t + 1] (already aligned here)
    return _picked(torch.log_softmax(logits[..., :-1, :], -1), tokens[..., 1:]).sum(-1)


def _seq_by_logsumexp(logits, tokens):  # right: z_y - logsumexp(z), summed
    picked = logits.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    return (picked - torch.logsumexp(logits, dim=-1)).sum(-1)


def _seq_by_cross_entropy(logits, tokens):  # right: minus F.cross_entropy without reduction
    V = logits.shape[-1]
    nll = torch.nn.functional.cross_entropy(logits.reshape(-1, V), tokens.reshape(-1), reduction="none")
    return -nll.reshape(tokens.shape).sum(-1)


# ---- chi_square_statistic -----------------------------------------------------------------------------------


def chi_square_statistic(counts, probs):
    n = counts.sum(-1, keepdim=True)
    expected = n * probs
    keep = probs > 0
    return torch.where(keep, (counts - expected) ** 2 / torch.where(keep, expected, 1.0), 0.0).sum(-1)


def _chi2_loop(counts, probs):  # right: plain Python over the rows
    c2, p2 = counts.reshape(-1, counts.shape[-1]).tolist(), probs.reshape(-1, probs.shape[-1]).tolist()
    out = [sum((o - sum(c) * p) ** 2 / (sum(c) * p) for o, p in zip(c, q, strict=True) if p > 0)
           for c, q in zip(c2, p2, strict=True)]
    return torch.tensor(out, dtype=torch.float64).reshape(counts.shape[:-1])


def _chi2_expanded(counts, probs):  # right: X² = Σ O²/E - N over the tokens with p > 0 (counts there are 0 anyway)
    n = counts.sum(-1, keepdim=True).double()
    e = n * probs
    return torch.where(probs > 0, counts.double() ** 2 / torch.where(probs > 0, e, 1.0), 0.0).sum(-1) - n[..., 0]


def _chi2_unmasked(counts, probs):  # divides by E = 0 for a removed token: 0/0 = NaN
    e = counts.sum(-1, keepdim=True) * probs
    return ((counts - e) ** 2 / e).sum(-1)


def _chi2_batch_n(counts, probs):  # N of the whole batch, not of each row
    e = counts.sum() * probs
    keep = probs > 0
    return torch.where(keep, (counts - e) ** 2 / torch.where(keep, e, 1.0), 0.0).sum(-1)


def _chi2_frequencies(counts, probs):  # frequencies instead of counts: X² / N
    f = counts / counts.sum(-1, keepdim=True)
    keep = probs > 0
    return torch.where(keep, (f - probs) ** 2 / torch.where(keep, probs, 1.0), 0.0).sum(-1)


def _chi2_neyman(counts, probs):  # divides by the observed count instead of the expected one
    e = counts.sum(-1, keepdim=True) * probs
    keep = probs > 0
    return torch.where(keep, (counts - e) ** 2 / torch.where(keep, counts.clamp_min(1), 1), 0.0).sum(-1)


CATALOGUE = {
    "stable_softmax": {
        "wrong": [
            (lambda z: torch.exp(z) / torch.exp(z).sum(-1, keepdim=True), ["NaN", "case 3", "overflows"]),  # naive
            (lambda z: torch.exp(z - z.max()) / torch.exp(z - z.max()).sum(-1, keepdim=True),
             ["NaN", "case 5", "each row's own maximum"]),  # one max for the whole batch
            (_shifted_softmax(lambda z: z.amin(-1, keepdim=True)), ["NaN", "case 7", "minimum, mean or first"]),
            (_shifted_softmax(lambda z: z.mean(-1, keepdim=True)), ["NaN", "case 7", "minimum, mean or first"]),
            (_shifted_softmax(lambda z: z[..., :1]), ["NaN", "case 7", "minimum, mean or first"]),
            (lambda z: stable_softmax(z.T).T if z.dim() > 1 else stable_softmax(z), ["differs in", "case 2"]),
            (lambda z: stable_softmax(z).sum(-1), ["shape"]),
        ],
        "right": [_softmax_numpy, _softmax_via_logsumexp, _softmax_by_rows],
    },
    "top_p_filter": {
        "wrong": [
            (_cum_including_self, ["differs in", "case 1"]),
            (_unsorted, ["differs in", "case 2", "sort by probability"]),
            (lambda logits, top_p: torch.where(torch.softmax(logits, -1) >= 1 - top_p, logits, -torch.inf),
             ["differs"]),
            (_strict_boundary, ["differs in 1 of 4", "case 6", "not 3"]),
            (_sorted_order_returned, ["differs in", "case 2"]),
        ],
        "right": [_top_p_by_count, _top_p_loop],
    },
    "sequence_log_prob": {
        "wrong": [
            (lambda logits, tokens: _picked(torch.softmax(logits, -1), tokens).prod(-1),
             ["differs in", "case 1", "do not multiply"]),  # a probability, not a log-probability
            (lambda logits, tokens: _picked(torch.log(torch.exp(logits) / torch.exp(logits).sum(-1, keepdim=True)),
                                            tokens).sum(-1), ["case 3"]),  # naive: -inf / NaN on huge logits
            (lambda logits, tokens: _picked(torch.log(torch.softmax(logits, -1)), tokens).sum(-1),
             ["case 5", "-inf", "log_softmax"]),  # log of a probability that rounded to 0
            (lambda logits, tokens: sequence_log_prob(logits, tokens).mean() if logits.dim() > 2
             else sequence_log_prob(logits, tokens), ["shape", "case 2"]),  # averaged over the batch
            (lambda logits, tokens: _picked(torch.log_softmax(logits, -1), tokens).mean(-1),
             ["differs in", "case 1"]),  # the mean over positions, not the sum
            (_shifted_alignment, ["differs in", "case 1", "scores tokens[..., t]"]),
        ],
        "right": [_seq_by_logsumexp, _seq_by_cross_entropy],
    },
    "chi_square_statistic": {
        "wrong": [
            (_chi2_unmasked, ["NaN", "case 3", "p_i = 0"]),
            (_chi2_batch_n, ["differs in", "case 2", "of each row"]),
            (_chi2_frequencies, ["differs in", "case 1", "use counts, not frequencies"]),
            (_chi2_neyman, ["differs in", "case 1", "divide by the expected count"]),
            (lambda counts, probs: chi_square_statistic(counts, probs).sum(), ["shape", "case 2"]),
        ],
        "right": [_chi2_loop, _chi2_expanded],
    },
}


def test_registry():
    assert registry(2) == ch2.EXERCISES
    assert set(ch2.EXERCISES) == {"stable_softmax", "top_p_filter", "sequence_log_prob", "chi_square_statistic"}


@pytest.mark.parametrize("fn", [stable_softmax, top_p_filter, sequence_log_prob, chi_square_statistic])
def test_solutions_pass(fn):
    result = ch2.EXERCISES[fn.__name__](fn)
    assert result.passed, result.message


def test_stub_says_not_written():
    def stable_softmax(z):
        raise NotImplementedError
    assert "not written yet" in ch2.check_stable_softmax(stable_softmax).message


@pytest.mark.parametrize(("name", "wrong", "words"), wrong_answers(CATALOGUE))
def test_typical_wrong_answer_rejected(name, wrong, words):
    assert_rejected(ch2.EXERCISES[name], wrong, *words)


@pytest.mark.parametrize(("name", "right"), right_answers(CATALOGUE))
def test_correct_alternative_accepted(name, right):
    assert_accepted(ch2.EXERCISES[name], right)


def test_top_p_boundary_case_is_exact():
    """The case [.5, .25, .125, .125], p = .75 relies on exact arithmetic: the first two reach .75 exactly."""
    z = torch.log(torch.tensor([0.5, 0.25, 0.125, 0.125], dtype=torch.float64))
    p = torch.softmax(z, -1)
    assert float(p[:2].sum()) == 0.75
    assert torch.isfinite(top_p_filter(z, 0.75)).tolist() == [True, True, False, False]
