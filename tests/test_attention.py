"""Chapter 1: attention, multi-head attention, embeddings, weight tying.

Three-way agreement in float64: SymPy (lambdified) = transformer_lab = PyTorch (F.scaled_dot_product_attention,
nn.MultiheadAttention with copied weights), values and gradients. Tolerance: atol = rtol = 1e-12 (float64 round-off
on these small sizes is ~1e-16; 1e-12 leaves room for different summation orders and nothing more).
"""

import numpy as np
import pytest
import sympy as sp
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from transformer_lab.attention import (
    Embedding,
    MultiHeadAttention,
    attention_formula,
    merge_heads,
    scaled_dot_product_attention,
    split_heads,
    tie_weights,
)
from transformer_lab.derivations import ch1
from transformer_lab.reference import multihead_reference
from transformer_lab.softmax import LMHead

TOL = {"atol": 1e-12, "rtol": 1e-12}


def rnd(*shape, seed=0, grad=False):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64).requires_grad_(grad)


# ------------------------------------------------------------------ scaled dot-product attention
@pytest.mark.parametrize("masked", [False, True])
def test_sdpa_sympy_ours_torch(masked):
    T_q, T_k, d_k, d_v = 3, 4, 2, 3
    mask = [[True, False, True, True], [True, True, False, False], [False, True, True, True]] if masked else None
    Q, K, V = rnd(T_q, d_k, seed=1), rnd(T_k, d_k, seed=2), rnd(T_k, d_v, seed=3)
    sym_o, sym_a = ch1.attention_function(T_q, T_k, d_k, d_v, mask)(Q.numpy(), K.numpy(), V.numpy())
    mt = None if mask is None else torch.tensor(mask)
    out, weights = scaled_dot_product_attention(query=Q, key=K, value=V, mask=mt)
    ref = F.scaled_dot_product_attention(Q, K, V, attn_mask=mt)
    torch.testing.assert_close(out, torch.as_tensor(np.asarray(sym_o, dtype=np.float64)), **TOL)
    torch.testing.assert_close(weights, torch.as_tensor(np.asarray(sym_a, dtype=np.float64)), **TOL)
    torch.testing.assert_close(out, ref, **TOL)
    torch.testing.assert_close(weights.sum(-1), torch.ones(T_q, dtype=torch.float64), **TOL)


@pytest.mark.parametrize(("shape_q", "shape_k", "mask_shape"), [
    ((2, 3, 5, 4), (2, 3, 7, 4), (5, 7)),  # batch and heads, one mask for all
    ((2, 1, 6, 4), (2, 3, 6, 4), (2, 1, 6, 6)),  # broadcast over heads
    ((1, 1, 4), (1, 1, 4), None),  # length-1 sequences
])
def test_sdpa_values_and_gradients_match_torch(shape_q, shape_k, mask_shape):
    q, k = rnd(*shape_q, seed=4, grad=True), rnd(*shape_k, seed=5, grad=True)
    v = rnd(*shape_k[:-1], 3, seed=6, grad=True)
    mask = None if mask_shape is None else torch.rand(mask_shape, generator=torch.Generator().manual_seed(7)) > 0.3
    ours, _ = scaled_dot_product_attention(query=q, key=k, value=v, mask=mask)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(ours, ref, **TOL)
    up = rnd(*ours.shape, seed=8)
    g_ours = torch.autograd.grad((ours * up).sum(), (q, k, v))
    g_ref = torch.autograd.grad((ref * up).sum(), (q, k, v))
    for a, b in zip(g_ours, g_ref, strict=True):
        torch.testing.assert_close(a, b, **TOL)


def test_sdpa_fully_masked_row_is_zero_with_finite_gradients():
    q, k, v = rnd(1, 3, 4, seed=1, grad=True), rnd(1, 5, 4, seed=2, grad=True), rnd(1, 5, 2, seed=3, grad=True)
    mask = torch.ones(3, 5, dtype=torch.bool)
    mask[1] = False
    out, w = scaled_dot_product_attention(query=q, key=k, value=v, mask=mask)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert torch.equal(out[0, 1], torch.zeros(2, dtype=torch.float64))
    assert torch.equal(w[0, 1], torch.zeros(5, dtype=torch.float64))
    torch.testing.assert_close(out, ref, **TOL)
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    assert all(torch.isfinite(g).all() for g in grads)
    torch.testing.assert_close(grads, torch.autograd.grad(ref.sum(), (q, k, v)), **TOL)


