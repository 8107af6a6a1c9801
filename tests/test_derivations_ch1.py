"""Chapter 1 derivations: identities proved on general symbols, and the SymPy gradient of attention against
autograd through the package's scaled_dot_product_attention."""

import pytest
import sympy as sp
import torch

from transformer_lab.attention import scaled_dot_product_attention
from transformer_lab.derivations import ch1


@pytest.mark.parametrize("mask", [None, [[True, False], [True, True]]])
def test_sum_over_heads_is_an_identity_on_symbols(mask):
    r = ch1.multihead_sum_identity(T=2, C=4, n_head=2, mask=mask)
    assert r["difference"].is_zero_matrix
    assert r["difference"].shape == (2, 4)
    assert any(s.name.startswith("x_") for s in r["concat"].free_symbols)  # symbols, not numbers


def test_sum_over_heads_with_four_heads():
    assert ch1.multihead_sum_identity(T=2, C=4, n_head=4)["difference"].is_zero_matrix


@pytest.mark.parametrize("mask", [None, [[True, True, False], [True, False, True]], [[True, True, True],
                                                                                     [False, False, False]]])
def test_sympy_gradient_of_attention_matches_autograd(mask):
    gen = torch.Generator().manual_seed(5)
    Q, K, V, G = (torch.randn(*s, generator=gen, dtype=torch.float64) for s in ((2, 2), (3, 2), (3, 2), (2, 2)))
    sym = ch1.attention_gradient_function(2, 3, 2, 2, mask)(Q.numpy(), K.numpy(), V.numpy(), G.numpy())
    ins = [t.clone().requires_grad_() for t in (Q, K, V)]
    o = scaled_dot_product_attention(query=ins[0], key=ins[1], value=ins[2],
                                     mask=None if mask is None else torch.tensor(mask))[0]
    for a, b in zip(sym, torch.autograd.grad((o * G).sum(), ins), strict=True):
        torch.testing.assert_close(torch.as_tensor(a), b, atol=1e-12, rtol=1e-12)


def test_fully_masked_row_is_the_stated_convention():
    st = ch1.attention_steps(2, 3, 2, 2, mask=[[True, False, False], [False, False, False]])
    assert st["A"].row(1) == sp.zeros(1, 3) and st["O"].row(0) == st["V"].row(0)
