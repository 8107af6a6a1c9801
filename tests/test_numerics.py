"""Log-sum-exp, naive softmax, the 1/sqrt(d_k) scale, GPT-2 init (chapter 7): SymPy = ours = torch, bad input.

Tolerances: float64 comparisons use atol = rtol = 1e-12 (the same formula, summed in a different order);
statistical checks of variances use the Monte-Carlo standard error stated beside them.
"""

import math

import numpy as np
import pytest
import sympy as sp
import torch
from torch import nn

from transformer_lab.derivations import ch7 as d7
from transformer_lab.norm import LayerNorm
from transformer_lab.numerics import init_gpt_weights, logsumexp, naive_softmax, score_scale, softmax_saturation
from transformer_lab.softmax import softmax

TOL64 = {"atol": 1e-12, "rtol": 1e-12}


def test_logsumexp_sympy_equals_ours_equals_torch_values_and_gradients():
    d = d7.logsumexp_shift(4)
    f_lhs = sp.lambdify([d["z"]], d["lhs"], "numpy")
    f_rhs = sp.lambdify([d["z"], d["m"]], d["rhs"], "numpy")
    Z = torch.randn(16, 4, dtype=torch.float64, requires_grad=True)
    sym = torch.tensor([f_lhs(r) for r in Z.detach().numpy()])
    sym_shift = torch.tensor([f_rhs(r, 2.5) for r in Z.detach().numpy()])  # any m gives the same value
    ours, ref = logsumexp(Z), torch.logsumexp(Z, dim=-1)
    torch.testing.assert_close(ours, sym, **TOL64)
    torch.testing.assert_close(sym_shift, sym, **TOL64)
    torch.testing.assert_close(ours, ref, **TOL64)
    (g_ours,) = torch.autograd.grad(ours.sum(), Z)
    (g_ref,) = torch.autograd.grad(ref.sum(), Z)
    torch.testing.assert_close(g_ours, g_ref, **TOL64)
    torch.testing.assert_close(g_ours, softmax(Z.detach()), **TOL64)  # d LSE / dz = softmax(z)


@pytest.mark.parametrize("dim", [0, 1, -1, 2])
def test_logsumexp_other_dims(dim):
    Z = torch.randn(3, 4, 5, dtype=torch.float64)
    torch.testing.assert_close(logsumexp(Z, dim=dim), torch.logsumexp(Z, dim=dim), **TOL64)


@pytest.mark.parametrize("scale", [1e2, 1e3, 1e5, 1e300])
def test_logsumexp_huge_logits_do_not_overflow(scale):
    Z = torch.randn(8, 10, dtype=torch.float64) * scale
    ours = logsumexp(Z)
    assert torch.isfinite(ours).all()
    torch.testing.assert_close(ours, torch.logsumexp(Z, -1), **TOL64)
    if scale >= 1e3:  # the unshifted formula overflows (or underflows) here
        naive = torch.log(torch.exp(Z).sum(-1))
        assert not torch.isfinite(naive).all()


def test_logsumexp_infinities_and_masked_rows():
    Z = torch.tensor([[-math.inf, -math.inf, -math.inf], [0.0, -math.inf, 1.0], [math.inf, 1.0, 2.0]],
                     dtype=torch.float64, requires_grad=True)
    ours, ref = logsumexp(Z), torch.logsumexp(Z, -1)
    torch.testing.assert_close(ours, ref, **TOL64)
    assert ours[0] == -math.inf
    assert ours[2] == math.inf
    (g,) = torch.autograd.grad(ours[1], Z)
    (gr,) = torch.autograd.grad(ref[1], Z)
    torch.testing.assert_close(g, gr, equal_nan=True, **TOL64)  # NaN in the infinite rows, as torch
    torch.testing.assert_close(g[1], torch.softmax(Z[1].detach(), -1), **TOL64)
    # a single element: LSE(z) = z
    torch.testing.assert_close(logsumexp(torch.tensor([[3.5]], dtype=torch.float64)), torch.tensor([3.5],
                               dtype=torch.float64), **TOL64)


@pytest.mark.parametrize(("dtype", "threshold"), [(torch.float16, 11.1), (torch.bfloat16, 88.8),
                                                  (torch.float32, 88.8)])
def test_naive_softmax_overflows_where_the_format_says_and_stable_one_does_not(dtype, threshold):
    below = torch.tensor([threshold - 1.0, 0.0, -1.0], dtype=dtype)
    above = torch.tensor([threshold + 1.0, 0.0, -1.0], dtype=dtype)
    assert torch.isfinite(naive_softmax(below)).all()
    assert torch.isnan(naive_softmax(above)).any()  # inf / inf
    u = torch.finfo(dtype).eps / 2
    for z in (above, above * 100, -above * 100):  # computed natively in the 16-bit format, no detour via float32
        ours = softmax(z)
        assert ours.dtype == dtype and torch.isfinite(ours).all()
        assert abs(ours.double().sum().item() - 1) <= 3 * u
        torch.testing.assert_close(ours.double(), torch.softmax(z.double(), -1), atol=3 * u, rtol=0)
    exact = torch.logsumexp(above.double(), -1)  # of the same rounded logits
    assert (logsumexp(above).double() - exact).abs().item() <= 2 * u * exact.abs().item()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_logsumexp_in_16_bits_is_within_two_units_of_roundoff(dtype):
    # computed natively in 16 bits; errors measured relative to the value, against float64 on the rounded logits
    z = (torch.randn(2000, 50, generator=torch.Generator().manual_seed(0)) * 4).to(dtype)
    ours = logsumexp(z)
    exact = torch.logsumexp(z.double(), -1)
    u = torch.finfo(dtype).eps / 2
    assert ours.dtype == dtype
    assert ((ours.double() - exact).abs() <= 2 * u * exact.abs()).all()