def test_sdpa_causal_mask_and_custom_scale():
    q, k, v = rnd(2, 6, 8, seed=1), rnd(2, 6, 8, seed=2), rnd(2, 6, 8, seed=3)
    causal = torch.ones(6, 6, dtype=torch.bool).tril()
    ours, w = scaled_dot_product_attention(query=q, key=k, value=v, mask=causal, scale=0.3)
    torch.testing.assert_close(ours, F.scaled_dot_product_attention(q, k, v, attn_mask=causal, scale=0.3), **TOL)
    assert torch.equal(w.triu(1), torch.zeros_like(w))  # no weight on the future


@pytest.mark.parametrize(("T", "lead"), [(1, (2,)), (8, (2,)), (33, (2, 3)), (65, ())])
def test_sdpa_is_causal_equals_the_explicit_mask_and_torch(T, lead):
    """is_causal: the same values and gradients as the explicit causal mask and as PyTorch's is_causal."""
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    q, k, v = (rnd(*lead, T, 8, seed=s, grad=True) for s in (1, 2, 3))
    g = rnd(*lead, T, 8, seed=4)
    results = []
    for kwargs in ({"is_causal": True, "need_weights": False}, {"mask": mask}):
        out, w = scaled_dot_product_attention(query=q, key=k, value=v, **kwargs)
        assert (w is None) is ("is_causal" in kwargs)
        results.append((out, *torch.autograd.grad(out, (q, k, v), g)))
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    results.append((ref, *torch.autograd.grad(ref, (q, k, v), g)))
    for causal, full, torch_ in zip(*results, strict=True):
        torch.testing.assert_close(causal, full, **TOL)
        torch.testing.assert_close(causal, torch_, **TOL)


def test_sdpa_is_causal_with_a_cache_offset_and_bad_use():
    """With T_k > T_q the queries are the last T_q positions, as in generation with a key/value cache."""
    q, k, v = rnd(2, 3, 8, seed=1), rnd(2, 7, 8, seed=2), rnd(2, 7, 8, seed=3)
    ours, _ = scaled_dot_product_attention(query=q, key=k, value=v, is_causal=True)
    mask = torch.ones(3, 7, dtype=torch.bool).tril(diagonal=4)
    torch.testing.assert_close(ours, F.scaled_dot_product_attention(q, k, v, attn_mask=mask), **TOL)
    one, _ = scaled_dot_product_attention(query=q[:, -1:], key=k, value=v, is_causal=True)  # one new token
    torch.testing.assert_close(one, F.scaled_dot_product_attention(q[:, -1:], k, v), **TOL)
    with pytest.raises(ValueError, match="either mask or is_causal"):
        scaled_dot_product_attention(query=q, key=k, value=v, mask=mask, is_causal=True)
    with pytest.raises(ValueError, match="T_k >= T_q"):
        scaled_dot_product_attention(query=k, key=q, value=q, is_causal=True)


def test_sdpa_huge_scores_are_stable():
    q = rnd(1, 4, 4, seed=1) * 1e4
    k, v = rnd(1, 4, 4, seed=2) * 1e4, rnd(1, 4, 4, seed=3)
    ours, w = scaled_dot_product_attention(query=q, key=k, value=v)
    assert torch.isfinite(ours).all()
    assert torch.isfinite(w).all()
    torch.testing.assert_close(ours, F.scaled_dot_product_attention(q, k, v), **TOL)


