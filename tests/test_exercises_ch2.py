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


def _softmax_float32(z):  # computes in float32: off by ~4e-8
    return stable_softmax(z.float())


def _softmax_no_keepdim(z):  # the row max without keepdim: (3, 7) - (3,) does not broadcast
    e = torch.exp(z - z.amax(dim=-1))
    return e / e.sum(dim=-1)


def _softmax_batch_sum(z):  # normalised by the sum over the whole batch
    e = torch.exp(z - z.amax(dim=-1, keepdim=True))
    return e / e.sum()


def _softmax_epsilon(z):  # float64, with an epsilon in the denominator: not float32 round-off
    e = torch.exp(z - z.amax(dim=-1, keepdim=True))
    return e / (e.sum(-1, keepdim=True) + 1e-9)


# ---- softmax_jacobian_at -------------------------------------------------------------------------------------


def softmax_jacobian_at(z):
    p = torch.softmax(z, dim=-1)
    return torch.diag_embed(p) - p.unsqueeze(-1) * p.unsqueeze(-2)


def _jacobian_naive(z):  # exp without the shift: NaN for logits near 1000
    p = torch.exp(z) / torch.exp(z).sum(-1, keepdim=True)
    return torch.diag_embed(p) - p.unsqueeze(-1) * p.unsqueeze(-2)


def _jacobian_by_autograd(z):  # right: torch.func.jacrev of torch.softmax, vmapped over the batch
    f = torch.func.jacrev(lambda row: torch.softmax(row, -1))
    flat = z.reshape(-1, z.shape[-1])
    return torch.func.vmap(f)(flat).reshape(*z.shape, z.shape[-1])


def _jacobian_by_loops(z):  # right: p_i (δ_ij - p_j) entry by entry
    p = torch.softmax(z, -1)
    n = z.shape[-1]
    J = torch.empty(*z.shape, n, dtype=z.dtype)
    for i in range(n):
        for j in range(n):
            J[..., i, j] = p[..., i] * ((1.0 if i == j else 0.0) - p[..., j])
    return J


def _jacobian_einsum(z):  # right: einsum for the outer product
    p = torch.softmax(z, -1)
    return torch.diag_embed(p) - torch.einsum("...i,...j->...ij", p, p)


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


def _top_p_ascending(logits, top_p):  # right: Hugging Face's TopPLogitsWarper (sort ascending, drop mass <= 1 - p)
    sorted_z, order = torch.sort(logits, dim=-1, descending=False)
    drop_sorted = torch.cumsum(torch.softmax(sorted_z, -1), -1) <= 1 - top_p
    drop_sorted[..., -1] = False  # the most probable token is always kept
    return logits.masked_fill(torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted), float("-inf"))


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


def _seq_float32(logits, tokens):  # computes in float32: off by ~1e-6
    return sequence_log_prob(logits.float(), tokens)


def _seq_raw_logits(logits, tokens):  # sums the chosen logits, never normalised
    return _picked(logits, tokens).sum(-1)


def _seq_over_positions(logits, tokens):  # log-softmax over the positions (dim=-2)
    return _picked(torch.log_softmax(logits, -2), tokens).sum(-1)


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


def _chi2_expanded(counts, probs):  # right: X² = Σ O²/E - 2 Σ O + Σ E over the tokens with p > 0 (and Σ E = N)
    n = counts.sum(-1, keepdim=True).double()
    e, keep = n * probs, probs > 0
    o2_over_e = torch.where(keep, counts.double() ** 2 / torch.where(keep, e, 1.0), 0.0).sum(-1)
    return o2_over_e - 2 * torch.where(keep, counts, 0).sum(-1) + n[..., 0]


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


def _chi2_epsilon(counts, probs):  # no mask: divides by E + 1e-12, so a drawn removed token explodes
    e = counts.sum(-1, keepdim=True) * probs
    return ((counts - e) ** 2 / (e + 1e-12)).sum(-1)


