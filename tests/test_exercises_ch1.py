"""Chapter 1 exercise checkers: each accepts the reference solution and rejects wrong ones, saying what differs."""

import math

import pytest
import torch
from conftest import assert_rejected

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
    return torch.nn.functional.one_hot(idx, weight.shape[0]).to(weight.dtype) @ weight


def test_registry():
    assert registry(1) == ch1.EXERCISES
    assert set(ch1.EXERCISES) == {"attention", "split_heads", "one_hot_embed"}


@pytest.mark.parametrize("fn", [attention, split_heads, one_hot_embed])
def test_solutions_pass(fn):
    result = ch1.EXERCISES[fn.__name__](fn)
    assert result.passed, result.message


def test_stub_says_not_written():
    def attention(query, key, value, mask=None):
        raise NotImplementedError
    assert_rejected(ch1.check_attention, attention, "not written yet")


@pytest.mark.parametrize(("wrong", "words"), [
    (lambda query, key, value, mask=None: torch.softmax(query @ key.transpose(-2, -1), -1) @ value,
     ["differs in", "case 1"]),  # forgot 1/sqrt(d_k)
    (lambda query, key, value, mask=None: torch.softmax(query @ key.transpose(-2, -1) / math.sqrt(query.shape[-1]),
                                                        -2) @ value, ["differs in"]),  # softmax over queries
    (lambda query, key, value, mask=None: attention(query, key, value), ["differs", "case 3", "mask"]),  # no mask
    (lambda query, key, value, mask=None: attention(query, key, value, mask)[..., :1], ["shape"]),
    (lambda query, key, value: attention(query, key, value), ["unexpected keyword argument 'mask'", "case 3"]),
])
def test_wrong_attention_rejected(wrong, words):
    assert_rejected(ch1.check_attention, wrong, *words)


@pytest.mark.parametrize(("wrong", "words"), [
    (lambda x, n_head: x.reshape(x.shape[0], n_head, x.shape[1], -1), ["differs in", "case 1"]),  # no transpose
    (lambda x, n_head: x.reshape(x.shape[0], x.shape[1], n_head, -1), ["differs in", "worst at"]),  # (B, T, h, d)
    (lambda x, n_head: x.reshape(x.shape[0], x.shape[1], -1, n_head).permute(0, 3, 1, 2), ["differs in"]),
])
def test_wrong_split_heads_rejected(wrong, words):
    assert_rejected(ch1.check_split_heads, wrong, *words)


@pytest.mark.parametrize(("wrong", "words"), [
    (lambda idx, weight: weight[idx.reshape(-1)], ["shape", "case 2"]),  # flattens the batch
    (lambda idx, weight: weight[(idx + 1) % weight.shape[0]], ["differs in", "case 1"]),  # off by one
    (lambda idx, weight: torch.nn.functional.one_hot(idx, weight.shape[0]).to(weight.dtype) @ weight.T[:, :1],
     ["shape"]),  # multiplies by the wrong matrix
])
def test_wrong_embed_rejected(wrong, words):
    assert_rejected(ch1.check_one_hot_embed, wrong, *words)
