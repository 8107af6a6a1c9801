"""Chapter 1 exercises (linear algebra).

Six exercises: a 2 × 3 attention by hand, attention in code, head splitting, embeddings as one-hot products, the
closest reachable score row, and the superposition gaps of a function. Each ``check_<name>(fn)`` compares a
student's function with ours on fixed inputs (random float64 ones, with masks, batches and length-1 sequences) and
returns a :class:`~transformer_lab.exercises.CheckResult` saying what differs, with a hint for typical slips.
"""

from __future__ import annotations

import inspect
import math

import numpy as np
import torch

from transformer_lab.attention import scaled_dot_product_attention
from transformer_lab.attention import split_heads as _split_heads
from transformer_lab.exercises import CheckResult, check_function, describe_difference, generator, randn
from transformer_lab.exercises.forbid import LOOKUP, forbidding

__all__ = ["BY_HAND", "EXERCISES", "check_attention", "check_attention_by_hand", "check_closest_scores",
           "check_one_hot_embed", "check_split_heads", "check_superposition_gaps"]

# The 2 × 3 example of the by-hand exercise: Q (2, d_k = 2), K and V (3, 2); query 2 may not see key 3.
BY_HAND = {
    "Q": [[1.0, 0.0], [0.0, 2.0]],
    "K": [[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]],
    "V": [[1.0, 0.0], [0.0, 1.0], [2.0, 2.0]],
    "mask": [[True, True, True], [True, True, False]],
}


def _by_hand_reference():
    t = {k: torch.tensor(v, dtype=torch.float64) for k, v in BY_HAND.items() if k != "mask"}
    mask = torch.tensor(BY_HAND["mask"])
    out, weights = scaled_dot_product_attention(query=t["Q"], key=t["K"], value=t["V"], mask=mask)
    return weights, out


def _by_hand_hint(weights) -> str:
    """A hint for the typical slips, read off the student's weights A (2, 3)."""
    if not isinstance(weights, torch.Tensor) or weights.shape != (2, 3) or not weights.is_floating_point():
        return ""
    if not torch.allclose(weights.sum(-1), torch.ones(2, dtype=weights.dtype), atol=1e-6):
        return " Hint: each row of A is a softmax over the keys, so it must sum to 1."
    if abs(float(weights[1, 2])) > 1e-12:
        return " Hint: the mask hides key 3 from query 2, so A[1, 2] must be exactly 0 (its score is -inf)."
    unscaled = torch.softmax(torch.tensor([[1.0, 0.0, 1.0], [0.0, 2.0, float("-inf")]], dtype=torch.float64), -1)
    if torch.allclose(weights.to(torch.float64), unscaled, atol=1e-6):
        return " Hint: divide the scores by √d_k = √2 before the softmax."
    return ""


_RAGGED = ("A must be 2 x 3 and O 2 x 2, as rectangular lists, arrays or tensors of numbers; write the masked weight"
           " A[1][2] as 0")


def _by_hand_compare(got, expected) -> str | None:
    if isinstance(got, tuple | list) and len(got) == 2:
        try:  # nested lists and NumPy arrays become tensors, so that the hints below can read them
            got = tuple(torch.as_tensor(g, dtype=torch.float64) if isinstance(g, list | tuple | np.ndarray) else g
                        for g in got)
        except (TypeError, ValueError):  # a ragged row (the masked weight left out) or None in place of a number
            return f"{_RAGGED}."
    msg = describe_difference(got, expected, atol=1e-4, rtol=0.0, what="(A, O)")
    return None if msg is None else msg + _by_hand_hint(got[0] if isinstance(got, tuple) and got else None)


def check_attention_by_hand(fn) -> CheckResult:
    """``attention_by_hand()`` -> ``(A, O)``: the weights (2, 3) and output (2, 2) of :data:`BY_HAND`, to 1e-4."""
    return check_function("attention_by_hand", fn, _by_hand_reference, [{}], compare=_by_hand_compare)


