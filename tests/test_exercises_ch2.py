"""Chapter 2 exercise checkers: each accepts the reference solution and rejects wrong ones, saying what differs."""

import pytest
import torch
from conftest import assert_rejected

from transformer_lab.exercises import ch2, registry


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


def test_registry():
    assert registry(2) == ch2.EXERCISES
    assert set(ch2.EXERCISES) == {"stable_softmax", "top_p_filter", "sequence_log_prob"}


@pytest.mark.parametrize("fn", [stable_softmax, top_p_filter, sequence_log_prob])
def test_solutions_pass(fn):
    result = ch2.EXERCISES[fn.__name__](fn)
    assert result.passed, result.message


def test_stub_says_not_written():
    def stable_softmax(z):
        raise NotImplementedError
    assert "not written yet" in ch2.check_stable_softmax(stable_softmax).message


@pytest.mark.parametrize(("wrong", "words"), [
    (lambda z: torch.exp(z) / torch.exp(z).sum(-1, keepdim=True), ["NaN", "case 3"]),  # naive: overflows
    (lambda z: torch.exp(z - z.max()) / torch.exp(z - z.max()).sum(-1, keepdim=True),
     ["NaN", "case 5"]),  # one max for the whole batch: a row far below it underflows
    (lambda z: stable_softmax(z.T).T if z.dim() > 1 else stable_softmax(z), ["differs in", "case 2"]),  # wrong dim
    (lambda z: stable_softmax(z).sum(-1), ["shape"]),
])
def test_wrong_softmax_rejected(wrong, words):
    assert_rejected(ch2.check_stable_softmax, wrong, *words)


def _cum_including_self(logits, top_p):  # drops the token that crosses p: may remove everything
    sorted_z, order = torch.sort(logits, dim=-1, descending=True)
    drop_sorted = torch.cumsum(torch.softmax(sorted_z, -1), -1) > top_p
    return logits.masked_fill(torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted), float("-inf"))


def _unsorted(logits, top_p):  # forgets to sort
    p = torch.softmax(logits, -1)
    return logits.masked_fill((torch.cumsum(p, -1) - p) >= top_p, float("-inf"))


@pytest.mark.parametrize(("wrong", "words"), [
    (_cum_including_self, ["differs in", "case 1"]),
    (_unsorted, ["differs in", "case 2"]),
    (lambda logits, top_p: torch.where(torch.softmax(logits, -1) >= 1 - top_p, logits, -torch.inf), ["differs"]),
])
def test_wrong_top_p_rejected(wrong, words):
    assert_rejected(ch2.check_top_p_filter, wrong, *words)


@pytest.mark.parametrize(("wrong", "words"), [
    (lambda logits, tokens: torch.softmax(logits, -1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1).prod(-1),
     ["differs in"]),  # a probability, not a log-probability
    (lambda logits, tokens: torch.log(torch.exp(logits) / torch.exp(logits).sum(-1, keepdim=True))
     .gather(-1, tokens.unsqueeze(-1)).squeeze(-1).sum(-1), ["case 3"]),  # naive: -inf / NaN on huge logits
    (lambda logits, tokens: sequence_log_prob(logits, tokens).mean() if logits.dim() > 2
     else sequence_log_prob(logits, tokens), ["shape", "case 2"]),  # averaged over the batch
])
def test_wrong_sequence_log_prob_rejected(wrong, words):
    assert_rejected(ch2.check_sequence_log_prob, wrong, *words)
