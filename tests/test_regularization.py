"""Dropout (chapter 3) against F.dropout: same law (keep probability, scaling, mean), same gradients."""

import math

import pytest
import torch
import torch.nn.functional as F

from transformer_lab.regularization import Dropout, dropout, dropout_mask


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_dropout_law_matches_torch(p):
    x = torch.full((400, 500), 2.0, dtype=torch.float64)
    ours = dropout(x, p, generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    ref = F.dropout(x, p, training=True)
    n = x.numel()
    sigma = math.sqrt(p * (1 - p) / n)  # std of the fraction of zeros
    for out in (ours, ref):
        kept = out != 0
        # every kept entry is scaled by exactly 1/(1 − p); the zero fraction is p within 5 sigma
        torch.testing.assert_close(out[kept], torch.full_like(out[kept], 2.0 / (1 - p)), atol=0, rtol=1e-15)
        assert abs((~kept).double().mean().item() - p) < 5 * sigma
    assert abs(ours.mean().item() - 2.0) < 5 * 2.0 * math.sqrt(p / (1 - p) / n)  # E[dropout(x)] = x


def test_identity_in_eval_and_at_p0_zero_at_p1():
    x = torch.randn(3, 4, dtype=torch.float64)
    assert dropout(x, 0.7, training=False) is x
    assert dropout(x, 0.0) is x
    assert torch.equal(dropout(x, 1.0), torch.zeros_like(x))


def test_gradient_is_the_mask():
    x = torch.randn(50, 7, dtype=torch.float64, requires_grad=True)
    g = torch.Generator().manual_seed(3)
    out = dropout(x, 0.3, generator=g)
    out.sum().backward()
    mask = dropout_mask(x.shape, 0.3, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    torch.testing.assert_close(x.grad, mask, atol=0, rtol=0)
    torch.testing.assert_close(out, x.detach() * mask, atol=0, rtol=0)


def test_generator_makes_it_deterministic():
    x = torch.randn(10, 10)
    a = dropout(x, 0.5, generator=torch.Generator().manual_seed(1))
    b = dropout(x, 0.5, generator=torch.Generator().manual_seed(1))
    assert torch.equal(a, b)


def test_module_train_eval():
    m = Dropout(0.5)
    x = torch.ones(1000)
    assert (m(x) == 0).any()
    m.eval()
    assert torch.equal(m(x), x)


@pytest.mark.parametrize("p", [-0.1, 1.1, math.nan, True, "0.5"])
def test_bad_p(p):
    with pytest.raises(ValueError, match="probability p must lie in"):
        dropout(torch.ones(3), p)
    with pytest.raises(ValueError, match="probability p must lie in"):
        Dropout(p)


def test_bad_tensor():
    with pytest.raises(ValueError, match="floating-point tensor"):
        dropout(torch.ones(3, dtype=torch.long), 0.5)
    with pytest.raises(ValueError, match="floating-point tensor"):
        dropout([1.0, 2.0], 0.5)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("p", [0.1, 0.9, 0.999])
def test_half_precision_keeps_with_probability_one_minus_p(dtype, p):
    """The keep decision is drawn in float32: in bfloat16 (grid 2⁻⁸ near 1) p = 0.1 kept 0.898, p = 0.999 nothing."""
    n = 2_000_000
    x = torch.full((n,), 2.0, dtype=dtype)
    out = dropout(x, p, generator=torch.Generator().manual_seed(0))
    assert out.dtype == dtype
    kept = out != 0
    assert abs(kept.double().mean().item() - (1 - p)) < 5 * math.sqrt(p * (1 - p) / n)
    # each kept entry is 2/(1 − p) computed in float32, then rounded to dtype (E[out] = x up to that rounding)
    expected = torch.tensor(2.0 / (1 - p), dtype=torch.float32).to(dtype)
    assert torch.equal(out[kept], expected.expand(int(kept.sum())))


def test_half_mask_draws_the_same_keep_pattern_as_float32():
    a = dropout_mask((1000,), 0.3, generator=torch.Generator().manual_seed(2), dtype=torch.bfloat16)
    b = dropout_mask((1000,), 0.3, generator=torch.Generator().manual_seed(2), dtype=torch.float32)
    assert torch.equal(a != 0, b != 0)
