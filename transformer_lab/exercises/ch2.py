"""Chapter 2 exercises (probability): a stable softmax, the softmax Jacobian, the temperature limits, nucleus
filtering, the chain rule in log space, and the chi-square statistic of a sampler check.

Each ``check_<name>(fn)`` compares a student's function with ours on float64 inputs (random rows, logits of
±1000 and more, tied logits, rows whose maximum is not the first entry, a nucleus that reaches ``top_p`` exactly,
length-1 sequences, a count at a removed token) and returns a :class:`~transformer_lab.exercises.CheckResult`
saying what differs. A hint is added only when the student's output on the failing case equals what a typical
mistake gives (or shows its symptom, such as NaN, or float32 round-off in a float32-representable answer), so it
never blames the wrong mistake.
"""

from __future__ import annotations

import inspect
import math
import re
from collections.abc import Callable

import torch

from transformer_lab.exercises import CheckResult, check_function, generator, randn
from transformer_lab.exercises.forbid import SOFTMAX
from transformer_lab.sampling import filter_logits
from transformer_lab.softmax import log_softmax
from transformer_lab.softmax import softmax as _softmax
from transformer_lab.softmax import softmax_jacobian as _jacobian_from_p

__all__ = ["EXERCISES", "check_chi_square_statistic", "check_sequence_log_prob", "check_softmax_jacobian_at",
           "check_stable_softmax", "check_temperature_limit", "check_top_p_filter"]

Mistake = tuple[Callable[[dict, torch.Tensor, torch.Tensor], bool], str]  # ((case, got, expected) -> shows it?, hint)


def _same(got, value: torch.Tensor) -> bool:
    """``got`` equals ``value`` (NaN where it is NaN) up to round-off (1e-6 relative): the same formula."""
    return (isinstance(got, torch.Tensor) and got.shape == value.shape
            and torch.allclose(got.detach().double(), value.double(), rtol=1e-6, atol=1e-9, equal_nan=True))


def _like(mistake: Callable) -> Callable[[dict, torch.Tensor, torch.Tensor], bool]:
    """A predicate: on this case ``mistake`` gives a wrong answer, and the student's output is that answer."""
    def matches(case: dict, got, expected) -> bool:
        with torch.no_grad():
            value = mistake(**case)
        return _same(got, value) and not _same(expected, value)
    return matches


def _has_nan(case: dict, got, expected) -> bool:
    return isinstance(got, torch.Tensor) and bool(torch.isnan(got).any())


_BROADCAST_HINT = ("the shapes do not broadcast; common causes: a reduction over the last dimension without "
                   "keepdim=True (z.amax(dim=-1, keepdim=True) keeps it), or .T on a batch, which reverses every "
                   "dimension (.transpose(-2, -1) swaps the last two)")


def _check(name: str, fn, reference, cases, mistakes: list[Mistake], broadcast_hint: str = _BROADCAST_HINT,
           **tol) -> CheckResult:
    """:func:`check_function`, then the hint of the first typical mistake that the failing output matches
    (``broadcast_hint`` when the student's code raised a shape-mismatch error)."""
    cases = list(cases)
    result = check_function(name, fn, reference, cases, **tol)
    found = re.search(r"\(on case (\d+):", result.message)
    if result.message.startswith("raised RuntimeError") and "must match the size of tensor" in result.message:
        return CheckResult(result.name, False, f"{result.message} (hint: {broadcast_hint})")
    if result.passed or found is None or result.message.startswith("raised") or "has shape" in result.message:
        return result
    case = cases[int(found.group(1)) - 1]
    clone = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in case.items()}
    try:
        got = fn(*(clone[p] for p in inspect.signature(reference).parameters))
    except Exception:  # it ran once already; a second failure just means no hint
        return result
    expected = reference(**case)
    for matches, hint in mistakes:
        try:
            hit = matches(case, got, expected)
        except Exception:
            hit = False
        if hit:
            return CheckResult(result.name, False, f"{result.message} (hint: {hint})")
    return result


def _softmax_reference(z):
    return _softmax(z, dim=-1)


