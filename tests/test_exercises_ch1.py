"""Chapter 1 exercise checkers: each accepts the reference solution and correct answers in other styles, and rejects
the typical wrong answers (CATALOGUE) with a message that says what differs."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import assert_accepted, assert_rejected, right_answers, wrong_answers

from transformer_lab.exercises import ch1, registry


def attention(query, key, value, mask=None):
    scores = query @ key.transpose(-2, -1) / math.sqrt(query.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ value


def split_heads(x, n_head):
    B, T, C = x.shape
    return x.reshape(B, T, n_head, C // n_head).transpose(1, 2)


def one_hot_embed(idx, weight):
    return F.one_hot(idx, weight.shape[0]).to(weight.dtype) @ weight


def closest_scores(key, target):
    q = torch.linalg.pinv(key) @ target  # the least-squares q: minimises |K q - s|
    return key @ q  # the reachable score row nearest to s


def superposition_gaps(f, x, y):
    return (f(x + y) - f(x) - f(y)).abs().max().item(), (f(2 * x) - 2 * f(x)).abs().max().item()


def attention_by_hand():
    a = math.exp(1 / math.sqrt(2))  # e^{S_11} = e^{S_13}; e^{S_12} = e^0 = 1
    b = math.exp(math.sqrt(2))  # e^{S_22}; e^{S_21} = 1; key 3 is masked for query 2
    A = torch.tensor([[a / (2 * a + 1), 1 / (2 * a + 1), a / (2 * a + 1)], [1 / (1 + b), b / (1 + b), 0]],
                     dtype=torch.float64)
    O = A @ torch.tensor(ch1.BY_HAND["V"], dtype=torch.float64)
    return A, O


def _by_hand_with(scale=2**-0.5, mask=True, dim=-1, masked_score=-math.inf):
    """The 2 × 3 example computed with one typical slip: a wrong scale, the mask ignored or given score 0 instead of
    -inf, or the softmax over the wrong axis."""
    Q, K, V = (torch.tensor(ch1.BY_HAND[k], dtype=torch.float64) for k in ("Q", "K", "V"))
    S = Q @ K.T * scale
    if mask:
        S = S.masked_fill(~torch.tensor(ch1.BY_HAND["mask"]), masked_score)
    A = torch.softmax(S, dim=dim)
    return A, A @ V


def _sdpa_by_hand():
    Q, K, V = (torch.tensor(ch1.BY_HAND[k], dtype=torch.float64) for k in ("Q", "K", "V"))
    mask = torch.tensor(ch1.BY_HAND["mask"])
    A = torch.softmax((Q @ K.T / 2**0.5).masked_fill(~mask, -math.inf), dim=1)
    return A, A @ V


def _lists_by_hand():  # plain numbers typed from a calculator, as nested lists, to 4 decimals
    return ([[0.40111, 0.19778, 0.40111], [0.19557, 0.80443, 0.0]], [[1.20333, 1.0], [0.19557, 0.80443]])


def _attention_einsum(q, k, v, m=None):  # other parameter names, einsum, and where() instead of masked_fill
    s = torch.einsum("...id,...jd->...ij", q, k) * q.shape[-1] ** -0.5
    if m is not None:
        s = torch.where(m, s, torch.tensor(-math.inf, dtype=s.dtype))
    return torch.einsum("...ij,...jd->...id", s.softmax(-1), v)


def _attention_stable_by_hand(query, key, value, mask=None):  # the max-shifted softmax written out
    s = query @ key.transpose(-2, -1) / math.sqrt(query.shape[-1])
    if mask is not None:
        s = s.masked_fill(~mask, -math.inf)
    e = torch.exp(s - s.amax(-1, keepdim=True))
    return (e / e.sum(-1, keepdim=True)) @ value


def _attention_naive_exp(query, key, value, mask=None):  # the softmax written as e^S / Σ e^S, not max-shifted
    s = query @ key.transpose(-2, -1) / math.sqrt(query.shape[-1])
    if mask is not None:
        s = s.masked_fill(~mask, -math.inf)
    e = s.exp()
    return e / e.sum(-1, keepdim=True) @ value


def _attention_mask_backwards(query, key, value, mask=None):  # nn.MultiheadAttention's convention: True = blocked
    s = query @ key.transpose(-2, -1) / math.sqrt(query.shape[-1])
    if mask is not None:
        s = s.masked_fill(mask, -math.inf)
    return torch.softmax(s, dim=-1) @ value


def _attention_masked(query, key, value, mask=None, fill=-math.inf, after=False, renormalise=False):
    """Attention with a masking slip: a finite fill value, or the mask applied to the weights after the softmax
    (renormalised or not)."""
    s = query @ key.transpose(-2, -1) / math.sqrt(query.shape[-1])
    if mask is not None and not after:
        s = s.masked_fill(~mask, fill)
    w = torch.softmax(s, -1)
    if mask is not None and after:
        w = w * mask
        w = w / w.sum(-1, keepdim=True) if renormalise else w
    return w @ value


def _attention_heads_into_batch(query, key, value, mask=None):  # bmm over (B·H), the mask tiled with .repeat
    *lead, T_q, d = query.shape
    q, k, v = query.reshape(-1, T_q, d), key.reshape(-1, *key.shape[-2:]), value.reshape(-1, *value.shape[-2:])
    s = torch.bmm(q, k.transpose(1, 2)) / math.sqrt(d)
    if mask is not None:
        m = mask.reshape(-1, *mask.shape[-2:])  # (B, T_q, T_k)
        s = s.masked_fill(~m.repeat(s.shape[0] // m.shape[0], 1, 1), -math.inf)  # b·H + h gets mask (b·H + h) % B
    return (torch.softmax(s, -1) @ v).reshape(*lead, T_q, -1)


def _attention_mask_indexed(query, key, value, mask=None):  # scores[..., ~mask]: right for a (T_q, T_k) mask only
    s = query @ key.transpose(-2, -1) / math.sqrt(query.shape[-1])
    if mask is not None:
        s[..., ~mask] = -math.inf
    return torch.softmax(s, -1) @ value


def _attention_heads_into_batch_right(query, key, value, mask=None):  # bmm over (B·H), the mask broadcast first
    *lead, T_q, d = query.shape
    q, k, v = query.reshape(-1, T_q, d), key.reshape(-1, *key.shape[-2:]), value.reshape(-1, *value.shape[-2:])
    s = torch.bmm(q, k.transpose(1, 2)) / math.sqrt(d)
    if mask is not None:
        s = s.masked_fill(~mask.expand(*lead, T_q, k.shape[1]).reshape(s.shape), -math.inf)
    return (torch.softmax(s, -1) @ v).reshape(*lead, T_q, -1)


def _numpy_unscaled_by_hand():  # forgot 1/√d_k, computed in NumPy
    A, O = _by_hand_with(scale=1.0)
    return A.numpy(), O.numpy()


class Mm(torch.autograd.Function):
    """A lookup dressed as a product: its autograd node is named MmBackward, its backward gives no gradient."""

    @staticmethod
    def forward(ctx, idx, weight):
        ctx.shape = weight.shape
        return weight[idx]

    @staticmethod
    def backward(ctx, grad):
        return None, grad.new_zeros(ctx.shape)


def _forged_product(idx, weight):
    return Mm.apply(idx, weight)


CATALOGUE = {
    "attention_by_hand": {
        "wrong": [
            (lambda: _by_hand_with(scale=1.0), ["differs", "√d_k = √2"]),  # forgot 1/√d_k
            (lambda: _by_hand_with(mask=False), ["differs", "A[1, 2] must be exactly 0"]),  # ignored the mask
            (lambda: _by_hand_with(masked_score=0.0), ["differs", "must be exactly 0"]),  # masked score 0, not -inf
            (lambda: _by_hand_with(dim=0), ["differs", "must sum to 1"]),  # softmax over the queries
            (lambda: _by_hand_with()[1], ["should be a tuple", "got Tensor"]),  # returned O only
            (lambda: _by_hand_with()[::-1], ["shape (2, 2), expected (2, 3)"]),  # (O, A) instead of (A, O)
            (lambda x: _by_hand_with(), ["should take 0 argument(s)"]),  # a parameter the exercise does not give
            (lambda: ([[0.4011, 0.1978, 0.4011], [0.1956, 0.8044]], [[1.2033, 1.0], [0.1956, 0.8044]]),
             ["A must be 2 x 3 and O 2 x 2", "A[1][2] as 0"]),  # row 2 of A with its two visible keys only
            (lambda: ([[0.4011, 0.1978, 0.4011], [0.1956, 0.8044, None]], [[1.2033, 1.0], [0.1956, 0.8044]]),
             ["A must be 2 x 3 and O 2 x 2", "A[1][2] as 0"]),  # None for the masked weight
            (_numpy_unscaled_by_hand, ["differs", "√d_k = √2"]),  # NumPy arrays get the hints too
        ],
        "right": [attention_by_hand, _sdpa_by_hand, _lists_by_hand],
    },
    "attention": {
        "wrong": [
            (lambda query, key, value, mask=None: torch.softmax(query @ key.transpose(-2, -1), -1) @ value,
             ["differs in", "case 1"]),  # forgot 1/sqrt(d_k)
            (lambda query, key, value, mask=None: torch.softmax(
                query @ key.transpose(-2, -1) / math.sqrt(query.shape[-1]), -2) @ value,
             ["differs in"]),  # softmax over queries
            (lambda query, key, value, mask=None: attention(query, key, value), ["differs", "case 3", "mask"]),
            (lambda query, key, value, mask=None: attention(query, key, value, mask)[..., :1], ["shape"]),
            (lambda query, key, value: attention(query, key, value),  # no mask parameter at all
             ["should take 4 argument(s), in this order: (query, key, value, mask=None)"]),
            (lambda query, key, value, mask=None: attention(query, key, value, None if mask is None else ~mask),
             ["case 3", "True in the mask means *may attend*", "~mask"]),  # True read as "blocked"
            (_attention_mask_backwards, ["case 3", "NaN", "*may attend*", "0/0"]),  # masked_fill(mask, -inf)
            (lambda query, key, value, mask=None: torch.softmax(
                query @ key.transpose(-2, -1) / key.shape[-2] ** 0.5, -1) @ value,
             ["differs in", "case 1"]),  # scaled by √T_k instead of √d_k
            (lambda query, key, value, mask=None: torch.softmax(query @ key.transpose(-2, -1) / math.sqrt(
                query.shape[-1]) * (1 if mask is None else mask), -1) @ value,
             ["case 3"]),  # multiplied the scores by the mask (masked score 0, not -inf)
            (_attention_naive_exp, ["case 6", "NaN", "overflows", "subtract each row's maximum"]),  # e^S / Σ e^S
            (lambda query, key, value, mask=None: attention(query.float(), key.float(), value.float(), mask),
             ["differs", "case 1", "torch.float32", "compute in the inputs' dtype, float64"]),  # right, in float32
            (lambda query, key, value, mask=None: _attention_masked(query, key, value, mask, after=True),
             ["case 3", "the mask acts on the scores, before the softmax", "no longer sum to 1"]),  # weights zeroed
            (lambda query, key, value, mask=None: _attention_masked(query, key, value, mask, after=True,
                                                                    renormalise=True),
             ["case 7", "NaN", "0/0", "before the softmax, not its weights after it"]),  # zeroed, renormalised
            (lambda query, key, value, mask=None: _attention_masked(query, key, value, mask, fill=-1e9),
             ["case 7", "finite fill such as -1e9", "fill with -inf", "!overflows"]),  # leaks on huge scores
            (lambda query, key, value, mask=None: _attention_masked(query, key, value, mask, fill=-1e4),
             ["case 7", "masked keys take the weight"]),
            (_attention_heads_into_batch, ["case 8", "one per sequence, shared by its heads", ".repeat"]),
            (_attention_mask_indexed, ["raised IndexError", "case 8", "not by indexing (scores[..., ~mask])"]),
        ],
        "right": [_attention_einsum, _attention_stable_by_hand, _attention_heads_into_batch_right,
                  lambda query, key, value, mask=None: _attention_masked(query, key, value, mask,
                                                                         fill=torch.finfo(query.dtype).min),
                  lambda query, key, value, mask=None: F.scaled_dot_product_attention(query, key, value,
                                                                                      attn_mask=mask)],
    },
    "split_heads": {
        "wrong": [
            (lambda x, n_head: x.reshape(x.shape[0], n_head, x.shape[1], -1), ["differs in", "case 1"]),  # no transpose
            (lambda x, n_head: x.reshape(x.shape[0], x.shape[1], n_head, -1), ["differs in", "worst at"]),  # (B,T,h,d)
            (lambda x, n_head: x.reshape(x.shape[0], x.shape[1], -1, n_head).permute(0, 3, 1, 2),
             ["differs in"]),  # heads interleaved: head h = columns h, h + n_head, ...
            (lambda x, n_head: x.reshape(x.shape[0], x.shape[1], n_head, -1).transpose(2, 3),
             ["differs in", "case 1"]),  # transposed the wrong axes: (B, T, d_k, h)
            (lambda x, n_head: x.reshape(x.shape[0], x.shape[1], n_head, x.shape[2] // n_head - 1).transpose(1, 2),
             ["raised RuntimeError"]),  # off by one in d_k
        ],
        "right": [split_heads,
                  lambda x, h: torch.stack(x.chunk(h, dim=-1), dim=1),  # the column blocks, stacked as heads
                  lambda x, n_head: x.unflatten(-1, (n_head, -1)).permute(0, 2, 1, 3)],
    },
    "closest_scores": {
        "wrong": [
            (lambda key, target: target, ["differs", "case 1", "projection of s"]),  # every row is reachable: no
            (lambda key, target: torch.linalg.pinv(key) @ target, ["shape (2,), expected (5,)"]),  # returned q
            (lambda key, target: key @ (key.T @ target), ["differs", "case 1"]),  # forgot (KᵀK)⁻¹
            (lambda key, target: sum((target @ key[:, j]) / (key[:, j] @ key[:, j]) * key[:, j]
                                     for j in range(key.shape[1])),
             ["differs", "case 1"]),  # projects on each column separately: right only for orthogonal columns
            (lambda key, target: key @ torch.linalg.inv(key.T @ key) @ key.T @ target,
             ["case 4", "T_k < d_k"]),  # the normal equations, singular when T_k < d_k
            (lambda key, target: target - key @ (torch.linalg.pinv(key) @ target), ["differs"]),  # the residual
            (lambda key, target: key.float() @ (torch.linalg.pinv(key.float()) @ target.float()),
             ["differs", "torch.float32", "compute in the inputs' dtype, float64"]),  # right, in float32
        ],
        "right": [lambda K, s: K @ torch.linalg.lstsq(K, s.unsqueeze(-1)).solution.squeeze(-1),
                  lambda K, s: torch.linalg.qr(K)[0] @ (torch.linalg.qr(K)[0].T @ s),
                  lambda key, target: key @ torch.linalg.pinv(key) @ target],
    },
    "superposition_gaps": {
        "wrong": [
            (lambda f, x, y: ((f(x + y) - f(x) - f(y)).max().item(), (f(2 * x) - 2 * f(x)).max().item()),
             ["differs", "largest absolute value"]),  # forgot the absolute value
            (lambda f, x, y: ((f(x + y) - f(x) - f(y)).abs().max().item(), (f(2 * x) - f(x)).abs().max().item()),
             ["(additivity gap, homogeneity gap)[1] differs"]),  # f(2x) - f(x): tests invariance, not homogeneity
            (lambda f, x, y: ((f(x + y) - f(x) - f(y)).abs().mean().item(),
                              (f(2 * x) - 2 * f(x)).abs().mean().item()), ["differs", "case 1"]),  # mean, not max
            (lambda f, x, y: (f(x + y) - f(x) - f(y)).abs().max().item(), ["should be a tuple of 2 items"]),
            (lambda f, x, y: ((f(x + y) - f(x) - f(y)).abs().sum().item(),
                              (f(2 * x) - 2 * f(x)).abs().sum().item()), ["differs"]),  # sum, not max
        ],
        "right": [lambda f, x, y: tuple(float(torch.linalg.vector_norm(d, ord=float("inf")))
                                        for d in (f(x + y) - f(x) - f(y), f(2 * x) - 2 * f(x))),
                  lambda g, a, b: [(g(a + b) - g(a) - g(b)).abs().amax(), (g(a + a) - g(a) - g(a)).abs().amax()]],
    },
    "one_hot_embed": {
        "wrong": [
            (lambda idx, weight: weight[idx.reshape(-1)], ["shape", "case 2"]),  # flattens the batch
            (lambda idx, weight: weight[(idx + 1) % weight.shape[0]], ["differs in", "case 1"]),  # off by one
            (lambda idx, weight: F.one_hot(idx, weight.shape[0]).to(weight.dtype) @ weight.T[:, :1],
             ["shape"]),  # multiplies by the wrong matrix
            (lambda idx, weight: F.one_hot(idx, weight.shape[0]) @ weight,
             ["raised RuntimeError", "case 1"]),  # an integer one-hot times a float matrix
            (lambda idx, weight: F.one_hot(idx, weight.shape[0]).float() @ weight,
             ["raised RuntimeError", "same dtype", ".to(weight.dtype)"]),  # float32 one-hot times float64
            (lambda idx, weight: F.one_hot(idx).to(weight.dtype) @ weight,
             ["raised RuntimeError", "num_classes=weight.shape[0]"]),  # V left to max(idx) + 1
            (lambda idx, weight: F.one_hot(idx, weight.shape[0]).to(weight.dtype) @ weight.detach(),
             ["values are right", "carries no gradient", "do not detach"]),  # autograd cannot see the product
            (lambda idx, weight: weight.detach()[idx], ["carries no gradient", "do not detach"]),  # nor a lookup
            (lambda idx, weight: weight.T[idx.clamp_max(weight.shape[1] - 1)], ["case 1"]),  # indexes columns
            (_forged_product, ["values are right", "looked up", "weight[idx]"]),  # a lookup named Mm
            # lookups: the same values and gradient as the product, forbidden on a weight that requires a gradient
            (lambda idx, weight: weight[idx], ["values are right", "looked up", "weight[idx]", "F.one_hot"]),
            (lambda idx, weight: F.embedding(idx, weight), ["looked up", "F.embedding"]),
            (lambda idx, weight: weight.index_select(0, idx.reshape(-1)).reshape(*idx.shape, -1),
             ["looked up", "index_select"]),
            (lambda idx, weight: torch.stack([weight[int(i)] for i in idx.reshape(-1)]).reshape(*idx.shape, -1),
             ["looked up", "weight[i]"]),  # row by row
            (lambda idx, weight: torch.gather(weight, 0, idx.reshape(-1, 1).expand(-1, weight.shape[1])).reshape(
                *idx.shape, -1), ["looked up", "torch.gather"]),
            (lambda idx, weight: weight.numpy()[idx.numpy()], ["requires a gradient it raised", "detach"]),
            (lambda idx, weight: F.one_hot(idx, weight.shape[0]).float() @ weight.float(),
             ["differs", "case 1", "torch.float32", "compute in the inputs' dtype, float64"]),  # right, in float32
        ],
        "right": [one_hot_embed,
                  lambda ids, E: (ids.unsqueeze(-1) == torch.arange(E.shape[0])).to(E.dtype) @ E,
                  lambda idx, weight: torch.einsum("...v,vc->...c", F.one_hot(idx, len(weight)).double(), weight),
                  lambda idx, E: (F.one_hot(idx, len(E)).to(E.dtype).unsqueeze(-1) * E).sum(-2),  # Σ_v e_v E_v
                  lambda idx, E: torch.eye(len(E), dtype=E.dtype)[idx] @ E,  # one-hot rows read off I
                  lambda idx, E: np.eye(len(E))[idx.numpy()] @ E.detach().numpy(),  # NumPy: values only
                  lambda idx, E: torch.sparse.mm(F.one_hot(idx.reshape(-1), len(E)).to(E.dtype).to_sparse(),
                                                 E).reshape(*idx.shape, -1)],  # a sparse one-hot matrix product
    },
}


def test_registry():
    assert registry(1) == ch1.EXERCISES
    assert set(ch1.EXERCISES) == {"attention_by_hand", "attention", "split_heads", "one_hot_embed", "closest_scores",
                                  "superposition_gaps"}


@pytest.mark.parametrize("fn", [attention_by_hand, attention, split_heads, one_hot_embed, closest_scores,
                                superposition_gaps])
def test_solutions_pass(fn):
    result = ch1.EXERCISES[fn.__name__](fn)
    assert result.passed, result.message


def test_stub_says_not_written():
    def attention(query, key, value, mask=None):
        raise NotImplementedError
    assert_rejected(ch1.check_attention, attention, "not written yet")


def test_by_hand_numbers_are_the_pages():
    """The example is the one the chapter's solution explains: A_11 = A_13 = e^{1/√2} / (2 e^{1/√2} + 1), O_12 = 1."""
    A, O = attention_by_hand()
    a = math.exp(1 / math.sqrt(2))
    assert abs(float(A[0, 0]) - a / (2 * a + 1)) < 1e-15 and abs(float(O[0, 1]) - 1.0) < 1e-15
    assert float(A[1, 2]) == 0.0


@pytest.mark.parametrize(("name", "wrong", "words"), wrong_answers(CATALOGUE))
def test_typical_wrong_answer_rejected(name, wrong, words):
    assert_rejected(ch1.EXERCISES[name], wrong, *words)


@pytest.mark.parametrize(("name", "right"), right_answers(CATALOGUE))
def test_correct_alternative_accepted(name, right):
    assert_accepted(ch1.EXERCISES[name], right)