def test_sdpa_dropout_is_seeded_and_unbiased():
    q, k, v = rnd(1, 4, 3, seed=1), rnd(1, 4, 3, seed=2), rnd(1, 4, 3, seed=3)
    a = scaled_dot_product_attention(query=q, key=k, value=v, dropout=0.5, generator=torch.Generator().manual_seed(1))
    b = scaled_dot_product_attention(query=q, key=k, value=v, dropout=0.5, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(a, b, atol=0, rtol=0)
    _, w = scaled_dot_product_attention(query=q, key=k, value=v)
    g = torch.Generator().manual_seed(2)
    draws = [t.expand(4000, 4, 3) for t in (q, k, v)]  # 4000 independent masks in one call
    mean = scaled_dot_product_attention(query=draws[0], key=draws[1], value=draws[2], dropout=0.5, generator=g)[1]
    torch.testing.assert_close(mean.mean(0, keepdim=True), w, atol=0.03, rtol=0)  # E = weights; 4000 draws: σ < 0.01


def test_sdpa_float32():
    q, k, v = (t.float() for t in (rnd(2, 3, 4, seed=1), rnd(2, 5, 4, seed=2), rnd(2, 5, 4, seed=3)))
    ours, _ = scaled_dot_product_attention(query=q, key=k, value=v)
    assert ours.dtype == torch.float32
    torch.testing.assert_close(ours, F.scaled_dot_product_attention(q, k, v), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"query": torch.zeros(4)}, r"query must be .* \(\.\.\., T, d\)"),
    ({"key": torch.zeros(2, 5, 3)}, r"must share d_k"),
    ({"value": torch.zeros(2, 4, 2)}, r"must share T_k"),
    ({"mask": torch.ones(3, 4)}, r"dtype torch.bool"),
    ({"mask": torch.ones(3, 4, dtype=torch.bool)}, r"does not broadcast .*\(\.\.\., T_q, T_k\)"),
    ({"mask": torch.ones(2, 2, 3, 5, dtype=torch.bool)}, r"does not broadcast"),
    ({"key": torch.zeros(3, 5, 4), "value": torch.zeros(3, 5, 2)}, r"leading .* do not broadcast"),
    ({"dropout": 1.0}, r"dropout must be in \[0, 1\)"),
    ({"query": torch.zeros(2, 3, 4, dtype=torch.long)}, r"floating-point"),
])
def test_sdpa_bad_input(kwargs, match):
    args = {"query": torch.zeros(2, 3, 4), "key": torch.zeros(2, 5, 4), "value": torch.zeros(2, 5, 2), **kwargs}
    with pytest.raises(ValueError, match=match):
        scaled_dot_product_attention(**args)


# ------------------------------------------------------------------ heads
def test_split_merge_roundtrip_and_permutation():
    x = rnd(2, 3, 8, seed=1)
    h = split_heads(x, 4)
    assert h.shape == (2, 4, 3, 2)
    torch.testing.assert_close(merge_heads(h), x, atol=0, rtol=0)
    torch.testing.assert_close(h[:, 1], x[..., 2:4], atol=0, rtol=0)  # head 1 = columns 2:4
    P = ch1.split_permutation(3, 8, 4)
    assert sp.eye(24) == P * P.T  # a permutation: merge = Pᵀ = P⁻¹
    Pt = torch.tensor(P.tolist(), dtype=torch.float64)
    torch.testing.assert_close(Pt @ x[0].reshape(-1), split_heads(x, 4)[0].reshape(-1), atol=0, rtol=0)


@pytest.mark.parametrize(("x", "n_head", "match"), [
    (torch.zeros(3, 8), 2, r"\(B, T, C\)"),
    (torch.zeros(1, 3, 8), 3, r"divisible by n_head"),
    (torch.zeros(1, 3, 8), 0, r"divisible by n_head"),
])
def test_split_heads_bad_input(x, n_head, match):
    with pytest.raises(ValueError, match=match):
        split_heads(x, n_head)


def test_merge_heads_bad_input():
    with pytest.raises(ValueError, match=r"\(B, h, T, d_k\)"):
        merge_heads(torch.zeros(2, 3, 4))