def _softmax_cases(seed: int = 0):
    gen = generator(seed)
    yield {"z": randn(gen, 5)}
    yield {"z": randn(gen, 3, 7, scale=4)}
    yield {"z": randn(gen, 2, 4) + 1000.0}  # exp(1000) overflows: only a shifted softmax survives
    yield {"z": torch.tensor([[-800.0, -801.0, -799.0]], dtype=torch.float64)}  # every exp underflows to 0
    yield {"z": torch.tensor([[0.0, 1.0, 2.0], [-900.0, -899.0, -901.0]], dtype=torch.float64)}  # rows far apart
    yield {"z": torch.tensor([[0.5], [-3.0]], dtype=torch.float64)}  # one-token vocabulary
    # a shift by the row minimum, mean or first entry leaves an exponent of +1000 in one of these rows
    yield {"z": torch.tensor([[0.0, -1000.0], [-1000.0, 0.0], [0.0, -2000.0]], dtype=torch.float64)}
    yield {"z": torch.tensor([[2.0, 2.0, -1.0], [0.0, 0.0, 0.0]], dtype=torch.float64)}  # tied maxima
    yield {"z": randn(gen, 2, 3, 4, scale=3)}  # 3-D: only dim=-1 is right (a softmax over dim 1 passes 2-D cases)


def _shifted(shift):
    def softmax_shifted(z):
        e = torch.exp(z - shift(z))
        return e / e.sum(-1, keepdim=True)
    return softmax_shifted


def _float32_like(case, got, expected) -> bool:
    """float32 round-off: the answer is float32 (or exactly representable in float32) and within 1e-6."""
    if not isinstance(got, torch.Tensor) or got.shape != expected.shape or not got.is_floating_point():
        return False
    got = got.detach()
    in_float32 = got.dtype == torch.float32 or torch.equal(got.double(), got.float().double())
    return in_float32 and float((got.double() - expected).abs().max()) < 1e-6


_FLOAT32_HINT = (_float32_like, "the difference is float32 round-off: compute in the input's dtype (float64), "
                                "without converting to float32")


_SOFTMAX_MISTAKES: list[Mistake] = [
    (_like(_shifted(lambda z: z.max())), "one maximum for the whole batch leaves a row far below it with exp = 0 "
                                         "everywhere: use each row's own maximum, amax(dim=-1, keepdim=True)"),
    (_like(_shifted(lambda z: 0)), "exp(1000) overflows: subtract each row's maximum before exp"),
    (lambda c, got, e: any(_like(_shifted(s))(c, got, e) for s in (lambda z: z.amin(-1, keepdim=True),
                                                             lambda z: z.mean(-1, keepdim=True),
                                                             lambda z: z[..., :1])),
     "shift each row by its own maximum, so that every exponent is <= 0; a shift by the row's minimum, mean or "
     "first entry still leaves an exponent of +1000 here"),
    (lambda c, got, e: any(_like(lambda z, d=d: _softmax(z, dim=d))(c, got, e) for d in range(c["z"].dim() - 1)),
     "the softmax is over the last dimension (dim=-1), each row separately"),
    (_like(lambda z: torch.exp(z - z.amax(-1, keepdim=True)) / torch.exp(z - z.amax(-1, keepdim=True)).sum()),
     "normalise each row by its own sum, e.sum(dim=-1, keepdim=True): e.sum() adds up the whole batch"),
    _FLOAT32_HINT,
]


def check_stable_softmax(fn) -> CheckResult:
    """``stable_softmax(z)``: softmax over the last dimension that survives logits of ±1000 in any position."""
    return _check("stable_softmax", fn, _softmax_reference, _softmax_cases(), _SOFTMAX_MISTAKES,
                  atol=1e-12, rtol=1e-10, forbidden=SOFTMAX)


def _jacobian_reference(z):
    return _jacobian_from_p(_softmax(z, dim=-1))  # J = diag(p) - p pᵀ with p = softmax(z)   (..., n, n)


def _jacobian_cases(seed: int = 4):
    gen = generator(seed)
    yield {"z": torch.tensor([1.0, 0.0, -1.0], dtype=torch.float64)}
    yield {"z": randn(gen, 4, 5, scale=2)}  # a batch: one n x n matrix per row
    yield {"z": torch.tensor([[3.0, 3.0, 0.0, -2.0]], dtype=torch.float64) + 1000.0}  # needs the stable softmax
    yield {"z": torch.tensor([0.7], dtype=torch.float64)}  # n = 1: J = p(1 - p) = 0


