"""Chapter 2: temperature, top-k and top-p filtering, and seeded sampling.

Sampling is checked statistically, with fixed seeds (so every test is deterministic) and N = 200,000 draws:
* every empirical frequency lies within 5 standard errors, 5·sqrt(p(1-p)/N) <= 0.0056, of its target probability
  (a false alarm has probability about 6e-7 per entry);
* Pearson's chi-square goodness-of-fit test against the target, and the two-sample chi-square test between our draws
  and torch.multinomial's (drawn from ANOTHER seed, so the two are independent), have p-values above 1e-4;
* the same tests reject samplers that are slightly wrong (power), so they can fail.
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


def chi_square_p_value(counts, target):
    """Pearson's goodness-of-fit test of ``counts`` (K,) against probabilities ``target`` (K,) (tokens of target 0
    are left out: they must have count 0): P(χ²_{K-1} >= Σ (O - E)² / E)."""
    keep = target > 0
    n = counts.sum()
    expected = n * target[keep]
    stat = ((counts[keep] - expected) ** 2 / expected).sum()
    df = int(keep.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), stat / 2))


def two_sample_p_value(counts_a, counts_b):
    """Chi-square test that two count vectors (K,) come from the same distribution (a 2 x K contingency table)."""
    keep = (counts_a + counts_b) > 0
    table = torch.stack([counts_a[keep], counts_b[keep]]).double()  # (2, K')
    expected = table.sum(1, keepdim=True) * table.sum(0, keepdim=True) / table.sum()
    stat = ((table - expected) ** 2 / expected).sum()
    df = int(keep.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), stat / 2))


LOGITS = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0], dtype=torch.float64)


@pytest.mark.parametrize(("kwargs", "expected_kept"), [
    ({}, [0, 1, 2, 3, 4, 5]),
    ({"top_k": 3}, [0, 1, 2]),
    ({"top_k": 1}, [0]),
    ({"top_k": 100}, [0, 1, 2, 3, 4, 5]),
    ({"top_p": 0.5}, [0]),  # p_0 = 0.561 already reaches 0.5
    ({"top_p": 0.7}, [0, 1]),
    ({"top_p": 1.0}, [0, 1, 2, 3, 4, 5]),
    ({"temperature": 0.5, "top_p": 0.7}, [0]),  # sharper: p_0 = 0.829
    ({"top_k": 3, "top_p": 0.9}, [0, 1, 2]),
    ({"top_k": 2, "top_p": 0.7}, [0]),  # top-p on the renormalised top-k cut: p_0 = e²/(e² + e) = 0.73 >= 0.7
    ({"top_p": 0.7, "temperature": 0.5}, [0]),  # top-p after temperature (at T = 1 it keeps 2)
])
def test_filter_keeps_the_right_tokens(kwargs, expected_kept):
    z = filter_logits(LOGITS, **kwargs)
    kept = torch.isfinite(z).nonzero().reshape(-1).tolist()
    assert kept == expected_kept
    T = kwargs.get("temperature", 1.0)
    expected = LOGITS[kept] if T == 1 else (LOGITS[kept] - LOGITS.max()) / T  # T != 1: the row max is shifted out
    torch.testing.assert_close(z[kept], expected, atol=0, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("p", [1e-300, 1e-46, 1e-40])
def test_a_tiny_top_p_keeps_the_top_token(dtype, p):
    """A p below float32's range rounds to 0 in the comparison; the most probable token is still kept."""
    z = filter_logits(LOGITS.to(dtype), top_p=p)
    assert torch.isfinite(z).nonzero().reshape(-1).tolist() == [0]


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
    ref = torch.multinomial(target, N, replacement=True, generator=torch.Generator().manual_seed(2))
    assert not torch.equal(ours, ref)  # independent draws (the same seed would give identical tokens)
    ok_ref, freq_ref = within_tolerance(ref, target)
    assert ok_ref.all()
    assert (freq - freq_ref).abs().max() < 0.008  # two independent estimates: 5·sqrt(2)·se <= 0.0079
    counts, counts_ref = freq * N, freq_ref * N
    assert chi_square_p_value(counts, target) > 1e-4
    assert chi_square_p_value(counts_ref, target) > 1e-4
    assert two_sample_p_value(counts, counts_ref) > 1e-4


