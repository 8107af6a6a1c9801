"""Chapter 5: transformer_lab.information against SymPy and PyTorch (float64), plus every bad-input case.

Tolerances: float64 values and gradients agree to rtol=1e-12 / atol=1e-12 (a handful of floating-point operations,
each exact to ~1e-16); the SymPy derivations are compared through ``ch5.check`` at 1e-10.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from transformer_lab import information as info
from transformer_lab.derivations import ch5

TOL = {"rtol": 1e-12, "atol": 1e-12}


def _dist(*shape, seed=0, scale=2.0):
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(torch.randn(*shape, generator=g, dtype=torch.float64) * scale, dim=-1)


# ---------------------------------------------------------------- the derivations
def test_derivation_check_agrees():
    """Seed 0 is the page's table, guarded there at 1e-14; other seeds' extreme logits (std 1e4) differ by up to
    about 2e-12 in absolute terms (a relative 1e-16), so they get 1e-11."""
    assert max(ch5.check(seed=0).values()) < 1e-14
    for seed in (1, 2):
        result = ch5.check(seed=seed)
        assert len(result) >= 10
        for name, diff in result.items():
            assert diff < 1e-11, f"seed {seed}, {name}: {diff}"


def test_symbolic_identities_are_zero():
    assert ch5.cross_entropy_decomposition(4)[-1][1] == 0
    gibbs = dict(ch5.gibbs_inequality())
    assert gibbs["difference of the two"] == 0  # p log(p/q) = p f(q/p) - (q - p) on general symbols
    assert gibbs["f''(x) > 0  (True: x is declared positive; f is convex)"] is ch5.sp.true  # by the assumption
    assert gibbs["critical points"] == ch5.sp.FiniteSet(1) and gibbs["f(1)"] == 0
    steps = dict(ch5.cross_entropy_minimum(3))
    assert steps["q* - p (with Σ p = 1)"] == ch5.sp.zeros(3, 1)  # the derived stationary point, not q = p typed in
    assert steps["H(p, q*) - H(p) (with Σ p = 1)"] == 0
    assert steps["Hessian diagonal p_i/q_i^2 > 0  (True: p_i, q_i declared positive)"] is ch5.sp.true
    chain = dict(ch5.chain_rule_nll(4))
    assert chain["Π_t P(w_t | w_<t) - P(w_1 … w_T)"] == 0
    assert chain["Σ_t -log P(w_t | w_<t) - [-log P(w_1 … w_T)]"] == 0
    assert ch5.mutual_information(2, 3)[-1][1] == 0
    assert all(v == 0 for _, v in ch5.label_smoothing(4))
    sce = dict(ch5.softmax_cross_entropy(4, target=2))
    assert sce["∂(shifted)/∂m  (independent of m: choose m = max z)"] == 0
    assert sce["shifted form at m = 0, minus (LSE(z) - z_y)"] == 0
    assert sce["∂L/∂z - (softmax(z) - onehot(y))"] == ch5.sp.zeros(4, 1)
    assert ch5.nats_and_bits()[2][1] == 0
    sme = dict(ch5.softmax_maximum_entropy(3))
    assert sme["p* - softmax(z)"] == ch5.sp.zeros(3, 1)
    assert sme["Hessian diagonal -1/p_i < 0  (True: p_i declared positive)"] is ch5.sp.true


def test_derivations_would_catch_a_wrong_identity():
    """The differences are computed, not typed in: a wrong formula leaves a non-zero difference."""
    sp = ch5.sp
    p_i, q_i = sp.symbols("p_i q_i", positive=True)
    wrong = p_i * sp.log(p_i / q_i) - (p_i * (q_i / p_i - 1 - sp.log(q_i / p_i)) + (q_i - p_i))  # sign slip
    assert sp.simplify(sp.expand_log(wrong, force=True)) != 0
    p, q = ch5.distributions(3)
    assert sp.simplify(ch5.cross_entropy_expr(p, q) - ch5.entropy_expr(p)) != 0  # H(p, q) ≠ H(p) for general q


# ---------------------------------------------------------------- entropy, KL, cross-entropy of distributions
def test_entropy_known_values():
    assert info.entropy(torch.full((8,), 1 / 8, dtype=torch.float64)).item() == pytest.approx(math.log(8), abs=1e-15)
    assert info.entropy(torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64)).item() == 0.0  # 0 log 0 = 0
    p = _dist(5, 7, seed=3)
    torch.testing.assert_close(info.entropy(p.transpose(0, 1), dim=0), info.entropy(p), **TOL)


def test_kl_and_cross_entropy_match_torch_values_and_gradients():
    p, q0 = _dist(6, 10, seed=1), _dist(6, 10, seed=2)
    q = q0.clone().requires_grad_(True)
    ours = info.kl_divergence(p, q)
    ref = F.kl_div(q.log(), p, reduction="none").sum(-1)
    torch.testing.assert_close(ours, ref, **TOL)
    (g_ours,) = torch.autograd.grad(ours.sum(), q)
    (g_ref,) = torch.autograd.grad(ref.sum(), q)
    torch.testing.assert_close(g_ours, g_ref, **TOL)
    hpq = info.distribution_cross_entropy(p, q0)
    torch.testing.assert_close(hpq, F.cross_entropy(q0.log(), p, reduction="none"), **TOL)
    torch.testing.assert_close(hpq, info.entropy(p) + info.kl_divergence(p, q0), **TOL)  # H(p,q) = H(p) + KL


def test_gibbs_kl_nonnegative_and_zero_at_p():
    p, q = _dist(200, 6, seed=4), _dist(200, 6, seed=5)
    assert (info.kl_divergence(p, q) > 0).all()
    torch.testing.assert_close(info.kl_divergence(p, p), torch.zeros(200, dtype=torch.float64), **TOL)


def test_kl_infinite_where_q_vanishes_and_zero_where_p_does():
    p = torch.tensor([0.5, 0.5, 0.0], dtype=torch.float64)
    assert info.kl_divergence(p, torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64)).item() == math.inf
    assert math.isfinite(info.kl_divergence(p, torch.tensor([0.5, 0.5 - 1e-300, 1e-300],
                                                           dtype=torch.float64)).item())


# ---------------------------------------------------------------- the training loss from logits
@pytest.mark.parametrize("scale", [1.0, 1e3, 1e6])
@pytest.mark.parametrize("shape", [(7, 11), (3, 5, 11), (1, 1, 11)])
def test_cross_entropy_matches_torch_values_and_gradients(shape, scale):
    g = torch.Generator().manual_seed(0)
    z0 = torch.randn(*shape, generator=g, dtype=torch.float64) * scale
    y = torch.randint(0, shape[-1], shape[:-1], generator=g)
    for reduction in ("mean", "sum", "none"):
        z1, z2 = z0.clone().requires_grad_(True), z0.clone().requires_grad_(True)
        ours = info.cross_entropy(z1, y, reduction=reduction)
        ref = F.cross_entropy(z2.reshape(-1, shape[-1]), y.reshape(-1), reduction=reduction)
        ref = ref.reshape(y.shape) if reduction == "none" else ref
        assert torch.isfinite(ours).all()
        torch.testing.assert_close(ours, ref, **TOL)
        ours.sum().backward()
        ref.sum().backward()
        torch.testing.assert_close(z1.grad, z2.grad, **TOL)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("offset", [1e4, 1e6, -1e4])
def test_cross_entropy_large_offset_and_near_ties(offset, dtype):
    """A common offset cancels exactly: computed as (z_y - m) - log Σ e^{z - m}, the error is a few epsilons of the
    loss however large the logits (m + log Σ - z_y would lose digits to the offset: 3e-2 at 1e6 in float32)."""
    g = torch.Generator().manual_seed(0)
    rows = torch.cat([torch.randn(64, 6, generator=g, dtype=torch.float64),
                      torch.zeros(1, 6, dtype=torch.float64),  # a constant row: exactly log 6
                      torch.tensor([[0.0, -0.5, -1.0, -1e-3, -1e4, -1e4]], dtype=torch.float64)])  # near-ties
    z = (rows + offset).to(dtype)
    z_exact = z.double() - offset  # exact: z and the offset lie within a factor 2 of each other (Sterbenz)
    for target in range(6):
        y = torch.full((len(z),), target)
        exact = F.cross_entropy(z_exact, y, reduction="none")  # logits of size <= 1e4: float64 rounding only
        ours = info.cross_entropy(z, y, reduction="none").double()
        eps = torch.finfo(dtype).eps
        assert ((ours - exact).abs() <= 8 * eps * exact.clamp(min=1.0)).all(), (ours - exact).abs().max()
        assert ours[64].item() == pytest.approx(math.log(6), rel=8 * eps)
        torch.testing.assert_close(ours, F.cross_entropy(z, y, reduction="none").double(),
                                   rtol=16 * eps, atol=16 * eps)


@pytest.mark.parametrize("ignore_index", [-100, -1, 3])
def test_cross_entropy_ignore_index(ignore_index):
    g = torch.Generator().manual_seed(1)
    z = torch.randn(4, 6, 9, generator=g, dtype=torch.float64, requires_grad=True)
    y = torch.randint(0, 9, (4, 6), generator=g)
    y[y == ignore_index] = 0
    y[0, :3] = ignore_index  # three ignored tokens
    y[2, 5] = ignore_index
    ours = info.cross_entropy(z, y, ignore_index=ignore_index)
    ref = F.cross_entropy(z.transpose(1, 2), y, ignore_index=ignore_index)  # torch wants (B, V, T)
    torch.testing.assert_close(ours, ref, **TOL)
    (g1,) = torch.autograd.grad(ours, z)
    (g2,) = torch.autograd.grad(ref, z)
    torch.testing.assert_close(g1, g2, **TOL)
    assert (g1[0, :3] == 0).all()
    none = info.cross_entropy(z, y, ignore_index=ignore_index, reduction="none")
    assert (none[0, :3] == 0).all()
    assert (none[1] > 0).all()


def test_cross_entropy_all_ignored():
    z = torch.randn(4, 6, 9, dtype=torch.float64)
    assert (info.cross_entropy(z, torch.full((4, 6), -100), reduction="none") == 0).all()
    assert torch.isnan(info.cross_entropy(z, torch.full((4, 6), -100)))  # every token ignored: NaN, like PyTorch


def test_cross_entropy_with_minus_inf_logits():
    z = torch.tensor([[0.0, -math.inf, 1.0], [-math.inf, -math.inf, 2.0]], dtype=torch.float64)
    y = torch.tensor([2, 2])
    torch.testing.assert_close(info.cross_entropy(z, y, reduction="none"), F.cross_entropy(z, y, reduction="none"))


def test_cross_entropy_float32_extreme():
    z = torch.tensor([[1e30, 0.0, -1e30]], dtype=torch.float32)
    assert info.cross_entropy(z, torch.tensor([0])).item() == 0.0
    assert info.cross_entropy(z, torch.tensor([1])).item() == pytest.approx(1e30, rel=1e-6)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_cross_entropy_half_precision_is_computed_in_float32(dtype):
    """Half-precision logits: the loss is computed in float32 and returned in the input's dtype, so it equals
    PyTorch's float32 loss rounded once; the gradient comes back in the input's dtype too."""
    g = torch.Generator().manual_seed(0)
    z = (torch.randn(4, 7, 1000, generator=g) * 4).to(dtype).requires_grad_(True)  # (B, T, V), a large V
    y = torch.randint(0, 1000, (4, 7), generator=g)
    y[0, 0] = -100
    ulp = torch.finfo(dtype).eps  # the dtype's relative spacing: one rounding to it moves a value by at most this
    for reduction in ("mean", "sum", "none"):
        ours = info.cross_entropy(z, y, reduction=reduction)
        ref = F.cross_entropy(z.detach().float().transpose(1, 2), y, reduction=reduction)
        assert ours.dtype == dtype
        torch.testing.assert_close(ours.float(), ref.float(), rtol=ulp, atol=0)  # one rounding: within one ulp
    (grad,) = torch.autograd.grad(info.cross_entropy(z, y), z)
    zf = z.detach().float().requires_grad_(True)
    (grad_ref,) = torch.autograd.grad(F.cross_entropy(zf.transpose(1, 2), y), zf)
    assert grad.dtype == dtype
    torch.testing.assert_close(grad.float(), grad_ref, rtol=ulp, atol=ulp * grad_ref.abs().max().item())


def test_perplexity_and_bits():
    assert info.perplexity(math.log(65)) == pytest.approx(65)
    torch.testing.assert_close(info.perplexity(torch.tensor([0.0, 1.0])), torch.tensor([1.0, math.e]))
    assert info.bits_per_char(math.log(2)) == pytest.approx(1.0)
    assert info.bits_per_char(math.log(4), chars_per_token=2.0) == pytest.approx(1.0)
    uniform = torch.zeros(10, 65, dtype=torch.float64)
    assert info.cross_entropy(uniform, torch.arange(10)).item() == pytest.approx(math.log(65))


def test_perplexity_and_bits_accept_numpy_scalars():
    """A loss read off a numpy array is a number too (this raised 'must be a non-negative number' before)."""
    assert info.perplexity(np.float32(1.0)) == pytest.approx(math.e)
    assert info.perplexity(np.float64(0.0)) == 1.0
    assert info.bits_per_char(np.float32(math.log(2))) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="non-negative"):
        info.perplexity(np.float32(-1.0))
    with pytest.raises(ValueError, match="non-negative"):
        info.perplexity("1.0")


def test_cross_entropy_plus_inf_logit_differs_from_pytorch_as_documented():
    """The docstring's one exception: a +inf logit at a non-target position gives inf here, NaN in PyTorch."""
    z = torch.tensor([[0.0, math.inf, 1.0]], dtype=torch.float64)
    assert info.cross_entropy(z, torch.tensor([0])).item() == math.inf
    assert F.cross_entropy(z, torch.tensor([0])).isnan()