def _diag(z):
    return torch.diag_embed(_softmax(z, dim=-1))


def _outer(z):
    p = _softmax(z, dim=-1)
    return p.unsqueeze(-1) * p.unsqueeze(-2)


_JACOBIAN_MISTAKES: list[Mistake] = [
    (_like(lambda z: -_jacobian_reference(z)), "the sign is flipped: ∂p_i/∂z_i = p_i(1 - p_i) > 0 on the diagonal, "
                                               "so J = diag(p) - p pᵀ"),
    (_like(_diag), "diag(p) alone forgets that raising z_j lowers every other p_i: subtract p pᵀ"),
    (_like(lambda z: -_outer(z)), "-p pᵀ alone forgets the δ_ij term: add diag(p)"),
    (_like(lambda z: torch.diag_embed(z) - z.unsqueeze(-1) * z.unsqueeze(-2)),
     "the formula is in terms of p = softmax(z), not of the logits z"),
    (_like(lambda z: torch.eye(z.shape[-1], dtype=z.dtype) - _softmax(z, dim=-1).unsqueeze(-2).expand(
        *z.shape, z.shape[-1])), "that is the Jacobian of log-softmax, I - 1 pᵀ; multiply row i by p_i"),
    (_has_nan, "exp overflows for logits near 1000: compute p with a stable (max-shifted) softmax"),
    (_like(lambda z: _jacobian_from_p(_softmax(z, dim=0))),
     "p = softmax(z) is over the last dimension (dim=-1), each row separately"),
    _FLOAT32_HINT,
]


def check_softmax_jacobian_at(fn) -> CheckResult:
    """``softmax_jacobian_at(z)``: ∂softmax(z)_i/∂z_j = p_i(δ_ij - p_j), z (..., n) -> (..., n, n)."""
    return _check("softmax_jacobian_at", fn, _jacobian_reference, _jacobian_cases(), _JACOBIAN_MISTAKES,
                  broadcast_hint="the shapes do not broadcast; for a batch (..., n) the outer product p pᵀ is "
                                 "p.unsqueeze(-1) * p.unsqueeze(-2), (..., n, 1) times (..., 1, n) (p.unsqueeze(-1) "
                                 "* p works only for one row); a reduction needs keepdim=True",
                  atol=1e-12, rtol=1e-10)


def _temperature_limit_reference(z, T):
    """lim softmax(z / t) as t -> T, for T = 0 (from above) or T = inf; z (..., V) finite or -inf -> (..., V).

    T -> 0+: the mass is shared equally by the tied maxima. T -> inf: uniform over the tokens with a finite logit
    (a -inf logit gives probability 0 at every T).
    """
    keep = z == z.amax(dim=-1, keepdim=True) if T == 0 else z > float("-inf")  # the tokens sharing the mass
    keep = keep.to(z.dtype)
    return keep / keep.sum(dim=-1, keepdim=True)


def _temperature_limit_cases(seed: int = 5):
    gen = generator(seed)
    z = torch.tensor([1.5, 0.25, -0.5], dtype=torch.float64)
    yield {"z": z, "T": 0.0}
    yield {"z": z, "T": math.inf}
    yield {"z": randn(gen, 4, 6, scale=3), "T": 0.0}  # a batch; the maximum anywhere in the row
    yield {"z": randn(gen, 3, 5, scale=3) + 1000.0, "T": math.inf}
    yield {"z": torch.tensor([[2.0, 2.0, -1.0], [0.0, 0.0, 0.0], [-1.0, 3.0, 3.0]], dtype=torch.float64),
           "T": 0.0}  # tied maxima share the mass
    yield {"z": torch.tensor([[1.0, float("-inf"), 0.0, 0.5]], dtype=torch.float64), "T": math.inf}  # removed token
    # maxima 1e-9 apart are not tied: the limit is one-hot, though softmax(z / 1e-6) is still near (0.5, 0.5)
    yield {"z": torch.tensor([[1.0, 1.0 - 1e-9, 0.0]], dtype=torch.float64), "T": 0.0}
    # no finite float64 t reaches these limits: the gap 5e-324 (the smallest double) divided by any t >= 5e-324 is
    # at most 1, so softmax(z / t) is never one-hot; the gap 3e308 divided by any t <= 1.8e308 is more than 1, so
    # softmax(z / t) is never (1/2, 1/2)
    yield {"z": torch.tensor([0.0, 5e-324], dtype=torch.float64), "T": 0.0}
    yield {"z": torch.tensor([1.5e308, -1.5e308], dtype=torch.float64), "T": math.inf}