@pytest.mark.parametrize(("sampled", "claimed"), [
    ({"top_p": 0.95}, {"top_p": 0.8}),  # one token too many kept
    ({"temperature": 0.95}, {}),  # a 5% error in the temperature
    ({"top_k": 4}, {"top_k": 5}),  # off by one in k
])
def test_the_statistical_tests_reject_a_slightly_wrong_sampler(sampled, claimed):
    """Power: draws from a slightly different distribution fail the tests used above against the claimed one."""
    target = F.softmax(filter_logits(LOGITS, **claimed), -1)
    ids = sample(LOGITS.expand(N, -1), generator=torch.Generator().manual_seed(1), **sampled)
    counts = torch.bincount(ids, minlength=6).double()
    ref = torch.multinomial(target, N, replacement=True, generator=torch.Generator().manual_seed(2))
    assert chi_square_p_value(counts, target) < 1e-4 or (counts[target == 0] > 0).any()
    assert two_sample_p_value(counts, torch.bincount(ref, minlength=6).double()) < 1e-4
    assert not within_tolerance(ids, target)[0].all()


def test_chi_square_p_value_is_uniform_under_the_null():
    """Under a correct sampler the p-value is (approximately) uniform: about 10% of 200 runs fall below 0.1."""
    target = F.softmax(LOGITS, -1)
    g = torch.Generator().manual_seed(9)
    p_values = [chi_square_p_value(torch.bincount(sample(LOGITS, num_samples=2000, generator=g), minlength=6)
                                   .double(), target) for _ in range(200)]
    assert 8 <= sum(p < 0.1 for p in p_values) <= 35  # Binomial(200, 0.1): mean 20, sd 4.2


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
    with pytest.raises(ValueError, match=r"\+inf"):
        sample(torch.tensor([0.0, float("inf")]))


# ---- half precision: the distribution is computed in float32 -------------------------------------------------

HALF = [torch.float16, torch.bfloat16]


def _pooled_chi_square_p(ids, target):
    """Pearson's test with every token of expected count < 10 pooled into one group (3,000 tokens, 200,000 draws)."""
    counts = torch.bincount(ids, minlength=target.numel()).double()
    big, small = target * ids.numel() >= 10, (target > 0) & (target * ids.numel() < 10)
    obs = torch.cat([counts[big], counts[small].sum()[None]])
    return chi_square_p_value(obs, torch.cat([target[big], target[small].sum()[None]]))


@pytest.mark.parametrize("dtype", HALF)
def test_half_precision_logits_sample_the_right_distribution(dtype):
    """3,000 random logits: before the fix float16 gave X² ≈ 44,000 on ~1,500 df (p = 0) and bfloat16 worse,
    because the cumulative sum in half precision loses the small probabilities."""
    z = (torch.randn(3000, generator=torch.Generator().manual_seed(0)) * 2).to(dtype)
    target = F.softmax(z.double(), -1)  # the exact distribution of the rounded logits
    ids = sample(z, num_samples=N, generator=torch.Generator().manual_seed(1))
    assert ids.dtype == torch.int64
    assert _pooled_chi_square_p(ids, target) > 1e-4
    assert len(ids.unique()) > 2500  # float64 draws reach 2,657 distinct tokens; bfloat16 used to reach 410