# ------------------------------------------------------------------ multi-head attention
@pytest.mark.parametrize(("bias", "self_attention", "mask_kind"), [
    (True, True, None), (True, True, "causal"), (False, True, "causal"), (True, False, "batch"),
    (True, True, "padding"),
])
def test_mha_matches_nn_multiheadattention(bias, self_attention, mask_kind):
    torch.manual_seed(0)
    B, T, C, h = 2, 5, 12, 3
    ours = MultiHeadAttention(C, h, bias=bias).double()
    if bias:
        with torch.no_grad():
            ours.in_proj.bias.normal_()
            ours.out_proj.bias.normal_()
    ref = multihead_reference(ours)
    x = rnd(B, T, C, seed=1, grad=True)
    if self_attention:
        q = k = v = x
        T_k = T
    else:
        q, k, v = x, rnd(B, 7, C, seed=2, grad=True), rnd(B, 7, C, seed=3, grad=True)
        T_k = 7
    ref_mask = None
    mask = None
    if mask_kind == "causal":
        mask = torch.ones(T, T_k, dtype=torch.bool).tril()
        ref_mask = ~mask
    elif mask_kind == "batch":  # one mask per sequence (B, T_q, T_k)
        mask = torch.rand(B, T, T_k, generator=torch.Generator().manual_seed(3)) > 0.3
        mask[..., 0] = True
        ref_mask = (~mask).repeat_interleave(h, dim=0)  # nn.MultiheadAttention wants (B·h, T_q, T_k)
    elif mask_kind == "padding":  # key padding as a (B, 1, 1, T_k) mask
        mask = torch.ones(B, 1, 1, T_k, dtype=torch.bool)
        mask[1, ..., 3:] = False
        ref_mask = (~mask).expand(B, h, T, T_k).reshape(B * h, T, T_k)
    out, w = ours(query=q, key=k, value=v, mask=mask, need_weights=True)
    ref_out, ref_w = ref(q, k, v, attn_mask=ref_mask, need_weights=True, average_attn_weights=False)
    torch.testing.assert_close(out, ref_out, **TOL)
    torch.testing.assert_close(w, ref_w, **TOL)
    up = rnd(*out.shape, seed=9)
    params_ours = [ours.in_proj.weight, ours.out_proj.weight]
    params_ref = [ref.in_proj_weight, ref.out_proj.weight]
    if bias:
        params_ours += [ours.in_proj.bias, ours.out_proj.bias]
        params_ref += [ref.in_proj_bias, ref.out_proj.bias]
    inputs = [x] if self_attention else [q, k, v]
    g_ours = torch.autograd.grad((out * up).sum(), inputs + params_ours)
    g_ref = torch.autograd.grad((ref_out * up).sum(), inputs + params_ref)
    for a, b in zip(g_ours, g_ref, strict=True):
        torch.testing.assert_close(a, b, **TOL)


def test_mha_equals_sum_over_heads_sympy():
    assert max(ch1.check(seed=3).values()) < 1e-12


def test_mha_returns_tensor_without_weights_and_state_dict_names():
    m = MultiHeadAttention(8, 2)
    y = m(query=torch.zeros(1, 3, 8), key=torch.zeros(1, 3, 8), value=torch.zeros(1, 3, 8))
    assert isinstance(y, torch.Tensor)
    assert y.shape == (1, 3, 8)
    assert set(m.state_dict()) == {"in_proj.weight", "in_proj.bias", "out_proj.weight", "out_proj.bias"}


def test_mha_dropout_only_in_training():
    torch.manual_seed(0)
    m = MultiHeadAttention(8, 2, dropout=0.5).double()
    x = rnd(1, 4, 8, seed=1)
    m.eval()
    a, b = (m(query=x, key=x, value=x) for _ in range(2))
    torch.testing.assert_close(a, b, atol=0, rtol=0)
    m.train()
    assert not torch.allclose(m(query=x, key=x, value=x), a)


@pytest.mark.parametrize(("args", "match"), [
    ((10, 3), r"d_model % n_head must be 0"),
    ((0, 1), r"d_model must be a positive int"),
    ((8, -2), r"n_head must be a positive int"),
])
def test_mha_bad_construction(args, match):
    with pytest.raises(ValueError, match=match):
        MultiHeadAttention(*args)