def _chi2_nansum(counts, probs):  # nansum skips 0/0 but not 2²/0 = inf
    e = counts.sum(-1, keepdim=True) * probs
    return ((counts - e) ** 2 / e).nansum(-1)


def _chi2_n_is_v(counts, probs):  # N taken as the vocabulary size
    e = counts.shape[-1] * probs
    keep = probs > 0
    return torch.where(keep, (counts - e) ** 2 / torch.where(keep, e, 1.0), 0.0).sum(-1)


def _chi2_absolute(counts, probs):  # |O - E| instead of (O - E)²
    e = counts.sum(-1, keepdim=True) * probs
    keep = probs > 0
    return torch.where(keep, (counts - e).abs() / torch.where(keep, e, 1.0), 0.0).sum(-1)


def _chi2_neyman(counts, probs):  # divides by the observed count instead of the expected one
    e = counts.sum(-1, keepdim=True) * probs
    keep = probs > 0
    return torch.where(keep, (counts - e) ** 2 / torch.where(keep, counts.clamp_min(1), 1), 0.0).sum(-1)


def _chi2_float32(counts, probs):  # computes in float32
    return chi_square_statistic(counts.float(), probs.float())


def _chi2_n_kept(counts, probs):  # N counted over the kept tokens only
    n = torch.where(probs > 0, counts, 0).sum(-1, keepdim=True)
    keep = probs > 0
    return torch.where(keep, (counts - n * probs) ** 2 / torch.where(keep, n * probs, 1.0), 0.0).sum(-1)


def _chi2_shortcut(counts, probs):  # X² = Σ O²/E - N: true only when the summed O add up to N
    n = counts.sum(-1, keepdim=True).double()
    keep = probs > 0
    return torch.where(keep, counts.double() ** 2 / torch.where(keep, n * probs, 1.0), 0.0).sum(-1) - n.squeeze(-1)


# ---- temperature_limit ----------------------------------------------------------------------------------------


def temperature_limit(z, T):
    keep = z == z.amax(dim=-1, keepdim=True) if T == 0 else z > float("-inf")
    return keep.double() / keep.double().sum(dim=-1, keepdim=True)


def _limit_by_softmax_of_mask(z, T):  # right: softmax of 0 on the sharing tokens and -inf elsewhere
    keep = z == z.amax(dim=-1, keepdim=True) if T == 0 else torch.isfinite(z)
    return torch.softmax(torch.where(keep, 0.0, -math.inf).to(z.dtype), dim=-1)


def _limit_loop(z, T):  # right: plain Python over the rows
    rows = z.reshape(-1, z.shape[-1]).tolist()
    out = []
    for row in rows:
        share = [v == max(row) for v in row] if T == 0 else [v > -math.inf for v in row]
        out.append([s / sum(share) for s in share])
    return torch.tensor(out, dtype=z.dtype).reshape(z.shape)


def _limit_argmax(z, T):  # one-hot at argmax: tied maxima do not share
    if T != 0:
        return temperature_limit(z, T)
    return torch.nn.functional.one_hot(z.argmax(-1), z.shape[-1]).to(z.dtype)


def _limit_numeric(z, T):  # softmax at T = 1e-6 or 1e6: close, but not the limit
    return torch.softmax(z / (1e-6 if T == 0 else 1e6), dim=-1)


def _limit_at_extreme_t(z, T):  # softmax at t = 1e-300 or 1e300: passed the first 7 cases (review, round 3)
    return torch.softmax(z / (1e-300 if T == 0 else 1e300), dim=-1)


def _limit_isclose_ties(z, T):  # ties by isclose: a gap of 5e-324 counts as a tie
    keep = torch.isclose(z, z.amax(dim=-1, keepdim=True)) if T == 0 else z > -math.inf
    return keep.to(z.dtype) / keep.to(z.dtype).sum(dim=-1, keepdim=True)