def test_attention_entropy():
    w = torch.softmax(torch.randn(2, 4, 5, 5, dtype=torch.float64).masked_fill(
        ~torch.ones(5, 5, dtype=torch.bool).tril(), -math.inf), dim=-1)  # (B, h, T, T) causal
    H = info.attention_entropy(w)
    assert H.shape == (2, 4, 5)
    assert (H[..., 0] == 0).all()  # the first query sees one key
    max_entropy = torch.log(torch.arange(1, 6, dtype=torch.float64))  # log(number of keys query i sees)
    assert (H - max_entropy <= 1e-12).all()
    torch.testing.assert_close(info.attention_entropy(torch.full((3, 3), 1 / 3, dtype=torch.float64)),
                               torch.full((3,), math.log(3), dtype=torch.float64))


def test_attention_entropy_gradient_is_finite_through_masked_attention():
    """Masked keys get weight exactly 0; the entropy's gradient through softmax must stay finite there, and equal
    the gradient of the entropy of the softmax over the visible keys only."""
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(3, 5, 5, generator=g, dtype=torch.float64, requires_grad=True)
    causal = torch.ones(5, 5, dtype=torch.bool).tril()
    w = torch.softmax(scores.masked_fill(~causal, -math.inf), dim=-1)
    (grad,) = torch.autograd.grad(info.attention_entropy(w).sum(), scores)
    assert torch.isfinite(grad).all()
    assert (grad[:, ~causal] == 0).all()  # a key the query may not see gets no gradient
    for i in range(5):  # row i sees keys 0..i: the same entropy on the visible scores alone
        visible = scores[:, i, :i + 1]
        (ref,) = torch.autograd.grad(info.entropy(torch.softmax(visible, -1)).sum(), visible)
        torch.testing.assert_close(grad[:, i, :i + 1], ref, **TOL)
    # a fully masked row (all-zero weights, as scaled_dot_product_attention returns it) gets gradient 0
    zeros = torch.zeros(2, 4, dtype=torch.float64, requires_grad=True)
    (g0,) = torch.autograd.grad(info.attention_entropy(zeros).sum(), zeros)
    assert (g0 == 0).all()