@pytest.mark.parametrize("dtype", HALF)
def test_half_precision_top_p_keeps_the_float64_nucleus(dtype):
    z = (torch.randn(3, 3000, generator=torch.Generator().manual_seed(0)) * 2).to(dtype)
    for p in (0.5, 0.9, 0.99):
        got = filter_logits(z, top_p=p)
        assert got.dtype == dtype
        assert torch.equal(torch.isfinite(got), torch.isfinite(filter_logits(z.double(), top_p=p)))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_tiny_temperature_is_argmax_in_every_dtype(dtype):
    """Issue 12 item 8: float16 logits divided by T = 1e-4 overflowed to inf (then NaN); the row max is now
    subtracted first, so T -> 0 is argmax (ties sharing) in every dtype."""
    z = torch.tensor([[10.0, 30.0, 29.5, -5.0], [7.0, 1.0, 7.0, 0.0]], dtype=dtype)
    filtered = filter_logits(z, temperature=1e-4)
    assert filtered.dtype == dtype and not torch.isnan(filtered).any()
    assert filtered[0, 1] == 0 and (filtered[0, [0, 2, 3]] <= -5000).all()  # (z - max z) / T: -inf or very low
    ids = sample(z, temperature=1e-4, num_samples=2000, generator=torch.Generator().manual_seed(0))
    assert (ids[0] == 1).all()
    assert set(ids[1].tolist()) == {0, 2}  # the tied maxima share the mass
    big = torch.tensor([1e4, 1e4 - 1, 0.0], dtype=torch.float32)  # float32: 1e4 / 1e-40 would overflow too
    assert (sample(big, temperature=1e-40, num_samples=100) == 0).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_scaled_uniform_stays_below_the_total(dtype):
    """sample's docstring: F_V can round below 1, and u · F_V < F_V for the largest u < 1 (round-to-nearest)."""
    g = torch.Generator().manual_seed(0)
    totals = torch.softmax(torch.randn(200, 3000, generator=g, dtype=dtype) * 3, -1).cumsum(-1)[:, -1]
    assert (totals < 1).any()
    u_max = torch.nextafter(torch.tensor(1.0, dtype=dtype), torch.tensor(0.0, dtype=dtype))
    many = torch.rand(10**5, generator=g, dtype=dtype) * 4 + 0.25
    assert (u_max * totals < totals).all() and (u_max * many < many).all()


def test_tiny_temperature_gives_large_negative_logits_not_inf():
    """filter_logits' docstring: (z - max z) / T at T = 1e-4 is -5000 for a gap of 0.5 in float64, not -inf."""
    z = filter_logits(torch.tensor([1.0, 0.5, 0.0], dtype=torch.float64), temperature=1e-4)
    assert z.tolist() == [0.0, -5000.0, -10000.0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_temperature_below_the_dtypes_range_is_argmax_not_nan(dtype):
    """T = 1e-300 rounds to 0 in float32: (z - max z) / T was 0 / 0 = NaN at the maximum."""
    z = filter_logits(torch.tensor([0.5, 1.0, -2.0], dtype=dtype), temperature=1e-300)
    assert z.tolist() == [-math.inf, 0.0, -math.inf]
    assert int(sample(torch.tensor([0.5, 1.0, -2.0], dtype=dtype), temperature=1e-300)) == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_temperature_beyond_the_dtypes_range_is_uniform_over_finite_logits(dtype):
    """τ = 1e39 rounds to inf in float32: a -inf logit divided by it was -inf / inf = NaN."""
    temperature = 1.7e308 if dtype == torch.float64 else 1e39  # float64: its largest; the quotients underflow
    logits = torch.tensor([2.0, 1.0, -math.inf], dtype=dtype)
    z = filter_logits(logits, temperature=temperature)
    assert not torch.isnan(z).any()
    assert z[2].item() == -math.inf
    probs = torch.softmax(z.double(), dim=-1)
    assert torch.allclose(probs, torch.tensor([0.5, 0.5, 0.0], dtype=torch.float64))
    draws = sample(logits, temperature=temperature, generator=torch.Generator().manual_seed(0), num_samples=1000)
    assert set(draws.tolist()) == {0, 1}
