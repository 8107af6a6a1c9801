"""Chapter 2: temperature, top-k and top-p filtering, and seeded sampling.

Sampling is checked statistically: with a fixed seed and N = 200,000 draws, every empirical frequency must lie
within 5 standard errors, 5·sqrt(p(1-p)/N) <= 0.0056, of its target probability (a false alarm has probability
< 1e-5 per entry, and the seed is fixed, so the test is deterministic), for ours and for torch.multinomial alike.
"""

import math

import pytest
import torch
import torch.nn.functional as F

from transformer_lab.sampling import filter_logits, sample

N = 200_000


def within_tolerance(ids, target):
    freq = torch.bincount(ids.reshape(-1), minlength=target.numel()).double() / ids.numel()
    se = torch.sqrt(target * (1 - target) / ids.numel())
    return (freq - target).abs() <= 5 * se + 1e-12, freq


LOGITS = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0], dtype=torch.float64)


@pytest.mark.parametrize(("kwargs", "expected_kept"), [
    ({}, [0, 1, 2, 3, 4, 5]),
    ({"top_k": 3}, [0, 1, 2]),
    ({"top_k": 1}, [0]),
    ({"top_k": 100}, [0, 1, 2, 3, 4, 5]),
    ({"top_p": 0.5}, [0]),  # p_0 = 0.55 already reaches 0.5
    ({"top_p": 0.7}, [0, 1]),
    ({"top_p": 1.0}, [0, 1, 2, 3, 4, 5]),
    ({"temperature": 0.5, "top_p": 0.7}, [0]),  # sharper: p_0 = 0.81
    ({"top_k": 3, "top_p": 0.9}, [0, 1, 2]),
])
def test_filter_keeps_the_right_tokens(kwargs, expected_kept):
    z = filter_logits(LOGITS, **kwargs)
    kept = torch.isfinite(z).nonzero().reshape(-1).tolist()
    assert kept == expected_kept
    T = kwargs.get("temperature", 1.0)
    torch.testing.assert_close(z[kept], LOGITS[kept] / T, atol=0, rtol=0)


def test_top_p_keeps_the_smallest_set_reaching_p():
    g = torch.Generator().manual_seed(0)
    z = torch.randn(50, 30, generator=g, dtype=torch.float64) * 2
    for p in (0.1, 0.5, 0.9, 0.99):
        kept = torch.isfinite(filter_logits(z, top_p=p))
        probs = F.softmax(z, -1)
        mass = (probs * kept).sum(-1)
        assert (mass >= p - 1e-12).all()  # reaches p
        smallest_kept = torch.where(kept, probs, torch.inf).amin(-1)
        assert (mass - smallest_kept < p).all()  # and without its least likely member it would not


def test_ties_at_top_k_are_kept():
    z = torch.tensor([1.0, 3.0, 3.0, 2.0, 3.0])
    assert torch.isfinite(filter_logits(z, top_k=2)).sum() == 3


@pytest.mark.parametrize("kwargs", [{}, {"temperature": 0.7}, {"top_k": 3}, {"top_p": 0.8},
                                    {"temperature": 1.5, "top_k": 4, "top_p": 0.95}])
def test_sample_frequencies_match_target_and_torch_multinomial(kwargs):
    target = F.softmax(filter_logits(LOGITS, **kwargs), -1)
    ours = sample(LOGITS.expand(N, -1), generator=torch.Generator().manual_seed(1), **kwargs)
    assert ours.shape == (N,)
    assert ours.dtype == torch.int64
    ok, freq = within_tolerance(ours, target)
    assert ok.all(), (freq, target)
    assert (freq[target == 0] == 0).all()  # a removed token is never drawn
    ref = torch.multinomial(target, N, replacement=True, generator=torch.Generator().manual_seed(1))
    ok_ref, freq_ref = within_tolerance(ref, target)
    assert ok_ref.all()
    assert (freq - freq_ref).abs().max() < 0.008  # two independent estimates: 5·sqrt(2)·se


def test_sample_is_seeded_and_batched():
    z = torch.randn(4, 3, 10, generator=torch.Generator().manual_seed(2))
    a = sample(z, generator=torch.Generator().manual_seed(7), top_k=5)
    b = sample(z, generator=torch.Generator().manual_seed(7), top_k=5)
    assert a.shape == (4, 3)
    assert torch.equal(a, b)
    assert sample(z[0, 0], generator=torch.Generator().manual_seed(7)).shape == ()


def test_num_samples_draws_many_per_row():
    z = torch.stack([LOGITS, LOGITS.flip(0)])
    ids = sample(z, num_samples=N, generator=torch.Generator().manual_seed(5), top_p=0.95)
    assert ids.shape == (2, N)
    for row, target in zip(ids, F.softmax(filter_logits(z, top_p=0.95), -1), strict=True):
        ok, _ = within_tolerance(row, target)
        assert ok.all()
    one = sample(LOGITS, num_samples=3, generator=torch.Generator().manual_seed(5))
    assert one.shape == (3,)
    with pytest.raises(ValueError, match=r"num_samples must be None or an int >= 1"):
        sample(LOGITS, num_samples=0)


def test_temperature_limits_numerically():
    g = torch.Generator().manual_seed(3)
    cold = sample(LOGITS.expand(5000, -1), temperature=1e-3, generator=g)
    assert (cold == LOGITS.argmax()).all()  # T -> 0: argmax
    hot = sample(LOGITS.expand(N, -1), temperature=1e6, generator=g)
    ok, _ = within_tolerance(hot, torch.full((6,), 1 / 6, dtype=torch.float64))  # T -> inf: uniform
    assert ok.all()


def test_huge_logits_and_minus_inf():
    z = torch.tensor([1e4, 1e4 - 1.0, float("-inf")], dtype=torch.float64)
    ids = sample(z.expand(N, -1), generator=torch.Generator().manual_seed(4))
    ok, freq = within_tolerance(ids, F.softmax(z, -1))
    assert ok.all()
    assert freq[2] == 0


def test_length_one_vocabulary():
    assert torch.equal(sample(torch.zeros(3, 1), top_p=0.5, top_k=1), torch.zeros(3, dtype=torch.int64))


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"temperature": 0}, r"temperature must be a finite number > 0.*argmax"),
    ({"temperature": -1.0}, r"temperature must be a finite number > 0"),
    ({"temperature": math.inf}, r"temperature must be a finite number > 0"),
    ({"top_k": 0}, r"top_k must be None or an int >= 1"),
    ({"top_k": 2.5}, r"top_k must be None or an int >= 1"),
    ({"top_p": 0.0}, r"top_p must be None or a number in \(0, 1\]"),
    ({"top_p": 1.5}, r"top_p must be None or a number in \(0, 1\]"),
    ({"top_p": -0.1}, r"top_p must be None or a number in \(0, 1\]"),
])
def test_bad_parameters(kwargs, match):
    for fn in (filter_logits, sample):
        with pytest.raises(ValueError, match=match):
            fn(LOGITS, **kwargs)


@pytest.mark.parametrize(("logits", "match"), [
    (torch.tensor([1, 2, 3]), r"floating-point tensor of shape \(\.\.\., V\)"),
    (torch.tensor(1.0), r"floating-point tensor of shape \(\.\.\., V\)"),
    (torch.zeros(2, 0), r"at least one token"),
    ([0.1, 0.2], r"floating-point tensor"),
])
def test_bad_logits(logits, match):
    with pytest.raises(ValueError, match=match):
        sample(logits)


def test_nan_logits():
    with pytest.raises(ValueError, match=r"NaN"):
        sample(torch.tensor([0.0, float("nan")]))