def test_attention_entropy_of_a_fully_masked_row_is_zero():
    """scaled_dot_product_attention returns a fully masked row as zeros; its entropy is 0 (it failed before)."""
    from transformer_lab.attention import scaled_dot_product_attention
    g = torch.Generator().manual_seed(0)
    q, k = (torch.randn(2, 4, 3, generator=g, dtype=torch.float64) for _ in range(2))
    mask = torch.ones(4, 4, dtype=torch.bool).tril()
    mask[2] = False  # query 2 may see no key
    _, w = scaled_dot_product_attention(query=q, key=k, value=k, mask=mask)
    assert (w[:, 2] == 0).all()
    H = info.attention_entropy(w)
    assert H.shape == (2, 4) and (H[:, 2] == 0).all() and not torch.signbit(H).any()
    torch.testing.assert_close(H[:, [0, 1, 3]], info.entropy(w[:, [0, 1, 3]]), **TOL)
    with pytest.raises(ValueError, match="sum to 1"):
        info.attention_entropy(torch.tensor([[0.5, 0.0], [0.2, 0.2]], dtype=torch.float64))  # partly zero, not 1


def test_cross_entropy_of_minus_inf_logits_matches_pytorch():
    """A row of all -inf logits has no distribution: NaN, as in PyTorch; a -inf logit at the target costs inf."""
    z = torch.tensor([[-math.inf] * 3, [0.0, -math.inf, 1.0], [0.0, -math.inf, 1.0]], dtype=torch.float64)
    y = torch.tensor([0, 0, 1])
    ours, ref = info.cross_entropy(z, y, reduction="none"), F.cross_entropy(z, y, reduction="none")
    assert torch.isnan(ours[0]) and torch.isnan(ref[0])
    assert ours[1] == pytest.approx(ref[1].item(), abs=1e-15) and ours[2] == ref[2] == math.inf