def test_mha_bad_dropout():
    with pytest.raises(ValueError, match=r"dropout must be in \[0, 1\)"):
        MultiHeadAttention(8, 2, dropout=1.5)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"query": torch.zeros(3, 8)}, r"query must have shape \(B, T, C=8\)"),
    ({"key": torch.zeros(2, 3, 6)}, r"key must have shape \(B, T, C=8\)"),
    ({"key": torch.zeros(1, 3, 8), "value": torch.zeros(1, 3, 8)}, r"share the batch size"),
    ({"value": torch.zeros(2, 4, 8)}, r"share T_k"),
    ({"mask": torch.ones(3, 4, dtype=torch.bool)}, r"\(B, h, T_q, T_k\)|T_q, T_k"),
    ({"mask": torch.ones(2, 3, dtype=torch.bool).tril()}, r"does not broadcast"),
    ({"mask": torch.ones(3, 3)}, r"torch.bool"),
])
def test_mha_bad_input(kwargs, match):
    m = MultiHeadAttention(8, 2)
    args = {"query": torch.zeros(2, 3, 8), "key": torch.zeros(2, 3, 8), "value": torch.zeros(2, 3, 8), **kwargs}
    with pytest.raises(ValueError, match=match):
        m(**args)


# ------------------------------------------------------------------ embeddings and tying
def test_embedding_is_one_hot_times_matrix_and_matches_torch():
    emb = Embedding(7, 4).double()
    idx = torch.tensor([[0, 6, 3], [3, 3, 1]])
    torch.testing.assert_close(emb(idx), F.one_hot(idx, 7).double() @ emb.weight, **TOL)
    torch.testing.assert_close(emb(idx), F.embedding(idx, emb.weight), atol=0, rtol=0)
    g = torch.autograd.grad(emb(idx).sum(), emb.weight)[0]
    assert torch.equal(g[:, 0], torch.bincount(idx.reshape(-1), minlength=7).double())  # each row's use count
    r = ch1.embedding_lookup(5, 3, 2)
    assert r["product"] == r["row"]


@pytest.mark.parametrize(("idx", "match"), [
    (torch.tensor([0, 7]), r"\[0, vocab_size=7\)"),
    (torch.tensor([-1]), r"\[0, vocab_size=7\)"),
    (torch.tensor([0.0, 1.0]), r"integer tensor"),
])
def test_embedding_bad_input(idx, match):
    with pytest.raises(ValueError, match=match):
        Embedding(7, 4)(idx)


def test_tie_weights_shares_one_parameter():
    emb, head = Embedding(11, 6), LMHead(6, 11)
    tie_weights(head, emb)
    assert head.weight is emb.weight
    x = rnd(2, 6, seed=1).float()
    torch.testing.assert_close(head(x), x @ emb.weight.T, atol=0, rtol=0)
    model = nn.ModuleDict({"emb": emb, "head": head})
    assert sum(p.numel() for p in model.parameters()) == 11 * 6  # counted once
    lin = nn.Linear(6, 11, bias=False)
    tie_weights(lin, emb)
    assert lin.weight is emb.weight


def test_tie_weights_bad_shapes():
    with pytest.raises(ValueError, match=r"shape \(11, 6\)"):
        tie_weights(LMHead(6, 10), Embedding(11, 6))
    with pytest.raises(ValueError, match=r"\.weight"):
        tie_weights(nn.ReLU(), Embedding(11, 6))


# ------------------------------------------------------------------ derivations
def test_rank_of_scores_is_at_most_d_k():
    r = ch1.rank_of_scores(3, 2)
    assert r["det"] == 0  # a 3 × 3 product of rank-2 factors is singular, identically
    assert r["rank_random_integer"] == 2
    S = rnd(8, 3, seed=1) @ rnd(8, 3, seed=2).T
    assert torch.linalg.matrix_rank(S) == 3


def test_derivation_check_all_small():
    for name, err in ch1.check(seed=0).items():
        assert err < 1e-12, name