def _near_limit(case, got, expected) -> bool:
    """The answer is softmax(z / t) at a finite t (a power of 10 from 1e-300 to 1e300), not the limit."""
    if not isinstance(got, torch.Tensor) or got.shape != expected.shape or not got.is_floating_point():
        return False
    got = got.detach().double()
    with torch.no_grad():
        for k in range(-300, 301):
            value = _softmax(case["z"] / 10.0**k, dim=-1)
            if torch.allclose(got, value, rtol=1e-9, atol=1e-12) and not torch.allclose(expected, value, rtol=1e-12,
                                                                                      atol=1e-12):
                return True
    return False


def _beyond_finite_t(case, got, expected) -> bool:
    """The failing case is one whose limit no finite float64 t reaches (a gap of 5e-324, or logits of ±1.5e308)."""
    z = case["z"]
    return bool((z.isfinite() & (z.abs() > 1e300)).any() or ((z != 0) & (z.abs() < 1e-300)).any())


def _limit_with_ties_by(equal, z, T):
    """The limit with tied maxima found by ``equal(z, z_max)`` (a tolerance, say) instead of ==."""
    if T != 0:
        return _temperature_limit_reference(z, T)
    keep = equal(z, z.amax(dim=-1, keepdim=True)).to(z.dtype)
    return keep / keep.sum(dim=-1, keepdim=True)


def _limit_keep_normalised(keep, z):
    """``keep`` (bool, the tokens sharing the mass) as probabilities in ``z``'s dtype: 1/k on the k kept tokens."""
    keep = keep.to(z.dtype)
    return keep / keep.sum(dim=-1, keepdim=True)


_TIE_TOLERANCE = ("0 and 5e-324 are not tied: they differ (by the smallest double), so as T -> 0 all the mass goes to "
                  "5e-324; your answer never gives a partial split of (0, g), whatever the gap g, so it does not "
                  "evaluate softmax(z / t): it merges near-equal logits with a tolerance (isclose, or |z - max| < "
                  "eps). Compare each logit with the row maximum exactly (==)")


def _one_hot_argmax(z, T):
    return torch.nn.functional.one_hot(z.argmax(-1), z.shape[-1]).to(z.dtype)


