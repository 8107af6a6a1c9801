"""Chapter 2 exercises (probability): a stable softmax, nucleus filtering, and the chain rule in log space.

Each ``check_<name>(fn)`` compares a student's function with ours on random float64 inputs (huge logits, ties,
length-1 sequences included) and returns a :class:`~transformer_lab.exercises.CheckResult` saying what differs.
"""

from __future__ import annotations

import torch

from transformer_lab.exercises import CheckResult, check_function, randn
from transformer_lab.sampling import filter_logits
from transformer_lab.softmax import log_softmax
from transformer_lab.softmax import softmax as _softmax

__all__ = ["EXERCISES", "check_sequence_log_prob", "check_stable_softmax", "check_top_p_filter"]



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


def check_stable_softmax(fn) -> CheckResult:
    """``stable_softmax(z)``: softmax over the last dimension that survives logits of ±1000."""
    return check_function("stable_softmax", fn, _softmax_reference, _softmax_cases(), atol=1e-12, rtol=1e-10)


def _top_p_reference(logits, top_p):
    return filter_logits(logits, top_p=top_p)


def _top_p_cases(seed: int = 1):
    gen = torch.Generator().manual_seed(seed)
    yield {"logits": torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0], dtype=torch.float64), "top_p": 0.7}
    yield {"logits": torch.tensor([0.0, 3.0, 1.0, 2.0], dtype=torch.float64), "top_p": 0.5}  # unsorted
    yield {"logits": randn(gen, 4, 20, scale=2), "top_p": 0.9}
    yield {"logits": randn(gen, 3, 10), "top_p": 1.0}  # keeps everything
    yield {"logits": randn(gen, 6, 8, scale=3), "top_p": 0.05}  # keeps only the most probable token


def check_top_p_filter(fn) -> CheckResult:
    """``top_p_filter(logits, top_p)``: -inf outside the smallest most-probable set whose mass reaches top_p."""
    return check_function("top_p_filter", fn, _top_p_reference, _top_p_cases(), atol=1e-12, rtol=1e-12)


def _seq_reference(logits, tokens):
    return log_softmax(logits, dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1).sum(-1)  # Σ_t log P(w_t|w_<t)


def _seq_cases(seed: int = 2):
    gen = torch.Generator().manual_seed(seed)
    yield {"logits": randn(gen, 4, 6), "tokens": torch.randint(0, 6, (4,), generator=gen)}
    yield {"logits": randn(gen, 3, 5, 9, scale=3), "tokens": torch.randint(0, 9, (3, 5), generator=gen)}
    yield {"logits": randn(gen, 2, 30) * 300 + 800, "tokens": torch.randint(0, 30, (2,), generator=gen)}  # huge
    yield {"logits": randn(gen, 1, 4), "tokens": torch.tensor([3])}  # length-1 sequence


def check_sequence_log_prob(fn) -> CheckResult:
    """``sequence_log_prob(logits, tokens)``: Σ_t log softmax(logits[t])[tokens[t]], logits (..., T, V) -> (...)."""
    return check_function("sequence_log_prob", fn, _seq_reference, _seq_cases(), atol=1e-9, rtol=1e-10)


EXERCISES = {"stable_softmax": check_stable_softmax, "top_p_filter": check_top_p_filter,
             "sequence_log_prob": check_sequence_log_prob}
