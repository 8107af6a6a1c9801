"""Chapter 2 exercises (probability): a stable softmax, nucleus filtering, the chain rule in log space, and the
chi-square statistic of a sampler check.

Each ``check_<name>(fn)`` compares a student's function with ours on float64 inputs (random rows, logits of
±1000 and more, tied logits, rows whose maximum is not the first entry, a nucleus that reaches ``top_p`` exactly,
length-1 sequences) and returns a :class:`~transformer_lab.exercises.CheckResult` saying what differs, with a hint
for the typical mistake where the failing case points to one.
"""

from __future__ import annotations

import torch

from transformer_lab.exercises import CheckResult, check_function, randn
from transformer_lab.sampling import filter_logits
from transformer_lab.softmax import log_softmax
from transformer_lab.softmax import softmax as _softmax

__all__ = ["EXERCISES", "check_chi_square_statistic", "check_sequence_log_prob", "check_stable_softmax",
           "check_top_p_filter"]


def _softmax_reference(z):
    return _softmax(z, dim=-1)


def _softmax_cases(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    yield {"z": randn(gen, 5)}
    yield {"z": randn(gen, 3, 7, scale=4)}
    yield {"z": randn(gen, 2, 4) + 1000.0}  # exp(1000) overflows: only a shifted softmax survives
    yield {"z": torch.tensor([[-800.0, -801.0, -799.0]], dtype=torch.float64)}  # every exp underflows to 0
    yield {"z": torch.tensor([[0.0, 1.0, 2.0], [-900.0, -899.0, -901.0]], dtype=torch.float64)}  # rows far apart
    yield {"z": torch.tensor([[0.5], [-3.0]], dtype=torch.float64)}  # one-token vocabulary
    # a shift by the row minimum, mean or first entry leaves an exponent of +1000 in one of these rows
    yield {"z": torch.tensor([[0.0, -1000.0], [-1000.0, 0.0], [0.0, -2000.0]], dtype=torch.float64)}
    yield {"z": torch.tensor([[2.0, 2.0, -1.0], [0.0, 0.0, 0.0]], dtype=torch.float64)}  # tied maxima


_SHIFT_HINT = {7: " (hint: shift each row by its own maximum, so that every exponent is <= 0; a shift by the "
                  "row's minimum, mean or first entry still leaves an exponent of +1000 here)",
               3: " (hint: exp(1000) overflows; subtract each row's maximum before exp)",
               5: " (hint: one maximum for the whole batch leaves a row far below it with exp = 0 everywhere: "
                  "use each row's own maximum, amax(dim=-1, keepdim=True))"}


def _with_hint(result: CheckResult, hints: dict[int, str]) -> CheckResult:
    """``result`` with the hint for its failing case appended (the message ends in "(on case n: ...)"); a wrong
    shape or a crash explains itself and gets no hint."""
    if result.passed or "has shape" in result.message or result.message.startswith("raised"):
        return result
    for case, hint in hints.items():
        if f"on case {case}:" in result.message:
            return CheckResult(result.name, False, result.message + hint)
    return result


def check_stable_softmax(fn) -> CheckResult:
    """``stable_softmax(z)``: softmax over the last dimension that survives logits of ±1000 in any position."""
    result = check_function("stable_softmax", fn, _softmax_reference, _softmax_cases(), atol=1e-12, rtol=1e-10)
    return _with_hint(result, _SHIFT_HINT)


def _top_p_reference(logits, top_p):
    return filter_logits(logits, top_p=top_p)


def _top_p_cases(seed: int = 1):
    gen = torch.Generator().manual_seed(seed)
    yield {"logits": torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0], dtype=torch.float64), "top_p": 0.7}
    yield {"logits": torch.tensor([0.0, 3.0, 1.0, 2.0], dtype=torch.float64), "top_p": 0.5}  # unsorted
    yield {"logits": randn(gen, 4, 20, scale=2), "top_p": 0.9}
    yield {"logits": randn(gen, 3, 10), "top_p": 1.0}  # keeps everything
    yield {"logits": randn(gen, 6, 8, scale=3), "top_p": 0.05}  # keeps only the most probable token
    # probabilities exactly [.5, .25, .125, .125] (tied last two): the first two reach p = .75 exactly, so the
    # nucleus is those two; a strict "mass > p" rule keeps a third token
    yield {"logits": torch.log(torch.tensor([0.125, 0.5, 0.125, 0.25], dtype=torch.float64)), "top_p": 0.75}
    yield {"logits": torch.tensor([[1.0, 1.0, 0.0, -5.0], [3.0, -1.0, 3.0, 0.0]], dtype=torch.float64),
           "top_p": 0.6}  # ties inside the nucleus: every tied token is kept or dropped together


_TOP_P_HINT = {6: " (hint: keep a token while the mass of the tokens ranked above it is < top_p; here the first "
                  "two tokens reach 0.75 exactly, so the nucleus has 2 tokens, not 3)",
               2: " (hint: sort by probability, descending, before the cumulative sum, and put the mask back in "
                  "the original token order)"}