# ---------------------------------------------------------------- n-gram estimates
def test_ngram_functions_name_their_unit():
    for alias in ("ngram_entropy", "ngram_cross_entropy", "ngram_baselines"):  # no unit-less names
        assert not hasattr(info, alias)
    text = "abcabcabcabd" * 30
    plug_in_bits = info.ngram_entropy_bits(text, 1)
    kn_nats = info.KneserNey(text, 1).cross_entropy(text)  # unigram KN on its own text: close to the plug-in
    assert plug_in_bits == pytest.approx(kn_nats / math.log(2), abs=0.05)
    assert plug_in_bits != pytest.approx(kn_nats, abs=0.05)  # the two units differ by a factor ln 2


def test_ngram_entropy_known_values():
    assert info.ngram_entropy_bits("abab" * 50, 1) == pytest.approx(1.0)
    assert info.ngram_entropy_bits("abab" * 50, 2) == pytest.approx(0.0)  # b always follows a
    assert info.ngram_entropy_bits("aaaa", 1) == 0.0
    text = "the quick brown fox jumps over the lazy dog " * 20
    H = [info.ngram_entropy_bits(text, n) for n in (1, 2, 3, 4)]
    assert all(a >= b - 1e-12 for a, b in itertools.pairwise(H))  # conditioning never increases entropy