def _attention_reference(query, key, value, mask=None):
    return scaled_dot_product_attention(query=query, key=key, value=value, mask=mask)[0]


def _attention_cases(seed: int = 0):
    gen = generator(seed)
    yield {"query": randn(gen, 3, 2), "key": randn(gen, 4, 2), "value": randn(gen, 4, 3)}
    yield {"query": randn(gen, 2, 5, 8), "key": randn(gen, 2, 6, 8), "value": randn(gen, 2, 6, 4)}
    causal = torch.ones(5, 5, dtype=torch.bool).tril()
    yield {"query": randn(gen, 2, 5, 4), "key": randn(gen, 2, 5, 4), "value": randn(gen, 2, 5, 4), "mask": causal}
    mask = torch.rand(3, 4, generator=gen) > 0.4
    mask[:, 0] = True
    yield {"query": randn(gen, 1, 3, 16) * 3, "key": randn(gen, 1, 4, 16) * 3, "value": randn(gen, 1, 4, 2),
           "mask": mask}
    yield {"query": randn(gen, 1, 1, 4), "key": randn(gen, 1, 1, 4), "value": randn(gen, 1, 1, 4)}
    # scores of order 10³: e^S overflows float64 (past S ≈ 709.8), so only a max-shifted softmax stays finite
    yield {"query": randn(gen, 2, 3, 4) * 40, "key": randn(gen, 2, 5, 4) * 40, "value": randn(gen, 2, 5, 3)}
    yield _huge_masked_case(gen)
    # one mask per sequence, shared by its 3 heads: (B, 1, T_q, T_k) broadcast against the scores (B, H, T_q, T_k)
    mask = torch.rand(2, 1, 4, 6, generator=gen) > 0.5
    mask[..., 0, :] = False  # the first query of each sequence sees one key only, another in each sequence
    mask[0, ..., 0, 1] = mask[1, ..., 0, 4] = mask[..., 1:, 2] = True
    yield {"query": randn(gen, 2, 3, 4, 8), "key": randn(gen, 2, 3, 6, 8), "value": randn(gen, 2, 3, 6, 5),
           "mask": mask}


_HUGE_CASE = 7  # the case whose scores are all below -10¹¹, the masked keys' among the largest
_HEADS_CASE = 8  # the case whose mask (B, 1, T_q, T_k) is one per sequence, shared by its heads


def _huge_masked_case(gen: torch.Generator) -> dict:
    """Scores of order -10¹²: every key points along u, every query against it, so each row's scores are all
    hugely negative, and the largest score of every row (key 0's, the shortest key) is masked. A finite fill such
    as -1e9 is then *above* every visible score and the masked keys take the weight; a mask applied after the
    softmax zeroes the only weight that did not underflow (0/0 on renormalising)."""
    u = randn(gen, 4)
    u = u / u.norm()
    size = torch.cat((torch.ones(1, dtype=torch.float64), 1.5 + torch.rand(5, generator=gen, dtype=torch.float64)))
    key = (size[:, None] * u + 1e-3 * randn(gen, 6, 4)) * 1e6  # (T_k = 6, 4): |k_j| ≈ 10⁶·size_j, along u
    query = -(1 + torch.rand(3, 1, generator=gen, dtype=torch.float64)) * u * 1e6  # (T_q = 3, 4): against u
    mask = torch.rand(3, 6, generator=gen) > 0.3
    mask[:, 0] = False  # key 0 has every row's largest score: masked
    mask[:, 1] = True  # and one visible key in every row
    return {"query": query, "key": key, "value": randn(gen, 6, 3), "mask": mask}


def _float32_hint(got) -> str:
    """A hint when the answer came back in float32 or a narrower dtype, whose rounding is above the tolerance."""
    if isinstance(got, torch.Tensor) and got.is_floating_point() and torch.finfo(got.dtype).bits <= 32:
        return (f". Hint: your result is {got.dtype}, whose rounding (relative {torch.finfo(got.dtype).eps:.1e}) is"
                " above the tolerance: compute in the inputs' dtype, float64 (no .float(), no float32 tensors)")
    return ""