def test_naive_softmax_gives_zeros_when_only_the_sum_overflows():
    # float16: e^10.8 is finite but e^10.8 + e^9.72 + ... is not: every probability becomes finite / inf = 0
    z = (torch.tensor([1.0, 0.9, 0.6, 0.2, 0.0]) * 10.8).to(torch.float16)
    assert torch.isfinite(torch.exp(z)).all() and torch.isinf(torch.exp(z).sum())
    p = naive_softmax(z)
    assert (p == 0).all()
    assert torch.isfinite(softmax(z)).all() and abs(softmax(z).double().sum().item() - 1) < 1e-3


def test_naive_softmax_equals_softmax_on_small_logits():
    Z = torch.randn(4, 6, dtype=torch.float64)
    torch.testing.assert_close(naive_softmax(Z), torch.softmax(Z, -1), **TOL64)
    torch.testing.assert_close(naive_softmax(Z, dim=0), torch.softmax(Z, 0), **TOL64)


def test_dot_product_variance_derivation_and_simulation():
    d = d7.dot_product_variance()
    d_k, sq, sk = d["symbols"]
    assert d["term_mean"] == 0
    assert d["covariance_of_two_terms"] == 0
    assert sp.simplify(d["variance"] - d_k * sq**2 * sk**2) == 0
    assert d["unit_scaled_variance"] == 1
    g = torch.Generator().manual_seed(0)
    for n in (4, 64, 256):
        q = torch.randn(20_000, n, generator=g, dtype=torch.float64)
        k = torch.randn(20_000, n, generator=g, dtype=torch.float64)
        s = torch.linalg.vecdot(q, k)
        # relative s.e. of a sample variance of N = 20,000 values with excess kurtosis 6/d_k (a sum of d_k products
        # of two normals): sqrt((2 + 6/d_k)/N), 0.013 at d_k = 4 and 0.010 at 256; 0.05 is 3.8 to 5 s.e.
        assert abs(s.var().item() / float(d["unit_variance"].subs(d_k, n)) - 1) < 0.05
        assert abs((s * score_scale(n)).var().item() - 1) < 0.05


def test_softmax_saturation_grows_without_scale_and_not_with_it():
    unscaled = [softmax_saturation(d, scaled=False)["max_weight"].mean().item() for d in (4, 64, 1024)]
    scaled = [softmax_saturation(d, scaled=True)["max_weight"].mean().item() for d in (4, 64, 1024)]
    assert unscaled[0] < unscaled[1] < unscaled[2]
    assert unscaled[2] > 0.9  # saturated: nearly one-hot
    assert max(scaled) - min(scaled) < 0.05  # the scale keeps the distribution's shape fixed
    r = softmax_saturation(1024, scaled=False)
    # saturated softmax: the Jacobian (hence every gradient through it) collapses
    assert r["grad_norm"].median() < softmax_saturation(1024, scaled=True)["grad_norm"].median() / 100
    p = softmax(r["scores"])
    J = torch.diag_embed(p) - p.unsqueeze(-1) * p.unsqueeze(-2)
    torch.testing.assert_close(r["grad_norm"], torch.linalg.matrix_norm(J), atol=1e-10, rtol=1e-8)


class _Block(nn.Module):
    def __init__(self, C):
        super().__init__()
        self.ln_1, self.ln_2 = LayerNorm(C), nn.LayerNorm(C)
        self.attn = nn.Module()
        self.attn.in_proj, self.attn.out_proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.mlp = nn.Module()
        self.mlp.fc, self.mlp.proj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)


def test_init_gpt_weights_stds_biases_and_norms():
    C, L = 256, 8
    model = nn.Module()
    model.wte = nn.Embedding(1000, C)
    model.blocks = nn.ModuleList([_Block(C) for _ in range(L)])
    for p in model.parameters():
        nn.init.constant_(p, 0.7)
    init_gpt_weights(model, n_layer=L, generator=torch.Generator().manual_seed(0))
    proj_std = 0.02 / math.sqrt(2 * L)
    assert abs(model.wte.weight.std().item() / 0.02 - 1) < 0.02
    for b in model.blocks:
        assert abs(b.attn.in_proj.weight.std().item() / 0.02 - 1) < 0.03
        assert abs(b.mlp.fc.weight.std().item() / 0.02 - 1) < 0.03
        assert abs(b.attn.out_proj.weight.std().item() / proj_std - 1) < 0.03
        assert abs(b.mlp.proj.weight.std().item() / proj_std - 1) < 0.03
        for lin in (b.attn.in_proj, b.attn.out_proj, b.mlp.fc, b.mlp.proj):
            assert torch.equal(lin.bias, torch.zeros_like(lin.bias))
        for ln in (b.ln_1, b.ln_2):
            assert torch.equal(ln.weight, torch.ones_like(ln.weight))
            assert torch.equal(ln.bias, torch.zeros_like(ln.bias))