def test_ngram_entropy_matches_direct_count():
    from collections import Counter
    text = "to be, or not to be, that is the question: " * 7 + "whether 'tis nobler"
    for n in (1, 2, 3):
        circle = text + text[:n - 1]  # read as a circle
        grams = Counter(circle[i:i + n] for i in range(len(text)))
        ctx = Counter()
        for gram, c in grams.items():
            ctx[gram[:-1]] += c
        N = sum(grams.values())
        direct = -sum(c / N * math.log2(c / ctx[g[:-1]]) for g, c in grams.items())
        assert info.ngram_entropy_bits(text, n) == pytest.approx(direct, abs=1e-12)


def test_ngram_cross_entropy_and_plug_in_entropy():
    train = "abcabcabcabd" * 30
    assert info.ngram_cross_entropy_bits(train, train, 1, alpha=1e-9) == pytest.approx(
        info.ngram_entropy_bits(train, 1), abs=1e-6)
    unseen = info.ngram_cross_entropy_bits(train, "xyz", 1)
    assert unseen > info.ngram_cross_entropy_bits(train, "abc", 1)
    plug_in = [info.ngram_entropy_bits(train, n) for n in (1, 2, 3)]
    assert plug_in[0] >= plug_in[1] >= plug_in[2]


def test_ngram_counts_by_hand():
    """c(h x) and c(h) in the training text for every bigram of the test text, counted by hand."""
    c_hx, c_h, V = info.ngram_counts("abab", "abz", 2)  # train bigrams ab, ba, ab; contexts a, b, a
    assert V == 3  # a, b, z
    assert c_hx.tolist() == [2, 0]  # c(ab) = 2, c(bz) = 0
    assert c_h.tolist() == [2, 1]  # a starts two training bigrams, b one
    alpha = 0.5  # the add-α model built from these counts
    want = -(math.log2((2 + alpha) / (2 + 3 * alpha)) + math.log2((0 + alpha) / (1 + 3 * alpha))) / 2
    assert info.ngram_cross_entropy_bits("abab", "abz", 2, alpha=alpha) == pytest.approx(want, abs=1e-15)