_MASK_HINT = (". Hint: True in the mask means *may attend*, so fill the scores where ~mask with -inf"
              " (masked_fill(~mask, -inf)); read the other way round, a row with every key masked gives 0/0 = NaN")


def _reversed_mask(got, case) -> bool:
    """Whether ``got`` is attention with the case's mask read backwards (True = blocked), as
    ``nn.MultiheadAttention``'s boolean masks are: equal to ours with ``~mask`` wherever it is finite, and
    non-finite only in rows that ``~mask`` blocks entirely (0/0)."""
    mask = case.get("mask")
    if mask is None:
        return False
    flipped = _attention_reference(case["query"], case["key"], case["value"], ~mask)
    if flipped.shape != got.shape:
        return False
    all_blocked = (~(~mask).any(-1)).unsqueeze(-1).expand(got.shape)  # (…, T_q, d_v): every key masked for this row
    finite = got.isfinite()
    return bool((finite | all_blocked).all()) and torch.allclose(got.to(flipped.dtype).where(finite, flipped),
                                                                 flipped, rtol=1e-6, atol=1e-8)


def _masked_after_softmax(got, case) -> bool:
    """Whether ``got`` is softmax(S) with the masked weights zeroed *afterwards* (rows no longer summing to 1)."""
    mask = case.get("mask")
    if mask is None:
        return False
    scores = case["query"] @ case["key"].transpose(-2, -1) / math.sqrt(case["query"].shape[-1])
    late = (torch.softmax(scores, -1) * mask) @ case["value"]
    return late.shape == got.shape and torch.allclose(got.to(late.dtype), late, rtol=1e-6, atol=1e-8)


_AFTER_SOFTMAX_HINT = (". Hint: the mask acts on the scores, before the softmax: fill the scores where ~mask with"
                       " -inf, so the softmax spreads each row's weight over the visible keys only; zeroing weights"
                       " after the softmax leaves rows that no longer sum to 1")


def _mask_case_hint(got, case, n: int) -> str:
    """A hint for the two cases that test the masking itself: hugely negative scores, and a per-sequence mask."""
    if n == _HUGE_CASE:
        if not bool(got.isfinite().all()):
            return (". Hint: here the largest score of every row is masked and the others are ~10¹¹ below it, so a"
                    " softmax over all keys gives the visible ones weight exactly 0, and zeroing the masked weight"
                    " then renormalising is 0/0 = NaN: mask the scores (masked_fill(~mask, -inf)) before the"
                    " softmax, not its weights after it")
        return (". Hint: every visible score here is below -10¹¹, so a finite fill such as -1e9 or -1e4 is *above*"
                " them and the masked keys take the weight: fill with -inf (or torch.finfo(scores.dtype).min), which"
                " no score can be below")
    if n == _HEADS_CASE:
        return (f". Hint: here query is {tuple(case['query'].shape)} (batch, heads, T_q, d_k) and the mask"
                f" {tuple(case['mask'].shape)} is one per sequence, shared by its heads: sequence b's mask must reach"
                " every head of sequence b. masked_fill and torch.where broadcast it so; reshaping heads into the"
                " batch and tiling the mask with .repeat pairs head h of sequence b with another sequence's mask")
    return ""