_TEMPERATURE_MISTAKES: list[Mistake] = [
    (_beyond_finite_t, "no finite t reaches the limit here: a gap of 5e-324 divided by any t >= 5e-324 is at most 1, "
                       "and a gap of 3e308 divided by any finite t is more than 1; compute the limit exactly, by "
                       "comparing each logit with the row maximum (T -> 0, ties exactly equal) or with -inf "
                       "(T -> inf), not by evaluating softmax(z / t)"),
    (_like(lambda z, T: _one_hot_argmax(z, T) if T == 0 else _temperature_limit_reference(z, T)),
     "tied maxima share the mass equally, 1/k each: argmax picks only the first of them"),
    (_like(lambda z, T: _temperature_limit_reference(z, math.inf if T == 0 else 0.0)),
     "the limits are swapped: as T -> 0 the gaps z_max - z_i are divided by a tiny T and the mass goes to the "
     "maximum; as T -> inf every gap vanishes and the distribution becomes uniform"),
    (_like(lambda z, T: torch.full_like(z, 1 / z.shape[-1]) if T != 0 else _temperature_limit_reference(z, T)),
     "a token with logit -inf has probability 0 at every temperature (-inf / T = -inf): the limit is uniform over "
     "the tokens with a finite logit"),
    (_like(lambda z, T: _limit_with_ties_by(torch.isclose, z, T)),
     "logits 1e-9 apart are not tied: a tolerance (isclose) merges them; compare with the row maximum exactly (==)"),
    (_like(lambda z, T: _softmax(z / T, dim=-1)),
     "that is softmax(z / T) at T itself: z / 0 is ±inf and -inf / inf is NaN, so the softmax gives inf - inf = NaN; "
     "T = 0 and T = inf are limits, not temperatures to divide by: compute each limit exactly"),
    (_like(lambda z, T: _limit_keep_normalised(z == z.max(), z) if T == 0 else _temperature_limit_reference(z, T)),
     "that takes the maximum of the whole tensor, z.max(): a row without it gets 0 / 0 = NaN; compare each logit "
     "with its own row's maximum, z.amax(dim=-1, keepdim=True)"),
    (lambda case, got, expected: any(_like(wrong)(case, got, expected) for wrong in (
        lambda z, T: (z == z.amax(-1, keepdim=True)).to(z.dtype) / z.shape[-1] if T == 0 else (
            _temperature_limit_reference(z, T)),
        lambda z, T: (z > float("-inf")).to(z.dtype) / z.shape[-1] if T != 0 else _temperature_limit_reference(z, T))),
     "the probabilities do not sum to 1: divide by the number of tokens that share the mass (the k tied maxima as "
     "T -> 0, the tokens with a finite logit as T -> inf), not by the vocabulary size V"),
    (_near_limit, "that is softmax at a finite T, not its limit: the limit is exact (1/k on the k tied maxima as "
                  "T -> 0, 1/(number of finite logits) as T -> inf); two logits 1e-9 apart are not tied"),
    _FLOAT32_HINT,
]


def check_temperature_limit(fn) -> CheckResult:
    """``temperature_limit(z, T)``: lim softmax(z / t) as t -> T for T = 0 (from above) or T = inf, exactly."""
    cases = list(_temperature_limit_cases())
    result = _check("temperature_limit", fn, _temperature_limit_reference, cases, _TEMPERATURE_MISTAKES, atol=1e-12,
                    rtol=1e-12)
    gap_case = next(n for n, c in enumerate(cases, start=1) if c["T"] == 0 and _beyond_finite_t(c, None, None))
    if f"(on case {gap_case}:" not in result.message or "no finite t reaches" not in result.message:
        return result
    # the 5e-324 gap fools a finite t and a tie tolerance alike; a gap g between 1 and 1e-323 tells them apart:
    # softmax((0, g) / t) is strictly between (1/2, 1/2) and (0, 1) for g near t, a tie test never is
    try:
        with torch.no_grad():
            outputs = [fn(torch.tensor([0.0, 10.0**-k], dtype=torch.float64), 0.0) for k in range(324)]
        splits = (torch.tensor([0.5, 0.5], dtype=torch.float64), torch.tensor([0.0, 1.0], dtype=torch.float64))
        tie_test = all(isinstance(o, torch.Tensor) and o.shape == (2,) and any(torch.equal(o.double(), v)
                                                                               for v in splits) for o in outputs)
    except Exception:  # a student's bug: keep the hint given
        return result
    if not tie_test:
        return result
    return CheckResult(result.name, False, result.message.split(" (hint: ")[0] + f" (hint: {_TIE_TOLERANCE})")


def _top_p_reference(logits, top_p):
    return filter_logits(logits, top_p=top_p)