def _jacobian_unbatched_outer(z):  # p.unsqueeze(-1) * p: right for one row, does not broadcast for a batch
    p = torch.softmax(z, -1)
    return torch.diag_embed(p) - p.unsqueeze(-1) * p


def _seq_one_hot_transposed(logits, tokens):  # one_hot(tokens).T: (L, V) becomes (V, L)
    one_hot = torch.nn.functional.one_hot(tokens, logits.shape[-1]).to(logits.dtype)
    return (torch.log_softmax(logits, -1) * one_hot.T).sum((-2, -1))


def _seq_naive_logsumexp(logits, tokens):  # z_y - log Σ exp(z): exp overflows, log(inf) = inf, answer -inf
    return (_picked(logits, tokens) - torch.log(torch.exp(logits).sum(-1))).sum(-1)


def _limit_all_tokens(z, T):  # uniform over every token, -inf ones included
    return temperature_limit(z, T) if T == 0 else torch.full_like(z, 1 / z.shape[-1])


_ALIAS_SOFTMAX = getattr(torch.special, "soft" + "max")  # torch.softmax under a name assembled at run time



def _limit_keep(keep, z):  # 1/k on the k kept tokens
    keep = keep.to(z.dtype)
    return keep / keep.sum(-1, keepdim=True)