def _attention_compare(got, expected, case, n: int = 0) -> str | None:
    """The difference, with a hint: the mask read backwards or applied after the softmax, a finite fill, a mask
    not broadcast over the heads, e^S overflowing (only when the case's scores are large enough for the answer's
    dtype), or a float32 result."""
    msg = describe_difference(got, expected, atol=1e-10, rtol=1e-8)
    if not msg or not isinstance(got, torch.Tensor) or got.shape != expected.shape or not got.is_floating_point():
        return msg
    if _reversed_mask(got, case):
        return msg + _MASK_HINT
    if _masked_after_softmax(got, case):
        return msg + _AFTER_SOFTMAX_HINT
    finite = bool(got.isfinite().all())
    if finite and _float32_hint(got):
        return msg + _float32_hint(got)
    if n in (_HUGE_CASE, _HEADS_CASE):
        return msg + _mask_case_hint(got, case, n)
    if finite:
        return msg
    scores = case["query"] @ case["key"].transpose(-2, -1) / math.sqrt(case["query"].shape[-1])
    if float(scores.abs().max()) > math.log(torch.finfo(got.dtype).max):  # e^S is inf in the answer's dtype
        return msg + (f". Hint: these scores reach {float(scores.abs().max()):.0f}, so e^S overflows to inf and"
                      " inf / inf = NaN: subtract each row's maximum score before exponentiating (chapter 2's"
                      " stable softmax), or use torch.softmax.")
    return msg + (". Hint: no score here is large enough to overflow e^S, so the NaN or inf comes from elsewhere: a"
                  " row with every key masked (0/0), or a division by zero")


def check_attention(fn) -> CheckResult:
    """``attention(query, key, value, mask=None)``: softmax(Q Kᵀ / √d_k) V with True = may attend."""
    try:  # the mask is optional, so the generic check would accept three parameters and fail only in case 3
        inspect.signature(fn).bind(None, None, None, None)
    except TypeError:
        return CheckResult("attention", False, f"{getattr(fn, '__name__', 'function')} should take 4 argument(s), "
                                               "in this order: (query, key, value, mask=None)")
    except ValueError:
        pass
    current: dict = {}
    number = [0]

    def cases():  # remember the case being compared: the hints read its scores and mask
        for number[0], case in enumerate(_attention_cases(), start=1):
            current.clear()
            current.update(case)
            yield case

    result = check_function("attention", fn, _attention_reference, cases(),
                            compare=lambda got, expected: _attention_compare(got, expected, current, number[0]))
    if result.message.startswith("raised") and number[0] == _HEADS_CASE:  # the mask (B, 1, T_q, T_k) did not fit
        return CheckResult("attention", False, result.message + (
            f". Hint: the mask {tuple(current['mask'].shape)} has leading (batch, head) dims, of size 1 for the"
            " heads: apply it with masked_fill or torch.where, which broadcast it against the scores, not by"
            " indexing (scores[..., ~mask]) or reshaping it to (T_q, T_k)"))
    return result



def _split_reference(x, n_head):
    return _split_heads(x, n_head)


def _split_cases(seed: int = 1):
    gen = generator(seed)
    yield {"x": randn(gen, 1, 2, 4), "n_head": 2}
    yield {"x": randn(gen, 2, 5, 12), "n_head": 3}
    yield {"x": randn(gen, 3, 1, 8), "n_head": 4}
    yield {"x": randn(gen, 2, 4, 6), "n_head": 1}


def check_split_heads(fn) -> CheckResult:
    """``split_heads(x, n_head)``: (B, T, C) -> (B, n_head, T, C // n_head), head h = columns h·d_k … (h+1)·d_k."""
    return check_function("split_heads", fn, _split_reference, _split_cases(), atol=0.0, rtol=0.0)


def _embed_reference(idx, weight):
    return weight[idx]


def _embed_compare(got, expected) -> str | None:
    msg = describe_difference(got, expected, atol=1e-12, rtol=1e-12)
    if msg and isinstance(got, torch.Tensor) and got.shape == expected.shape:
        msg += _float32_hint(got)
    return msg


def _embed_cases(seed: int = 2):
    gen = generator(seed)
    yield {"idx": torch.tensor([2]), "weight": randn(gen, 5, 3)}
    yield {"idx": torch.tensor([[0, 4, 4], [1, 2, 3]]), "weight": randn(gen, 5, 3)}
    yield {"idx": torch.randint(0, 11, (2, 7), generator=gen), "weight": randn(gen, 11, 6)}