# ---------------------------------------------------------------- bad input
@pytest.mark.parametrize(("p", "match"), [
    (torch.tensor([0.5, 0.6], dtype=torch.float64), "sum to 1"),
    (torch.tensor([1.5, -0.5], dtype=torch.float64), r"\[0, 1\]"),
    (torch.tensor([1, 0]), "floating-point"),
    (torch.tensor(1.0), "at least one dimension"),
    ([0.5, 0.5], "torch.Tensor"),
    (torch.tensor([math.nan, 1.0]), "NaN"),
])
def test_entropy_bad_input(p, match):
    with pytest.raises(ValueError, match=match):
        info.entropy(p)


def test_entropy_bad_dim():
    with pytest.raises(ValueError, match="out of range"):
        info.entropy(torch.tensor([0.5, 0.5]), dim=2)


def test_kl_bad_input():
    p = torch.tensor([0.5, 0.5], dtype=torch.float64)
    with pytest.raises(ValueError, match="same shape"):
        info.kl_divergence(p, torch.full((4,), 0.25, dtype=torch.float64))
    with pytest.raises(ValueError, match="q must sum to 1"):
        info.kl_divergence(p, torch.tensor([0.5, 0.4], dtype=torch.float64))
    with pytest.raises(ValueError, match="same shape"):
        info.distribution_cross_entropy(p, torch.full((4,), 0.25, dtype=torch.float64))


@pytest.mark.parametrize(("logits", "targets", "kw", "match"), [
    (torch.zeros(4, 5), torch.zeros(4), {}, "integer"),
    (torch.zeros(4, 5, dtype=torch.long), torch.zeros(4, dtype=torch.long), {}, "floating-point"),
    (torch.zeros(5), torch.zeros((), dtype=torch.long), {}, r"\(N, V\) or \(B, T, V\)"),
    (torch.zeros(2, 3, 4, 5), torch.zeros(2, 3, 4, dtype=torch.long), {}, r"\(N, V\) or \(B, T, V\)"),
    (torch.zeros(4, 5), torch.zeros(3, dtype=torch.long), {}, "targets must have shape"),
    (torch.zeros(2, 3, 5), torch.zeros(3, 2, dtype=torch.long), {}, "targets must have shape"),
    (torch.zeros(4, 5), torch.tensor([0, 1, 5, 2]), {}, r"\[0, 5\)"),
    (torch.zeros(4, 5), torch.tensor([0, 1, -3, 2]), {}, r"\[0, 5\)"),
    (torch.zeros(4, 5), torch.tensor([0, 1, 2, 3]), {"reduction": "avg"}, "reduction"),
    (torch.zeros(4, 5), torch.tensor([True, False, True, True]), {}, "integer"),
])
def test_cross_entropy_bad_input(logits, targets, kw, match):
    with pytest.raises(ValueError, match=match):
        info.cross_entropy(logits, targets, **kw)