def _top_p_cases(seed: int = 1):
    gen = generator(seed)
    yield {"logits": torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0], dtype=torch.float64), "top_p": 0.7}
    yield {"logits": torch.tensor([0.0, 3.0, 1.0, 2.0], dtype=torch.float64), "top_p": 0.5}  # unsorted
    yield {"logits": randn(gen, 4, 20, scale=2), "top_p": 0.9}
    yield {"logits": randn(gen, 3, 10), "top_p": 1.0}  # keeps everything
    yield {"logits": randn(gen, 6, 8, scale=3), "top_p": 0.05}  # keeps only the most probable token
    # probabilities [.1875, .5, .0625, .25]: the two most probable reach p = .75 exactly, so the nucleus is those
    # two; a strict "mass > p" rule keeps a third token. These dyadic values make the boundary exact both for a
    # descending cumulative sum and for an ascending one (Hugging Face's "drop while cumsum <= 1 - p")
    yield {"logits": torch.log(torch.tensor([0.1875, 0.5, 0.0625, 0.25], dtype=torch.float64)), "top_p": 0.75}
    yield {"logits": torch.tensor([[1.0, 1.0, 0.0, -5.0], [3.0, -1.0, 3.0, 0.0]], dtype=torch.float64),
           "top_p": 0.6}  # ties inside the nucleus: both tied tokens are kept
    # ties outside it: p = (0.757, 0.102, 0.102, 0.038), the first token alone reaches 0.5 (far from the boundary),
    # so both tied tokens are dropped
    yield {"logits": torch.tensor([2.0, 0.0, 0.0, -1.0], dtype=torch.float64), "top_p": 0.5}


def _top_p_by_rule(drop_rule, sort=True, restore=True):
    """A top-p variant: sort (or not), drop where ``drop_rule(p, cumsum, top_p)``, put back in order (or not)."""
    def variant(logits, top_p):
        z, order = torch.sort(logits, dim=-1, descending=True) if sort else (logits, None)
        p = torch.softmax(z, dim=-1)
        drop = drop_rule(p, torch.cumsum(p, dim=-1), top_p)
        if sort and restore:
            drop = torch.zeros_like(drop).scatter(-1, order, drop)
            z = logits
        return z.masked_fill(drop, float("-inf"))
    return variant


_TOP_P_MISTAKES: list[Mistake] = [
    (_like(_top_p_by_rule(lambda p, c, t: c - p > t)),
     "keep a token while the mass of the tokens ranked above it is < top_p ('reaches' means >=; some code uses "
     "'> top_p'); here the first two tokens reach 0.75 exactly, so the nucleus has 2 tokens, not 3"),
    (_like(_top_p_by_rule(lambda p, c, t: c > t)),
     "the token whose probability carries the mass past top_p belongs to the nucleus: drop a token only when the "
     "tokens ranked above it already reach top_p"),
    (_like(_top_p_by_rule(lambda p, c, t: c - p >= t, sort=False)),
     "sort by probability, descending, before the cumulative sum, and put the mask back in the original token "
     "order"),
    (_like(_top_p_by_rule(lambda p, c, t: c - p >= t, restore=False)),
     "the result is in sorted order: put the logits back in the original token order (scatter with the sort's "
     "indices)"),
]


def check_top_p_filter(fn) -> CheckResult:
    """``top_p_filter(logits, top_p)``: -inf outside the smallest most-probable set whose mass reaches top_p.

    Ties at the boundary of the nucleus (where the order among equal probabilities would decide) are not tested.
    """
    return _check("top_p_filter", fn, _top_p_reference, _top_p_cases(), _TOP_P_MISTAKES, atol=1e-12, rtol=1e-12)


def _seq_reference(logits, tokens):
    return log_softmax(logits, dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1).sum(-1)  # Σ_t log P(w_t|w_<t)


def _seq_cases(seed: int = 2):
    gen = generator(seed)
    yield {"logits": randn(gen, 4, 6), "tokens": torch.randint(0, 6, (4,), generator=gen)}
    yield {"logits": randn(gen, 3, 5, 9, scale=3), "tokens": torch.randint(0, 9, (3, 5), generator=gen)}
    yield {"logits": randn(gen, 2, 30) * 300 + 800, "tokens": torch.randint(0, 30, (2,), generator=gen)}  # huge
    yield {"logits": randn(gen, 1, 4), "tokens": torch.tensor([3])}  # length-1 sequence
    # the chosen token sits 800 below the maximum: log(softmax) takes the log of exp(-800) = 0 and gives -inf
    yield {"logits": torch.tensor([[0.0, -800.0, 3.0], [1.0, 1.0, 1.0]], dtype=torch.float64),
           "tokens": torch.tensor([1, 2])}


def _picked(values, tokens):
    return values.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)  # values[..., t, tokens[..., t]]   (..., L)