def test_sdpa_without_gradients_the_same_values():
    """With nothing to differentiate: the same out and weights as with a graph."""
    q, k, v = (rnd(2, 3, 6, 4, seed=s) for s in (1, 2, 3))
    mask = torch.ones(6, 6, dtype=torch.bool).tril()
    plain = scaled_dot_product_attention(query=q, key=k, value=v, mask=mask)
    graph = scaled_dot_product_attention(query=q.requires_grad_(), key=k, value=v, mask=mask)
    assert plain[0].grad_fn is None and graph[0].grad_fn is not None
    for a, b in zip(plain, graph, strict=True):
        torch.testing.assert_close(a, b.detach(), atol=0, rtol=0)
    assert scaled_dot_product_attention(query=q.detach(), key=k, value=v, mask=mask, need_weights=False)[1] is None


# ------------------------------------------------------------------ the five-line formula and the causal convention
def test_attention_formula_equals_the_package_values_and_gradients():
    q, k, v = (rnd(2, 3, 5, 4, seed=s, grad=True) for s in (11, 12, 13))
    mask = torch.ones(5, 5, dtype=torch.bool).tril()
    for m in (None, mask):
        fast = scaled_dot_product_attention(query=q, key=k, value=v, mask=m)
        plain = attention_formula(query=q, key=k, value=v, mask=m)
        for a, b in zip(fast, plain, strict=True):
            torch.testing.assert_close(a, b, **TOL)
        g_fast = torch.autograd.grad(fast[0].square().sum(), [q, k, v])
        g_plain = torch.autograd.grad(plain[0].square().sum(), [q, k, v])
        for a, b in zip(g_fast, g_plain, strict=True):
            torch.testing.assert_close(a, b, **TOL)


def test_attention_formula_gives_nan_where_the_package_gives_zero():
    """A fully masked row is 0/0: NaN in the formula, 0 by convention in the package (as in PyTorch)."""
    q, k, v = rnd(2, 2, seed=1), rnd(3, 2, seed=2), rnd(3, 2, seed=3)
    mask = torch.tensor([[True, False, True], [False, False, False]])
    assert attention_formula(query=q, key=k, value=v, mask=mask)[0][1].isnan().all()
    assert (scaled_dot_product_attention(query=q, key=k, value=v, mask=mask)[0][1] == 0).all()
    assert (F.scaled_dot_product_attention(q, k, v, attn_mask=mask)[1] == 0).all()


def test_is_causal_is_bottom_right_unlike_torch_top_left():
    """Chapter 1 states the convention: with T_q < T_k our is_causal lets query i see keys j <= i + T_k - T_q
    (the queries are the last positions, a key-value cache), while F.scaled_dot_product_attention(is_causal=True)
    uses j <= i; for T_q = T_k they agree."""
    q, k, v = rnd(2, 4, seed=1), rnd(5, 4, seed=2), rnd(5, 3, seed=3)
    ours = scaled_dot_product_attention(query=q, key=k, value=v, is_causal=True)[0]
    bottom_right = torch.ones(2, 5, dtype=torch.bool).tril(diagonal=3)
    torch.testing.assert_close(ours, F.scaled_dot_product_attention(q, k, v, attn_mask=bottom_right), **TOL)
    assert not torch.allclose(ours, F.scaled_dot_product_attention(q, k, v, is_causal=True))
    q5 = rnd(5, 4, seed=4)
    torch.testing.assert_close(scaled_dot_product_attention(query=q5, key=k, value=v, is_causal=True)[0],
                               F.scaled_dot_product_attention(q5, k, v, is_causal=True), **TOL)