def _value_and_grad(fn, idx: torch.Tensor, weight: torch.Tensor, g: torch.Tensor):
    """``fn(idx, weight)`` and autograd's gradient of ``(result * g).sum()`` with respect to ``weight`` (``None``
    where the result carries none): here, or, for a graded submission (the grader's stand-in has
    ``value_and_grad``), in the student's process, where the graph is."""
    if hasattr(fn, "value_and_grad"):
        out, grads = fn.value_and_grad((idx, weight), g)
        return out, None if grads is None else grads[0]
    out = fn(idx, weight)
    if not (isinstance(out, torch.Tensor) and out.requires_grad):
        return out, None
    return out, torch.autograd.grad(out, [weight], g, allow_unused=True)[0]


def _embed_gradient(fn) -> str | None:
    """None if autograd gives ``weight`` the gradient of the embedding, ``one_hot(idx)ᵀ g`` (the values are checked
    first), else why not: judged by the gradient autograd computes, not by the names of its nodes."""
    idx, g = torch.tensor([[0, 4], [2, 2]]), randn(generator(6), 2, 2, 3)
    weight = randn(generator(5), 5, 3).requires_grad_()
    try:
        out, grad = _value_and_grad(fn, idx, weight, g)
    except Exception as exc:
        if type(exc).__name__ == "ForbiddenCall":  # here or, graded, in the student's process
            return (f"the values are right, but they are looked up, not computed as a matrix product: {exc}. Hint: "
                    "build the one-hot matrix (F.one_hot(idx, V) as weight's dtype, or torch.eye(V)[idx]) and "
                    "multiply it by weight with @.")
        return (f"the values are right, but with a weight that requires a gradient it raised {type(exc).__name__}: "
                f"{str(exc)[:200]}. Hint: an embedding is trained: keep weight in the computation (a NumPy answer "
                "may use weight.detach().numpy()).")
    if not isinstance(out, torch.Tensor):
        return None  # not a tensor (e.g. a NumPy array): only the values can be checked
    if grad is None:
        return ("the values are right, but the result carries no gradient to weight (autograd finds no path to it)"
                " although weight requires one. Hint: do not detach weight (no .detach(), .numpy() or"
                " torch.no_grad()): the gradient of the embedding is the reason to write it as a product.")
    one_hot = torch.nn.functional.one_hot(idx.reshape(-1), 5).to(weight.dtype)  # (N, V)
    expected = one_hot.T @ g.reshape(-1, 3)  # dL/dE = one_hot(idx)ᵀ dL/dY   (V, C)
    msg = describe_difference(grad, expected, atol=1e-12, rtol=1e-12)
    if msg:
        return (f"the values are right, but the gradient autograd gives weight is not one_hot(idx)ᵀ · g: {msg}. "
                "Hint: let autograd differentiate the product one_hot(idx) @ weight (no custom backward).")
    return None


_EMBED_ERRORS = {  # a fragment of PyTorch's error -> the hint for the slip behind it
    "same dtype": " Hint: F.one_hot returns integers (int64), and @ needs both factors in one dtype: convert the"
                  " one-hot matrix with .to(weight.dtype).",
    "shapes cannot be multiplied": " Hint: F.one_hot(idx) alone has max(idx) + 1 columns; the product needs V ="
                                   " weight.shape[0] of them: F.one_hot(idx, num_classes=weight.shape[0]).",
}


def check_one_hot_embed(fn) -> CheckResult:
    """``one_hot_embed(idx, weight)``: one_hot(idx) @ weight, idx (...) int, weight (V, C) -> (..., C); the values,
    and, for a torch result, the gradient autograd gives weight: one_hot(idx)ᵀ g (not a detached weight). A lookup
    of weight's rows (``weight[idx]``, ``F.embedding``, ...) computes the same values and gradient: it is forbidden
    while weight requires a gradient (:data:`~transformer_lab.exercises.forbid.LOOKUP`), as the exercise asks for
    a product."""
    result = check_function("one_hot_embed", fn, _embed_reference, _embed_cases(), compare=_embed_compare)
    if not result.passed:
        hint = next((h for fragment, h in _EMBED_ERRORS.items()
                     if result.message.startswith("raised") and fragment in result.message), "")
        return CheckResult("one_hot_embed", False, result.message + hint) if hint else result
    with forbidding(LOOKUP):
        why = _embed_gradient(fn)
    return result if why is None else CheckResult("one_hot_embed", False, why)