def test_scalar_helpers_bad_input():
    with pytest.raises(ValueError, match="non-negative"):
        info.perplexity(-1.0)
    with pytest.raises(ValueError, match=">= 0"):
        info.perplexity(torch.tensor([-0.1]))
    with pytest.raises(ValueError, match="non-negative"):
        info.bits_per_char("2.0")
    with pytest.raises(ValueError, match="chars_per_token"):
        info.bits_per_char(1.0, chars_per_token=0)
    with pytest.raises(ValueError, match=r"\(\.\.\., T_q, T_k\)"):
        info.attention_entropy(torch.tensor([0.5, 0.5]))
    with pytest.raises(ValueError, match="sum to 1"):
        info.attention_entropy(torch.ones(3, 3))


def test_ngram_bad_input():
    with pytest.raises(ValueError, match="integer >= 1"):
        info.ngram_entropy_bits("abc", 0)
    with pytest.raises(ValueError, match="integer >= 1"):
        info.ngram_entropy_bits("abc", 1.5)
    with pytest.raises(ValueError, match="at least n=4"):
        info.ngram_entropy_bits("abc", 4)
    with pytest.raises(ValueError, match="must be a str"):
        info.ngram_entropy_bits(["a", "b"], 1)
    with pytest.raises(ValueError, match="too large"):
        info.ngram_entropy_bits("".join(map(chr, range(40, 140))) * 3, 12)
    with pytest.raises(ValueError, match="alpha must be > 0"):
        info.ngram_cross_entropy_bits("abc", "abc", 1, alpha=0)


# ---------------------------------------------------------------- the Kneser–Ney baseline
def _kn_reference(train: str, n: int, alphabet: str, D: float):
    """Interpolated Kneser–Ney in plain Python, straight from the formula, for P(x | h)."""
    from collections import Counter
    grams = {k: Counter(train[i:i + k] for i in range(len(train) - k + 1)) for k in range(1, n + 2)}

    def a(k):  # counts of level k: raw at the top, continuation N1+(• g) below
        return grams[k] if k == n else Counter(g[1:] for g in grams[k + 1])

    def p(x, h, k):
        if k == 0:
            return 1 / len(alphabet)
        if len(h) < k - 1:  # a shorter history than level k needs: level k is skipped
            return p(x, h, k - 1)
        h = h[len(h) - (k - 1):] if k > 1 else ""
        ak = a(k)
        total = sum(c for g, c in ak.items() if g[:-1] == h)
        lower = p(x, h[1:], k - 1)
        if total == 0:
            return lower
        types = sum(1 for g in ak if g[:-1] == h)
        return (max(ak[h + x] - D, 0) + D * types * lower) / total

    return p


def test_kneser_ney_hand_computation():
    m = info.KneserNey("abcab", 2, alphabet="abc", discount=0.5)
    # level 1: continuation counts N(•a) = N(•b) = N(•c) = 1 -> uniform 1/3; level 2: c(ab) = 2, c(bc) = c(ca) = 1
    np.testing.assert_allclose(m.distribution("a"), [1 / 12, 5 / 6, 1 / 12], rtol=1e-15)
    np.testing.assert_allclose(m.distribution(""), [1 / 3] * 3, rtol=1e-15)
    expected = -(math.log(1 / 3) + math.log(5 / 6) + 2 * math.log(2 / 3)) / 4  # "abca": a | -, b | a, c | b, a | c
    assert m.cross_entropy("abca") == pytest.approx(expected, abs=1e-15)
    assert info.ngram_baselines_nats("abcab", (2,), held_out="abca", discount=0.5)[2] == pytest.approx(expected,
                                                                                                    abs=1e-15)