CATALOGUE = {
    "stable_softmax": {
        "wrong": [
            (lambda z: torch.exp(z) / torch.exp(z).sum(-1, keepdim=True), ["NaN", "case 3", "overflows"]),  # naive
            (lambda z: torch.exp(z - z.max()) / torch.exp(z - z.max()).sum(-1, keepdim=True),
             ["NaN", "case 5", "each row's own maximum"]),  # one max for the whole batch
            (_shifted_softmax(lambda z: z.amin(-1, keepdim=True)), ["NaN", "case 7", "minimum, mean or first"]),
            (_shifted_softmax(lambda z: z.mean(-1, keepdim=True)), ["NaN", "case 7", "minimum, mean or first"]),
            (_shifted_softmax(lambda z: z[..., :1]), ["NaN", "case 7", "minimum, mean or first"]),
            (lambda z: stable_softmax(z.T).T if z.dim() > 1 else stable_softmax(z), ["differs in", "case 2", "dim=-1"]),
            (lambda z: stable_softmax(z).sum(-1), ["shape"]),
            (_softmax_float32, ["differs in", "case 1", "float32 round-off", "float64"]),
            (_softmax_no_keepdim, ["raised RuntimeError", "case 2", "keepdim=True"]),
            (lambda z: torch.softmax(z, 1 if z.dim() > 1 else 0), ["ForbiddenCall", "torch.softmax"]),
            (lambda z: torch.softmax(z, -1), ["ForbiddenCall", "torch.softmax", "write yourself"]),
            (lambda z: z.softmax(-1), ["ForbiddenCall", "torch.softmax"]),
            (lambda z: _ALIAS_SOFTMAX(z, -1), ["ForbiddenCall", "torch.softmax"]),
            (lambda z: torch.log_softmax(z, -1).exp(), ["ForbiddenCall", "log_softmax"]),
            (_softmax_batch_sum, ["differs in", "case 2", "whole batch"]),
            (_softmax_epsilon, ["differs in", "case 1"]),
        ],
        "right": [_softmax_numpy, _softmax_via_logsumexp, _softmax_by_rows],
    },
    "softmax_jacobian_at": {
        "wrong": [
            (lambda z: -softmax_jacobian_at(z), ["differs in", "case 1", "sign is flipped"]),
            (lambda z: torch.diag_embed(torch.softmax(z, -1)), ["differs in", "case 1", "subtract p pᵀ"]),
            (lambda z: -torch.softmax(z, -1).unsqueeze(-1) * torch.softmax(z, -1).unsqueeze(-2),
             ["differs in 3 of 9", "case 1", "add diag(p)"]),
            (lambda z: torch.diag_embed(z) - z.unsqueeze(-1) * z.unsqueeze(-2), ["case 1", "not of the logits z"]),
            (lambda z: torch.eye(z.shape[-1], dtype=z.dtype) - torch.softmax(z, -1).unsqueeze(-2).expand(
                *z.shape, z.shape[-1]), ["case 1", "Jacobian of log-softmax"]),
            (_jacobian_naive, ["NaN", "case 3", "stable"]),
            (_jacobian_unbatched_outer, ["raised RuntimeError", "case 2", "p.unsqueeze(-1) * p.unsqueeze(-2)"]),
            (lambda z: softmax_jacobian_at(z)[..., 0, :], ["shape", "case 1"]),
            (lambda z: softmax_jacobian_at(z.float()), ["differs in", "case 1", "float32 round-off"]),
            (lambda z: (lambda p: torch.diag_embed(p) - p.unsqueeze(-1) * p.unsqueeze(-2))(torch.softmax(z, 0)),
             ["differs in", "case 2", "dim=-1"]),
        ],
        "right": [_jacobian_by_autograd, _jacobian_by_loops, _jacobian_einsum],
    },
    "top_p_filter": {
        "wrong": [
            (_cum_including_self, ["differs in", "case 1", "belongs to the nucleus"]),
            (_unsorted, ["differs in", "case 2", "sort by probability"]),
            (lambda logits, top_p: torch.where(torch.softmax(logits, -1) >= 1 - top_p, logits, -torch.inf),
             ["differs"]),
            (_strict_boundary, ["differs in 1 of 4", "case 6", "not 3"]),
            (_sorted_order_returned, ["differs in", "case 2", "original token order"]),
        ],
        "right": [_top_p_by_count, _top_p_loop, _top_p_ascending],
    },
    "sequence_log_prob": {
        "wrong": [
            (lambda logits, tokens: _picked(torch.softmax(logits, -1), tokens).prod(-1),
             ["differs in", "case 1", "do not multiply"]),  # a probability, not a log-probability
            (lambda logits, tokens: _picked(torch.log(torch.exp(logits) / torch.exp(logits).sum(-1, keepdim=True)),
                                            tokens).sum(-1), ["case 3", "overflows"]),  # naive: NaN on huge logits
            (lambda logits, tokens: _picked(torch.log(torch.softmax(logits, -1)), tokens).sum(-1),
             ["case 5", "-inf", "log_softmax"]),  # log of a probability that rounded to 0
            (_seq_naive_logsumexp, ["case 3", "-inf", "exp(z) overflows", "logsumexp"]),
            (_seq_one_hot_transposed, ["raised RuntimeError", "case 1", ".T on a batch"]),
            (lambda logits, tokens: sequence_log_prob(logits, tokens).mean() if logits.dim() > 2
             else sequence_log_prob(logits, tokens), ["shape", "case 2"]),  # averaged over the batch
            (lambda logits, tokens: _picked(torch.log_softmax(logits, -1), tokens).mean(-1),
             ["differs in", "case 1"]),  # the mean over positions, not the sum
            (_shifted_alignment, ["differs in", "case 1", "scores tokens[..., t]"]),
            (lambda logits, tokens: torch.log(_picked(torch.softmax(logits, -1), tokens).prod(-1)),
             ["case 3", "-inf", "product of the probabilities underflows", "!exp(z) overflows"]),  # log Π p
            (lambda logits, tokens: -sequence_log_prob(logits, tokens), ["differs in", "case 1", "sign is flipped"]),
            (_seq_float32, ["differs in", "case 1", "float32 round-off"]),
            (_seq_raw_logits, ["differs in", "case 1", "raw logits", "log_softmax"]),
            (_seq_over_positions, ["differs in", "case 1", "dim=-2"]),
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
            (_chi2_epsilon, ["differs in", "case 5", "even when their count is not 0"]),
            (_chi2_nansum, ["case 5", "even when their count is not 0"]),
            (_chi2_n_is_v, ["differs in", "case 1", "not the number of tokens"]),
            (_chi2_absolute, ["differs in", "case 1", "square the difference"]),
            (_chi2_float32, ["differs in", "float32 round-off"]),
            (_chi2_n_kept, ["differs in", "case 5", "including the draws of removed tokens"]),
            (_chi2_shortcut, ["differs in", "case 5"]),
        ],
        "right": [_chi2_loop, _chi2_expanded],
    },
    "temperature_limit": {
        "wrong": [
            (_limit_argmax, ["differs in", "case 5", "tied maxima share"]),
            (lambda z, T: temperature_limit(z, math.inf if T == 0 else 0.0), ["differs in", "case 1", "swapped"]),
            (_limit_all_tokens, ["differs in", "case 6", "-inf", "finite logit"]),
            (_limit_numeric, ["differs in", "case 2", "finite T"]),
            (lambda z, T: temperature_limit(z, T).float(), ["differs in", "case 2", "float32 round-off"]),
            (lambda z, T: torch.softmax(z, -1), ["differs in", "case 1", "finite T"]),  # softmax at T = 1
            (_limit_at_extreme_t, ["differs in", "case 8", "no finite t reaches the limit"]),
            (lambda z, T: torch.softmax(z / (1e-12 if T == 0 else 1e12), -1), ["case 8", "no finite t"]),
            (_limit_isclose_ties, ["differs in", "case 7", "not tied", "exactly (==)"]),
            (lambda z, T: torch.softmax(z / T, -1), ["NaN", "case 1", "softmax(z / T) at T itself",
                                                     "!argmax"]),  # divides by T = 0
            (lambda z, T: _limit_keep(z == z.max(), z) if T == 0 else temperature_limit(z, T),
             ["case 3", "NaN", "the whole tensor, z.max()", "amax(dim=-1, keepdim=True)"]),  # one global maximum
            (lambda z, T: (z == z.amax(-1, keepdim=True)).to(z.dtype) / z.shape[-1] if T == 0
             else temperature_limit(z, T), ["case 1", "not by the vocabulary size V", "!float32"]),
            (lambda z, T: torch.isfinite(z).to(z.dtype) / z.shape[-1] if T != 0 else temperature_limit(z, T),
             ["case 6", "not by the vocabulary size V", "!-inf has probability 0"]),  # counts the -inf tokens
            (lambda z, T: _limit_keep((z.amax(-1, keepdim=True) - z).abs() < 1e-12, z) if T == 0
             else temperature_limit(z, T),
             ["case 8", "0 and 5e-324 are not tied", "merges near-equal logits with a tolerance",
              "!no finite t reaches"]),  # ties up to 1e-12: right everywhere but the 5e-324 gap
            (lambda z, T: torch.softmax((z - z.amax(-1, keepdim=True)) / 1e-300, -1) if T == 0
             else temperature_limit(z, T), ["case 8", "no finite t reaches", "!merges"]),  # t = 1e-300 at T = 0
        ],
        "right": [_limit_by_softmax_of_mask, _limit_loop],
    },
}