_SEQ_MISTAKES: list[Mistake] = [
    (_like(lambda logits, tokens: -_seq_reference(logits, tokens)),
     "the sign is flipped: that is the negative log-likelihood (the loss); a log-probability is <= 0"),
    (_like(lambda logits, tokens: _picked(_softmax(logits, dim=-1), tokens).prod(-1)),
     "that is the probability itself: sum log-probabilities over t, do not multiply probabilities"),
    (_like(lambda logits, tokens: _picked(log_softmax(logits, dim=-1), tokens).mean(-1)),
     "sum over the positions t, do not average"),
    (_like(lambda logits, tokens: _picked(log_softmax(logits[..., :-1, :], dim=-1), tokens[..., 1:]).sum(-1)),
     "the inputs are already aligned: logits[..., t, :] scores tokens[..., t], no shift"),
    (lambda case, got, expected: isinstance(got, torch.Tensor) and bool(torch.isinf(got).any())
     and bool(torch.isinf(torch.exp(case["logits"])).any()),
     "exp(z) overflows for these logits, so log Σ exp(z) = log(inf) = inf and the log-probability comes out -inf: "
     "shift by the max first, i.e. use logsumexp (or log_softmax)"),
    (lambda case, got, expected: isinstance(got, torch.Tensor) and bool(torch.isinf(got).any()),
     "log(softmax(z)) is -inf when a probability rounds to 0; use z - logsumexp(z), i.e. log_softmax"),
    (_has_nan, "exp(z) overflows for logits near 1000: use log_softmax (z - logsumexp(z)), which shifts by the max"),
    (_like(lambda logits, tokens: _picked(logits, tokens).sum(-1)),
     "those are the raw logits of the tokens: a log-probability is z_y - logsumexp(z), normalise with log_softmax"),
    (_like(lambda logits, tokens: _picked(log_softmax(logits, dim=-2), tokens).sum(-1)),
     "log_softmax over the vocabulary (dim=-1), not over the positions (dim=-2)"),
    _FLOAT32_HINT,
]


def check_sequence_log_prob(fn) -> CheckResult:
    """``sequence_log_prob(logits, tokens)``: Σ_t log softmax(logits[..., t, :])[tokens[..., t]], (..., L, V) -> (...).

    ``logits[..., t, :]`` is the model's score for the token ``tokens[..., t]`` (already aligned: no shift).
    """
    cases = list(_seq_cases())
    result = _check("sequence_log_prob", fn, _seq_reference, cases, _SEQ_MISTAKES, atol=1e-9, rtol=1e-10)
    found = re.search(r"\(on case (\d+):", result.message)
    if found is None or "exp(z) overflows for these logits" not in result.message:
        return result
    # -inf where exp(z) overflows, or where a product of probabilities underflows? The same logits shifted down
    # (the same log-probabilities, no overflow) tell them apart: the log of a product is -inf there too
    case = cases[int(found.group(1)) - 1]
    shifted = {"logits": case["logits"] - case["logits"].amax(), "tokens": case["tokens"]}
    try:
        with torch.no_grad():
            got = fn(shifted["logits"].clone(), shifted["tokens"].clone())
        product = torch.log(_picked(_softmax(shifted["logits"], dim=-1), shifted["tokens"]).prod(-1))
    except Exception:  # a student's bug: keep the hint given
        return result
    if not (isinstance(got, torch.Tensor) and bool(torch.isinf(got).any()) and _same(got, product)):
        return result
    return CheckResult(result.name, False, result.message.split(" (hint: ")[0] + (
        " (hint: the product of the probabilities underflows to 0 (it is about e^-800 here), so its log is -inf, even"
        " for these logits shifted down so that no exp overflows: take the log of each probability first and sum"
        " the logs (log_softmax, then sum over t), never the log of a product)"))


def _chi2_reference(counts, probs):
    n = counts.sum(-1, keepdim=True).double()  # N, the number of draws of each row   (..., 1)
    expected = n * probs  # E_i = N p_i
    terms = torch.where(probs > 0, (counts - expected) ** 2 / torch.where(probs > 0, expected, 1.0), 0.0)
    return terms.sum(-1)  # X² = Σ_{p_i > 0} (O_i - E_i)² / E_i   (...)