def test_kneser_ney_estimates_ney_discount_by_hand():
    """D_k = n1 / (n1 + 2 n2) from each level's counts of counts; 0.5 where a level has no counts 1 or 2."""
    m = info.KneserNey("aaabab", 2)  # bigrams aa ×2, ab ×2, ba ×1: n1 = 1, n2 = 2 -> D_2 = 1/5
    assert m.levels[1][-1] == pytest.approx(1 / 5, abs=1e-15)
    # level 1, continuation counts N1+(• x): a is preceded by a and b (2), b by a (1): n1 = 1, n2 = 1 -> D_1 = 1/3
    assert m.levels[0][-1] == pytest.approx(1 / 3, abs=1e-15)
    assert info.KneserNey("aaaaaaa", 1).levels[0][-1] == 0.5  # one unigram seen 7 times: n1 = n2 = 0


def test_kneser_ney_matches_plain_python_formula():
    train, alphabet = "the cat sat on the mat; the rat ate the hat", "".join(sorted(set("the cat sat on mr;")))
    for n in (1, 2, 3):
        m = info.KneserNey(train, n, alphabet=alphabet, discount=0.6)
        ref = _kn_reference(train, n, alphabet, 0.6)
        for ctx in ("th", "e ", "rr", ";m", "t", ""):  # "rr", ";m": contexts never seen
            want = [ref(x, ctx, n) for x in alphabet]
            np.testing.assert_allclose(m.distribution(ctx), want, rtol=1e-13)


def test_kneser_ney_distributions_sum_to_one():
    from transformer_lab.data import load_corpus
    corpus = load_corpus()
    alphabet = "".join(sorted(set(corpus.text)))
    for n in (1, 2, 5):
        m = info.KneserNey(corpus.text[:50_000], n, alphabet=alphabet)  # discounts estimated per level
        for ctx in ("the k", "ROMEO", "qqqqq", "\n\n", "", "zX"):
            d = m.distribution(ctx)
            assert abs(d.sum() - 1) < 1e-12 and (d > 0).all(), (n, ctx)


def test_ngram_baselines_on_the_corpus_beat_add_alpha():
    from transformer_lab.data import load_corpus
    corpus = load_corpus()
    train, val = corpus.text[:len(corpus.train)], corpus.text[len(corpus.train):]
    bits = {n: v / math.log(2) for n, v in info.ngram_baselines_nats(train, (1, 3, 5), held_out=val).items()}
    add_alpha = {n: info.ngram_cross_entropy_bits(train, val, n) for n in (1, 3, 5)}
    assert 2.2 < bits[5] < 2.47 < add_alpha[5]  # KN 5-gram ≈ 2.32 bits; add-0.1 ≈ 2.62 bits
    assert bits[1] > bits[3] > bits[5]
    for n in (1, 3):  # at n <= 3 the two smoothings agree to ~0.01 bit (n = 2 ≈ 0.002, not computed here)
        assert bits[n] == pytest.approx(add_alpha[n], abs=0.01)


def test_ngram_baselines_bad_input():
    with pytest.raises(ValueError, match="discount"):
        info.KneserNey("abc", 2, discount=1.5)
    with pytest.raises(ValueError, match="alphabet"):
        info.KneserNey("abc", 2).cross_entropy("abz")
    with pytest.raises(ValueError, match="orders"):
        info.ngram_baselines_nats("abcabc", (0,))
    with pytest.raises(ValueError, match="str"):
        info.ngram_baselines_nats(["a"], (1,))
    assert set(info.ngram_baselines_nats("abcabcabcd" * 10, (1, 2))) == {1, 2}  # default split 90 / 10