def test_registry():
    assert registry(2) == ch2.EXERCISES
    assert set(ch2.EXERCISES) == {"stable_softmax", "softmax_jacobian_at", "temperature_limit", "top_p_filter",
                                  "sequence_log_prob", "chi_square_statistic"}


@pytest.mark.parametrize("fn", [stable_softmax, softmax_jacobian_at, temperature_limit, top_p_filter,
                                sequence_log_prob, chi_square_statistic])
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
    """The case [.1875, .5, .0625, .25], p = .75 relies on exact arithmetic: the two most probable reach .75
    exactly, with a descending cumulative sum and with Hugging Face's ascending one (the review found the old case
    [.5, .25, .125, .125] rejecting that correct answer through round-off)."""
    z = torch.log(torch.tensor([0.1875, 0.5, 0.0625, 0.25], dtype=torch.float64))
    p = torch.sort(torch.softmax(z, -1), descending=True).values
    assert float(p[:2].sum()) == 0.75
    assert float(p.flip(0)[:2].sum()) <= 0.25
    for fn in (top_p_filter, _top_p_ascending, _top_p_loop):
        assert torch.isfinite(fn(z, 0.75)).tolist() == [False, True, False, True]


@pytest.mark.parametrize(("name", "wrong", "not_words"), [
    ("sequence_log_prob", lambda logits, tokens: -sequence_log_prob(logits, tokens), ["aligned", "multiply"]),
    ("chi_square_statistic", _chi2_absolute, ["frequencies", "expected count"]),
    ("chi_square_statistic", _chi2_n_is_v, ["frequencies", "whole batch"]),
    ("stable_softmax", _softmax_float32, ["overflows", "maximum"]),
    ("stable_softmax", _softmax_epsilon, ["float32", "hint"]),  # float64 near miss: not float32 round-off
    ("chi_square_statistic", _chi2_shortcut, ["hint"]),  # no typical-mistake hint fits it
    ("temperature_limit", lambda z, T: torch.softmax(z, -1), ["share the mass equally", "swapped", "float32"]),
    ("temperature_limit", _limit_at_extreme_t, ["swapped"]),
    ("softmax_jacobian_at", _jacobian_unbatched_outer, ["a reduction over the last dimension drops it"]),
    ("sequence_log_prob", _seq_naive_logsumexp, ["rounds to 0"]),  # review 3: the -inf hint blamed log(softmax)
    ("sequence_log_prob", lambda logits, tokens: _picked(torch.log(torch.softmax(logits, -1)), tokens).sum(-1),
     ["overflows"]),
])
def test_a_hint_fires_only_for_its_own_mistake(name, wrong, not_words):
    """The review found case-1 hints blaming unrelated mistakes (a sign error told about alignment)."""
    message = ch2.EXERCISES[name](wrong).message
    assert not any(w in message for w in not_words), message