def torch_half_sdpa(*args, **kwargs):
    """PyTorch's SDPA; its math kernel where the fused CPU kernel refuses the kernel set (in bfloat16 it needs
    AVX-512's packing, which ``ATEN_CPU_CAPABILITY=default`` turns off even on an AVX-512 CPU)."""
    try:
        return F.scaled_dot_product_attention(*args, **kwargs)
    except RuntimeError as exc:
        if "avx512" not in str(exc):
            raise
    with sdpa_kernel(SDPBackend.MATH):
        return F.scaled_dot_product_attention(*args, **kwargs)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_sdpa_half_precision_is_computed_in_float32(dtype):
    """Review finding 11: float16 / bfloat16 used to be computed in their own dtype, with 1.2-1.8x PyTorch's error
    against float64, and float16 scores of 80,000 (q = k = 200, d = 4) overflowed to inf and gave NaN."""
    q, k, v = (rnd(2, 4, 64, 32, seed=s) for s in (1, 2, 3))
    exact = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    ours = scaled_dot_product_attention(query=q.to(dtype), key=k.to(dtype), value=v.to(dtype), is_causal=True)[0]
    torch_err = (torch_half_sdpa(q.to(dtype), k.to(dtype), v.to(dtype), is_causal=True).double()
                 - exact).abs().max()
    assert ours.dtype == dtype and (ours.double() - exact).abs().max() <= 1.05 * torch_err
    big = torch.full((1, 4), 200.0, dtype=dtype)
    out, weights = scaled_dot_product_attention(query=big, key=big, value=torch.ones(1, 4, dtype=dtype))
    assert torch.isfinite(out).all() and out.dtype == weights.dtype == dtype and float(weights.sum()) == 1.0
    x = q.to(dtype).requires_grad_()  # gradients flow back to the half-precision input, finite, in its dtype
    out = scaled_dot_product_attention(query=x, key=x, value=x, is_causal=True, need_weights=False)[0]
    (g,) = torch.autograd.grad(out.float().square().sum(), x)
    assert g.dtype == dtype and torch.isfinite(g).all()


@pytest.mark.parametrize(("q_dtype", "kv_dtype"), [(torch.float16, torch.float64), (torch.float32, torch.float64),
                                                   (torch.bfloat16, torch.float64)])
def test_sdpa_mixed_dtypes_raise_a_clear_error(q_dtype, kv_dtype):
    """Review 2, nit 7: a float16 query with a float64 key used to end in a bare matmul RuntimeError."""
    q, k = torch.randn(2, 3, dtype=q_dtype), torch.randn(4, 3, dtype=kv_dtype)
    with pytest.raises(ValueError, match=r"must share a dtype .* got torch\.\w+, torch\.float64, torch\.float64"):
        scaled_dot_product_attention(query=q, key=k, value=k)


def test_sdpa_half_mixed_with_float32_still_works():
    """float16 / bfloat16 are computed in float32, so mixing them with float32 stays allowed: out in query's dtype."""
    q, k = torch.randn(2, 3, dtype=torch.float16), torch.randn(4, 3, dtype=torch.float32)
    out, weights = scaled_dot_product_attention(query=q, key=k, value=k.to(torch.bfloat16))
    assert out.dtype == weights.dtype == torch.float16 and torch.isfinite(out).all()


def test_a_fully_masked_query_gives_the_output_bias_and_composes_with_attention_entropy():
    """Issue 12, bug 9: the documented behaviour on a padding row is the real one. Attention gives that row weights
    0 and head outputs 0 (like F.scaled_dot_product_attention; nn.MultiheadAttention gives NaN), so the module
    returns out_proj's bias there, and attention_entropy reads those weights as entropy 0, not NaN."""
    from transformer_lab.attention import MultiHeadAttention
    from transformer_lab.information import attention_entropy

    torch.manual_seed(0)
    mha = MultiHeadAttention(8, 2)
    torch.nn.init.normal_(mha.out_proj.bias)
    x = torch.randn(2, 3, 8)
    mask = torch.ones(2, 3, 3, dtype=torch.bool)
    mask[1, 0] = False  # batch 1, query 0: every key is padding
    out, weights = mha(query=x, key=x, value=x, mask=mask, need_weights=True)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out[1, 0], mha.out_proj.bias.detach(), rtol=0, atol=0)
    assert (weights[1, :, 0] == 0).all()
    torch.testing.assert_close(weights[1, :, 1:].sum(-1), torch.ones(2, 2))
    entropy = attention_entropy(weights)  # (B, h, T_q)
    assert torch.isfinite(entropy).all() and (entropy[1, :, 0] == 0).all() and (entropy[1, :, 1:] > 0).all()
    reference = torch.nn.MultiheadAttention(8, 2, batch_first=True)
    assert torch.isnan(reference(x, x, x, attn_mask=~mask[1])[0][0, 0]).all()  # PyTorch's module: NaN