def _chi2_cases(seed: int = 3):
    gen = generator(seed)
    p = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    yield {"counts": torch.tensor([48, 33, 19]), "probs": p}
    q = torch.softmax(randn(gen, 4, 6), -1)
    yield {"counts": torch.stack([torch.multinomial(row, 500, replacement=True, generator=gen).bincount(minlength=6)
                                  for row in q]), "probs": q}  # a batch: N per row
    yield {"counts": torch.tensor([[70, 0, 30, 0], [10, 0, 0, 10]]),
           "probs": torch.tensor([[0.6, 0.0, 0.4, 0.0], [0.25, 0.0, 0.25, 0.5]], dtype=torch.float64)}  # p = 0
    yield {"counts": torch.tensor([1030, 1950, 7020]), "probs": torch.tensor([0.1, 0.2, 0.7], dtype=torch.float64)}
    # a removed token (p = 0) that was drawn twice: it is still left out of X² (the count check catches it)
    yield {"counts": torch.tensor([60, 2, 38]), "probs": torch.tensor([0.6, 0.0, 0.4], dtype=torch.float64)}


def _chi2_with(divide_by=None, n=None, power=2):
    """X² with one ingredient changed: the denominator, the N, or |O - E|^power."""
    def variant(counts, probs):
        total = counts.sum(-1, keepdim=True).double() if n is None else n(counts, probs)
        expected = total * probs
        den = expected if divide_by is None else divide_by(counts, expected)
        keep = probs > 0
        terms = (counts - expected).abs() ** power / torch.where(keep, den, 1.0)
        return torch.where(keep, terms, 0.0).sum(-1)
    return variant


def _counted_removed(case, got, expected) -> bool:
    """A count at a p = 0 token turned into an enormous or infinite term."""
    drawn_removed = ((case["probs"] == 0) & (case["counts"] > 0)).any()
    return bool(drawn_removed) and isinstance(got, torch.Tensor) and bool((got.detach().abs() > 1e6).any())


_CHI2_MISTAKES: list[Mistake] = [
    (_has_nan, "leave out the tokens with p_i = 0: their expected count is 0, and 0/0 is NaN"),
    (_counted_removed, "leave out the tokens with p_i = 0 even when their count is not 0: dividing by a zero (or "
                       "tiny) expected count explodes; a drawn removed token is caught by its count, not by X²"),
    (_like(lambda counts, probs: _chi2_reference(counts, probs) / counts.sum(-1)),
     "use counts, not frequencies: with frequencies the statistic is X² / N"),
    (_like(_chi2_with(divide_by=lambda counts, expected: counts.double())),
     "divide by the expected count E_i = N p_i, not the observed one (that is Neyman's statistic)"),
    (_like(_chi2_with(n=lambda counts, probs: counts.sum().double())),
     "N is the number of draws of each row, counts.sum(-1), not of the whole batch"),
    (_like(_chi2_with(n=lambda counts, probs: torch.tensor(float(counts.shape[-1]), dtype=torch.float64))),
     "N is the number of draws, counts.sum(-1), not the number of tokens"),
    (_like(_chi2_with(power=1)), "square the difference: (O_i - E_i)², not |O_i - E_i|"),
    (_like(_chi2_with(n=lambda counts, probs: torch.where(probs > 0, counts, 0).sum(-1, keepdim=True).double())),
     "N is every draw of the row, counts.sum(-1), including the draws of removed tokens (p_i = 0)"),
    _FLOAT32_HINT,
]


def check_chi_square_statistic(fn) -> CheckResult:
    """``chi_square_statistic(counts, probs)``: Pearson's X² = Σ_{p_i > 0} (O_i - N p_i)² / (N p_i) over the last
    dimension, counts (..., V) int, probs (..., V) -> (...)."""
    return _check("chi_square_statistic", fn, _chi2_reference, _chi2_cases(), _CHI2_MISTAKES,
                  atol=1e-9, rtol=1e-10)


EXERCISES = {"stable_softmax": check_stable_softmax, "softmax_jacobian_at": check_softmax_jacobian_at,
             "temperature_limit": check_temperature_limit, "top_p_filter": check_top_p_filter,
             "sequence_log_prob": check_sequence_log_prob, "chi_square_statistic": check_chi_square_statistic}