def test_top_p_cases_test_ties_inside_and_outside_the_nucleus():
    """The page says tied tokens inside or outside the nucleus are tested (the review found only ties inside)."""
    kept_ties = dropped_ties = 0
    for case in ch2._top_p_cases():
        z = case["logits"].reshape(-1, case["logits"].shape[-1])
        kept = torch.isfinite(ch2._top_p_reference(**case)).reshape(z.shape)
        for row, keep in zip(z, kept, strict=True):
            for v in row.unique():
                tied = row == v
                if int(tied.sum()) > 1:
                    assert keep[tied].all() or not keep[tied].any()  # kept or dropped together
                    kept_ties += bool(keep[tied].all())
                    dropped_ties += not bool(keep[tied].any())
    assert kept_ties >= 1 and dropped_ties >= 1


def test_chi_square_shortcut_breaks_with_a_drawn_removed_token():
    """The solution says X² = Σ O²/E - N fails when a removed token was drawn (case 5): it is negative there."""
    case = list(ch2._chi2_cases())[4]
    assert float(_chi2_shortcut(**case)) < 0 < float(chi_square_statistic(**case))


def test_no_finite_temperature_passes_the_limit_checker():
    """The page says evaluating the softmax at a tiny or huge t is not the limit and the checker can tell; the
    third review found softmax(z / 1e-12) and softmax(z / 1e-100) passing every case. Cases 8-9 are beyond any
    finite float64 t (checked here for the smallest and the largest double and powers of 10 between them)."""
    for t in [10.0**k for k in range(-323, 309, 20)] + [1e-12, 1e12, 1e-100, 1e100, 5e-324, 1.7976931348623157e308]:
        def at_t(z, T, t=t):
            return torch.softmax(z / t, dim=-1)
        assert not ch2.check_temperature_limit(at_t).passed, t
    cases = list(ch2._temperature_limit_cases())
    assert ch2._temperature_limit_reference(**cases[7]).tolist() == [0.0, 1.0]
    assert ch2._temperature_limit_reference(**cases[8]).tolist() == [0.5, 0.5]