def check_top_p_filter(fn) -> CheckResult:
    """``top_p_filter(logits, top_p)``: -inf outside the smallest most-probable set whose mass reaches top_p.

    Ties at the boundary of the nucleus (where the order among equal probabilities would decide) are not tested.
    """
    result = check_function("top_p_filter", fn, _top_p_reference, _top_p_cases(), atol=1e-12, rtol=1e-12)
    return _with_hint(result, _TOP_P_HINT)


def _seq_reference(logits, tokens):
    return log_softmax(logits, dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1).sum(-1)  # Σ_t log P(w_t|w_<t)


def _seq_cases(seed: int = 2):
    gen = torch.Generator().manual_seed(seed)
    yield {"logits": randn(gen, 4, 6), "tokens": torch.randint(0, 6, (4,), generator=gen)}
    yield {"logits": randn(gen, 3, 5, 9, scale=3), "tokens": torch.randint(0, 9, (3, 5), generator=gen)}
    yield {"logits": randn(gen, 2, 30) * 300 + 800, "tokens": torch.randint(0, 30, (2,), generator=gen)}  # huge
    yield {"logits": randn(gen, 1, 4), "tokens": torch.tensor([3])}  # length-1 sequence
    # the chosen token sits 800 below the maximum: log(softmax) takes the log of exp(-800) = 0 and gives -inf
    yield {"logits": torch.tensor([[0.0, -800.0, 3.0], [1.0, 1.0, 1.0]], dtype=torch.float64),
           "tokens": torch.tensor([1, 2])}


_SEQ_HINT = {5: " (hint: log(softmax(z)) is -inf when a probability rounds to 0; use z - logsumexp(z), i.e. "
                "log_softmax)",
             1: " (hint: logits[..., t, :] scores tokens[..., t]; sum log-probabilities over t, do not multiply "
                "probabilities or average)"}


def check_sequence_log_prob(fn) -> CheckResult:
    """``sequence_log_prob(logits, tokens)``: Σ_t log softmax(logits[..., t, :])[tokens[..., t]], (..., T, V) -> (...).

    ``logits[..., t, :]`` is the model's score for the token ``tokens[..., t]`` (already aligned: no shift).
    """
    result = check_function("sequence_log_prob", fn, _seq_reference, _seq_cases(), atol=1e-9, rtol=1e-10)
    return _with_hint(result, _SEQ_HINT)


def _chi2_reference(counts, probs):
    n = counts.sum(-1, keepdim=True).double()  # N, the number of draws of each row   (..., 1)
    expected = n * probs  # E_i = N p_i
    terms = torch.where(probs > 0, (counts - expected) ** 2 / torch.where(probs > 0, expected, 1.0), 0.0)
    return terms.sum(-1)  # X² = Σ_{p_i > 0} (O_i - E_i)² / E_i   (...)


def _chi2_cases(seed: int = 3):
    gen = torch.Generator().manual_seed(seed)
    p = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    yield {"counts": torch.tensor([48, 33, 19]), "probs": p}
    q = torch.softmax(randn(gen, 4, 6), -1)
    yield {"counts": torch.stack([torch.multinomial(row, 500, replacement=True, generator=gen).bincount(minlength=6)
                                  for row in q]), "probs": q}  # a batch: N per row
    yield {"counts": torch.tensor([[70, 0, 30, 0], [10, 0, 0, 10]]),
           "probs": torch.tensor([[0.6, 0.0, 0.4, 0.0], [0.25, 0.0, 0.25, 0.5]], dtype=torch.float64)}  # p = 0
    yield {"counts": torch.tensor([1030, 1950, 7020]), "probs": torch.tensor([0.1, 0.2, 0.7], dtype=torch.float64)}


_CHI2_HINT = {1: " (hint: X² = Σ (O_i - E_i)² / E_i with E_i = N p_i, N the number of draws: divide by the "
                 "expected count, and use counts, not frequencies)",
              2: " (hint: N is the number of draws of each row, counts.sum(-1), not of the whole batch)",
              3: " (hint: leave out the tokens with p_i = 0; a removed token is checked by its count being 0)"}


def check_chi_square_statistic(fn) -> CheckResult:
    """``chi_square_statistic(counts, probs)``: Pearson's X² = Σ_{p_i > 0} (O_i - N p_i)² / (N p_i) over the last
    dimension, counts (..., V) int, probs (..., V) -> (...)."""
    result = check_function("chi_square_statistic", fn, _chi2_reference, _chi2_cases(), atol=1e-9, rtol=1e-10)
    return _with_hint(result, _CHI2_HINT)


EXERCISES = {"stable_softmax": check_stable_softmax, "top_p_filter": check_top_p_filter,
             "sequence_log_prob": check_sequence_log_prob, "chi_square_statistic": check_chi_square_statistic}