def test_init_gpt_weights_is_deterministic_with_a_generator():
    a, b = nn.Linear(8, 8), nn.Linear(8, 8)
    init_gpt_weights(a, n_layer=2, generator=torch.Generator().manual_seed(3))
    init_gpt_weights(b, n_layer=2, generator=torch.Generator().manual_seed(3))
    assert torch.equal(a.weight, b.weight)
    assert not np.allclose(a.weight.detach().numpy(), 0.7)


@pytest.mark.parametrize(("call", "match"), [
    (lambda: logsumexp([1.0, 2.0]), "must be a torch.Tensor"),
    (lambda: logsumexp(torch.tensor([1, 2])), "floating-point"),
    (lambda: logsumexp(torch.tensor(1.0)), "at least one dimension"),
    (lambda: logsumexp(torch.ones(2, 3), dim=2), "dim=2 is out of range"),
    (lambda: logsumexp(torch.ones(2, 0)), "is empty"),
    (lambda: naive_softmax(torch.ones(3), dim=1), "dim=1 is out of range"),
    (lambda: naive_softmax(torch.ones(3, dtype=torch.int32)), "floating-point"),
    (lambda: score_scale(0), "d_k must be a positive int"),
    (lambda: score_scale(2.5), "d_k must be a positive int"),
    (lambda: softmax_saturation(8, n_keys=1), "n_keys must be an int >= 2"),
    (lambda: init_gpt_weights("model", n_layer=2), "must be an nn.Module"),
    (lambda: init_gpt_weights(nn.Linear(2, 2), n_layer=0), "n_layer must be a positive int"),
    (lambda: init_gpt_weights(nn.Linear(2, 2), n_layer=2, std=0.0), "std must be > 0"),
])
def test_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_saturation_entropy_from_the_scores_equals_chapter_5s_and_needs_no_import_of_it():
    """H(p) = LSE(s) - p . s: chapter 7's module computes the entropy with its own log-sum-exp, so numerics no
    longer imports information (which imports numerics.logsumexp): the import circle of issue 12 is gone."""
    import inspect

    from transformer_lab import information, numerics
    for d_k, scaled in ((4, True), (64, False), (1024, False)):
        r = softmax_saturation(d_k, scaled=scaled)
        p = torch.softmax(r["scores"], dim=-1)
        torch.testing.assert_close(r["entropy"], information.entropy(p), rtol=0, atol=1e-12)
    assert "information" not in inspect.getsource(numerics)


def test_every_component_reports_a_bad_count_in_the_same_words():
    """One home for validation (issue 12): each component's count arguments go through _checks.positive_int."""
    from transformer_lab.attention import Embedding, MultiHeadAttention
    from transformer_lab.gpt import GPTConfig
    from transformer_lab.mlp import MLP
    from transformer_lab.norm import LayerNorm
    from transformer_lab.positional import sinusoidal_encoding
    from transformer_lab.softmax import LMHead
    from transformer_lab.train import TrainConfig

    for build in (lambda v: Embedding(v, 4), lambda v: MultiHeadAttention(v, 1), lambda v: MLP(v),
                  lambda v: LayerNorm(v), lambda v: LMHead(v, 3), lambda v: sinusoidal_encoding(3, v),
                  lambda v: GPTConfig(d_model=v, n_head=1), lambda v: TrainConfig(batch_size=v),
                  lambda v: score_scale(v)):
        for bad in (0, -2, 2.0, True, "4"):
            with pytest.raises(ValueError, match=r"must be a positive integer, got"):
                build(bad)
    assert GPTConfig(d_model=np.int64(8), n_head=np.int64(2)).d_model.__class__ is int  # stored as a Python int


@pytest.mark.parametrize("scaled", [False, True])
def test_softmax_saturation_query_gradient_matches_autograd(scaled):
    d_k, n_keys, n_queries, s = 16, 8, 5, 3
    r = softmax_saturation(d_k, n_keys=n_keys, n_queries=n_queries, scaled=scaled, seed=s)
    g = torch.Generator().manual_seed(s)  # the same draws, in the same order: q, k, then the upstream gradient
    q = torch.randn(n_queries, d_k, generator=g, dtype=torch.float64).requires_grad_()
    k = torch.randn(n_keys, d_k, generator=g, dtype=torch.float64)
    upstream = torch.randn(n_queries, n_keys, generator=g, dtype=torch.float64)
    p = torch.softmax(q @ k.T * (score_scale(d_k) if scaled else 1.0), dim=-1)
    (grad_q,) = torch.autograd.grad((p * upstream).sum(), q)
    torch.testing.assert_close(r["query_grad_norm"], grad_q.norm(dim=-1), **TOL64)