def _closest_reference(key, target):
    return key @ (torch.linalg.pinv(key) @ target)  # K K⁺ s: the orthogonal projection of s on the columns of K


def _closest_cases(seed: int = 3):
    gen = generator(seed)
    yield {"key": randn(gen, 5, 2), "target": randn(gen, 5)}
    yield {"key": randn(gen, 7, 3), "target": randn(gen, 7)}
    yield {"key": randn(gen, 4, 1), "target": torch.tensor([1.0, -1.0, 2.0, 0.5], dtype=torch.float64)}
    yield {"key": randn(gen, 3, 4), "target": randn(gen, 3)}  # T_k <= d_k: every score row is reachable


def _closest_compare(got, expected) -> str | None:
    msg = describe_difference(got, expected, atol=1e-8, rtol=1e-8)
    if msg and isinstance(got, torch.Tensor) and got.shape == expected.shape and _float32_hint(got):
        return msg + _float32_hint(got)
    if msg and isinstance(got, torch.Tensor) and got.shape == expected.shape:
        msg += (" Hint: the answer is K q for the q that minimises |K q - s|, i.e. the orthogonal projection of s on"
                " the span of the columns of K (least squares, or K K⁺ s; K (KᵀK)⁻¹ Kᵀ s needs KᵀK invertible, which"
                " fails when T_k < d_k).")
    return msg


def check_closest_scores(fn) -> CheckResult:
    """``closest_scores(key, target)``: key K (T_k, d_k), target s (T_k,) -> the reachable score row q Kᵀ (T_k,)
    closest to s, i.e. the projection of s on the column span of K."""
    return check_function("closest_scores", fn, _closest_reference, _closest_cases(), compare=_closest_compare)


def _gaps_reference(f, x, y):
    additivity = (f(x + y) - f(x) - f(y)).abs().max().item()  # max |f(x+y) - f(x) - f(y)|
    homogeneity = (f(2 * x) - 2 * f(x)).abs().max().item()  # max |f(2x) - 2 f(x)|
    return additivity, homogeneity


def _gaps_cases(seed: int = 4):
    from transformer_lab.backprop import gelu
    from transformer_lab.norm import layer_norm

    gen = generator(seed)
    W = randn(gen, 6, 6)
    yield {"f": gelu, "x": randn(gen, 3, 6), "y": randn(gen, 3, 6)}
    yield {"f": layer_norm, "x": randn(gen, 2, 6), "y": randn(gen, 2, 6)}
    yield {"f": lambda t: t @ W, "x": randn(gen, 4, 6), "y": randn(gen, 4, 6)}  # linear: both gaps ≈ 0
    yield {"f": torch.tanh, "x": -randn(gen, 5, 6).abs(), "y": -randn(gen, 5, 6).abs()}  # x, y < 0: signed gaps all > 0


def _gaps_compare(got, expected) -> str | None:
    msg = describe_difference(got, expected, atol=1e-9, rtol=1e-9, what="(additivity gap, homogeneity gap)")
    if msg and isinstance(got, tuple | list) and len(got) == 2:
        msg += (" Hint: each gap is the largest absolute value over all entries, of f(x + y) - f(x) - f(y) and of"
                " f(2x) - 2 f(x).")
    return msg


def check_superposition_gaps(fn) -> CheckResult:
    """``superposition_gaps(f, x, y)`` -> ``(max |f(x+y) - f(x) - f(y)|, max |f(2x) - 2 f(x)|)`` as two numbers."""
    return check_function("superposition_gaps", fn, _gaps_reference, _gaps_cases(), compare=_gaps_compare)


EXERCISES = {"attention_by_hand": check_attention_by_hand, "attention": check_attention,
             "split_heads": check_split_heads, "one_hot_embed": check_one_hot_embed,
             "closest_scores": check_closest_scores, "superposition_gaps": check_superposition_gaps}
