"""Chapter 1 (linear algebra): attention, heads and embeddings on small symbolic matrices.

Most functions build SymPy matrices on symbols. The exceptions: :func:`split_permutation` builds a 0/1 permutation
matrix for given sizes; :func:`rank_of_scores` also returns the rank of one random integer instance;
:func:`attention_function` and :func:`attention_gradient_function` are NumPy callables lambdified from the symbolic
matrices; and :func:`check` returns floats:
on one random float64 instance, the largest disagreement with ``transformer_lab.attention`` and the PyTorch
reference (values, and the gradients of attention), relative to the size of the numbers compared. :func:`multihead_sum_identity` proves the sum over heads on
general symbols, for the sizes it is given (T, C, n_head), not for every size.

Convention, not derivation: a query row whose keys are all masked has weights ``0/0``; like PyTorch we define its
weights and output as 0 (:func:`_softmax_rows`).
"""

from __future__ import annotations

import numpy as np
import sympy as sp
import torch
import torch.nn.functional as F

__all__ = [
    "attention_function",
    "attention_gradient_function",
    "attention_steps",
    "block_map",
    "check",
    "embedding_lookup",
    "multihead_as_sum",
    "multihead_concat",
    "multihead_sum_identity",
    "rank_of_scores",
    "split_permutation",
    "symbolic_matrix",
]


def symbolic_matrix(name: str, rows: int, cols: int) -> sp.Matrix:
    """A rows × cols matrix of real symbols ``name_ij`` (1-based, as in a textbook)."""
    return sp.Matrix(rows, cols, lambda i, j: sp.Symbol(f"{name}_{i + 1}{j + 1}", real=True))


def attention_steps(T_q: int = 2, T_k: int = 3, d_k: int = 2, d_v: int = 2, mask: list | None = None) -> dict:
    """Attention on symbolic Q (T_q × d_k), K (T_k × d_k), V (T_k × d_v), one step at a time.

    Returns ``{"Q", "K", "V", "S", "E", "A", "O"}``: scores ``S = Q Kᵀ / √d_k``, their exponentials ``E`` (0 where
    ``mask[i][j]`` is False), weights ``A_ij = E_ij / Σ_j E_ij`` and output ``O = A V``, in the order of
    ``transformer_lab.attention.attention_formula``.
    """
    Q, K, V = symbolic_matrix("q", T_q, d_k), symbolic_matrix("k", T_k, d_k), symbolic_matrix("v", T_k, d_v)
    S = (Q * K.T) / sp.sqrt(d_k)
    E = _exp_masked(S, mask)
    A = _softmax_rows(S, mask)
    return {"Q": Q, "K": K, "V": V, "S": S, "E": E, "A": A, "O": A * V}


def _exp_masked(S: sp.Matrix, mask: list | None) -> sp.Matrix:
    """exp(S_ij) where mask[i][j] allows it, else 0 (the exp of a -inf score)."""
    return sp.Matrix(*S.shape, lambda i, j: sp.exp(S[i, j]) if mask is None or mask[i][j] else sp.Integer(0))


def _softmax_rows(S: sp.Matrix, mask: list | None) -> sp.Matrix:
    """Row-wise softmax of S with masked entries excluded.

    A row with nothing allowed would be 0/0; it is set to zeros by convention (PyTorch's), not derived.
    """
    E = _exp_masked(S, mask)
    sums = [sum(E.row(i)) for i in range(E.shape[0])]
    return sp.Matrix(*E.shape, lambda i, j: E[i, j] / sums[i] if sums[i] != 0 else sp.Integer(0))


def attention_function(T_q: int = 2, T_k: int = 3, d_k: int = 2, d_v: int = 2, mask: list | None = None):
    """``f(Q, K, V) -> (O, A)`` as NumPy arrays: the symbolic attention, lambdified."""
    st = attention_steps(T_q, T_k, d_k, d_v, mask)
    args = [list(st["Q"]), list(st["K"]), list(st["V"])]
    fo = sp.lambdify(args, st["O"], "numpy")
    fa = sp.lambdify(args, st["A"], "numpy")

    def f(Q, K, V):
        flat = [list(Q.reshape(-1)), list(K.reshape(-1)), list(V.reshape(-1))]
        return fo(*flat), fa(*flat)

    return f


def attention_gradient_function(T_q: int = 2, T_k: int = 3, d_k: int = 2, d_v: int = 2, mask: list | None = None):
    """``f(Q, K, V, G) -> (∂L/∂Q, ∂L/∂K, ∂L/∂V)`` for ``L = Σ G ⊙ O`` (G = ∂L/∂O, T_q × d_v), from SymPy's derivatives.

    SymPy differentiates L with respect to the scores s_ij and to V, and the scores S(Q, K) with respect to Q and
    K; the two Jacobians are multiplied numerically (the multivariable chain rule), which is much faster than
    differentiating the composed expression and gives the same numbers.
    """
    st = attention_steps(T_q, T_k, d_k, d_v, mask)
    Q, K, V, S = st["Q"], st["K"], st["V"], st["S"]
    G, s = symbolic_matrix("g", T_q, d_v), symbolic_matrix("s", T_q, T_k)
    O = _softmax_rows(s, mask) * V  # O as a function of free scores s
    L = sp.Matrix([sum(G[i, j] * O[i, j] for i in range(T_q) for j in range(d_v))])
    f_scores = sp.lambdify([list(Q), list(K)], S, "numpy")
    f_outer = sp.lambdify([list(s), list(V), list(G)], [L.jacobian(list(s)), L.jacobian(list(V))], "numpy", cse=True)
    f_inner = sp.lambdify([list(Q), list(K)], [sp.Matrix(list(S)).jacobian(list(Q)),
                                               sp.Matrix(list(S)).jacobian(list(K))], "numpy")

    def f(Qn, Kn, Vn, Gn):
        q, k = list(Qn.reshape(-1)), list(Kn.reshape(-1))
        scores = np.asarray(f_scores(q, k), dtype=np.float64).reshape(-1)
        dL_ds, dL_dV = (np.asarray(a, dtype=np.float64) for a in f_outer(list(scores), list(Vn.reshape(-1)),
                                                                          list(Gn.reshape(-1))))
        dS_dQ, dS_dK = (np.asarray(a, dtype=np.float64) for a in f_inner(q, k))
        return ((dL_ds @ dS_dQ).reshape(Qn.shape), (dL_ds @ dS_dK).reshape(Kn.shape), dL_dV.reshape(Vn.shape))

    return f


def split_permutation(T: int, C: int, n_head: int) -> sp.Matrix:
    """The (T·C) × (T·C) permutation P with ``vec(split_heads(X)) = P vec(X)`` for X (T, C), vec row-major.

    split_heads moves entry X[t, h·d_k + j] to position (h, t, j); merging is ``Pᵀ = P⁻¹``.
    """
    if C % n_head:
        raise ValueError(f"C % n_head must be 0, got C={C}, n_head={n_head}")
    d_k = C // n_head
    P = sp.zeros(T * C, T * C)
    for t in range(T):
        for h in range(n_head):
            for j in range(d_k):
                P[(h * T + t) * d_k + j, t * C + h * d_k + j] = 1
    return P


def block_map(W: sp.Matrix, n_head: int) -> list[sp.Matrix]:
    """The column blocks W[:, h·d_k:(h+1)·d_k] of a C × C projection: head h's own d_model × d_k map."""
    C = W.shape[1]
    d_k = C // n_head
    return [W[:, h * d_k:(h + 1) * d_k] for h in range(n_head)]


def multihead_as_sum(X: sp.Matrix, W_q: sp.Matrix, W_k: sp.Matrix, W_v: sp.Matrix, W_o: sp.Matrix,
                     n_head: int, mask: list | None = None) -> sp.Matrix:
    """``MHA(X) = Σ_h Attention(X W_Q^(h), X W_K^(h), X W_V^(h)) W_O^(h)``, with W_O^(h) the h-th row block.

    Matrices act on rows (``y = x W``); with PyTorch's ``Linear`` weights use ``W = weightᵀ``.
    """
    d_k = W_q.shape[1] // n_head
    out = sp.zeros(X.shape[0], W_o.shape[1])
    for h, (wq, wk, wv) in enumerate(zip(block_map(W_q, n_head), block_map(W_k, n_head), block_map(W_v, n_head),
                                         strict=True)):
        Q, K, V = X * wq, X * wk, X * wv
        A = _softmax_rows(Q * K.T / sp.sqrt(d_k), mask)
        out += A * V * W_o[h * d_k:(h + 1) * d_k, :]
    return out


def multihead_concat(X: sp.Matrix, W_q: sp.Matrix, W_k: sp.Matrix, W_v: sp.Matrix, W_o: sp.Matrix,
                     n_head: int, mask: list | None = None) -> sp.Matrix:
    """``MHA(X) = [head_1 … head_h] W_O``, the definition: the heads concatenated (``merge_heads``), then ``W_O``."""
    d_k = W_q.shape[1] // n_head
    heads = [_softmax_rows(X * wq * (X * wk).T / sp.sqrt(d_k), mask) * (X * wv)
             for wq, wk, wv in zip(block_map(W_q, n_head), block_map(W_k, n_head), block_map(W_v, n_head),
                                   strict=True)]
    return sp.Matrix.hstack(*heads) * W_o


def multihead_sum_identity(T: int = 2, C: int = 4, n_head: int = 2, mask: list | None = None) -> dict:
    """On general symbols X (T × C), W_Q, W_K, W_V, W_O (C × C): ``concat(heads) W_O - Σ_h head_h W_O^(h)``,
    expanded. Returns ``{"concat", "sum", "difference"}``; the difference is the zero matrix, which proves the
    identity for these sizes (T, C, n_head) only."""
    X = symbolic_matrix("x", T, C)
    W_q, W_k, W_v, W_o = (symbolic_matrix(n, C, C) for n in ("a", "b", "c", "w"))
    concat = multihead_concat(X, W_q, W_k, W_v, W_o, n_head, mask)
    total = multihead_as_sum(X, W_q, W_k, W_v, W_o, n_head, mask)
    return {"concat": concat, "sum": total, "difference": (concat - total).applyfunc(sp.expand)}


def rank_of_scores(T: int = 3, d_k: int = 2) -> dict:
    """``S = Q Kᵀ`` with Q, K of shape T × d_k: its determinant (T > d_k: identically 0), and the rank of one random
    integer instance (seed 0, entries in -5 … 5), to compare with the bound min(T, d_k)."""
    Q, K = symbolic_matrix("q", T, d_k), symbolic_matrix("k", T, d_k)
    S = Q * K.T
    det = sp.expand(S.det()) if T <= 4 else None
    gen = torch.Generator().manual_seed(0)
    Qn = sp.Matrix(torch.randint(-5, 6, (T, d_k), generator=gen).tolist())
    Kn = sp.Matrix(torch.randint(-5, 6, (T, d_k), generator=gen).tolist())
    return {"S": S, "det": det, "rank_random_integer": (Qn * Kn.T).rank(), "bound": min(T, d_k)}


def embedding_lookup(V: int = 4, C: int = 3, index: int = 2) -> dict:
    """``one_hot(index) E`` for a symbolic E (V × C): the product is exactly row ``index`` of E."""
    E = symbolic_matrix("E", V, C)  # entries E_ij, counted from 1
    one_hot = sp.Matrix(1, V, lambda _, j: 1 if j == index else 0)
    return {"E": E, "one_hot": one_hot, "product": one_hot * E, "row": E.row(index)}


def _relative(a, b) -> float:
    """``max |a - b| / max(1, max |b|)``: the largest difference, relative to the size of ``b`` (below 1, absolute)."""
    a, b = torch.as_tensor(a), torch.as_tensor(b)
    return float((a - b).abs().max()) / max(1.0, float(b.abs().max()))


def check(seed: int = 0) -> dict[str, float]:
    """Largest difference between SymPy (lambdified), ``transformer_lab`` and PyTorch on random float64 data, each
    relative to the size of the numbers compared: ``max |a - b| / max(1, max |b|)``, so that one bound in units of
    float64's epsilon holds whatever the scale of the instance."""
    from transformer_lab.attention import Embedding, MultiHeadAttention, scaled_dot_product_attention, split_heads
    from transformer_lab.reference import multihead_reference

    gen = torch.Generator().manual_seed(seed)

    def rnd(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    out: dict[str, float] = {}
    T_q, T_k, d_k, d_v = 3, 4, 2, 3
    mask = [[True, False, True, True], [False, False, False, False], [True, True, True, False]]
    for name, m in (("", None), ("_masked", mask)):
        Q, K, V = rnd(T_q, d_k), rnd(T_k, d_k), rnd(T_k, d_v)
        sym_o, sym_a = attention_function(T_q, T_k, d_k, d_v, m)(Q.numpy(), K.numpy(), V.numpy())
        mt = None if m is None else torch.tensor(m)
        ours_o, ours_a = scaled_dot_product_attention(query=Q, key=K, value=V, mask=mt)
        ref_o = F.scaled_dot_product_attention(Q, K, V, attn_mask=mt)
        out[f"attention{name}: sympy vs ours"] = _relative(sym_o, ours_o)
        out[f"attention{name}: ours vs torch"] = _relative(ours_o, ref_o)
        out[f"weights{name}: sympy vs ours"] = _relative(sym_a, ours_a)
    # gradients of L = Σ G ⊙ O: SymPy's derivatives against autograd through our implementation
    for name, m in (("", None), ("_masked", [[True, False, True], [False, False, False]])):
        Q, K, V, G = rnd(2, 2), rnd(3, 2), rnd(3, 2), rnd(2, 2)
        sym_g = attention_gradient_function(2, 3, 2, 2, m)(Q.numpy(), K.numpy(), V.numpy(), G.numpy())
        inputs = [t.clone().requires_grad_() for t in (Q, K, V)]
        o = scaled_dot_product_attention(query=inputs[0], key=inputs[1], value=inputs[2],
                                         mask=None if m is None else torch.tensor(m))[0]
        ours_g = torch.autograd.grad((o * G).sum(), inputs)
        out[f"gradients{name} (Q, K, V): sympy vs ours"] = max(_relative(a, b) for a, b in zip(sym_g, ours_g, strict=True))

    T, C, h = 3, 4, 2
    X = rnd(1, T, C)
    P = torch.tensor(split_permutation(T, C, h).tolist(), dtype=torch.float64)
    out["split_heads: permutation vs ours"] = _relative(P @ X.reshape(-1), split_heads(X, h).reshape(-1))

    torch.manual_seed(seed)
    ours = MultiHeadAttention(C, h).double()
    with torch.no_grad():
        for p in (ours.in_proj.bias, ours.out_proj.bias):
            p.copy_(rnd(*p.shape))
    ref = multihead_reference(ours)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    y_ours = ours(query=X, key=X, value=X, mask=causal).detach()
    y_ref = ref(X, X, X, attn_mask=~causal, need_weights=False)[0].detach()
    Wq, Wk, Wv = (sp.Matrix(w.T.tolist()) for w in ours.in_proj.weight.detach().chunk(3))
    bq, bk, bv = (b.tolist() for b in ours.in_proj.bias.detach().chunk(3))
    Xs = sp.Matrix(X[0].tolist())
    # biases: append a column of ones to X and the bias as an extra row of each W
    Xb = Xs.row_join(sp.ones(T, 1))
    Wqb, Wkb, Wvb = (W.col_join(sp.Matrix([b])) for W, b in ((Wq, bq), (Wk, bk), (Wv, bv)))
    Wo = sp.Matrix(ours.out_proj.weight.detach().T.tolist())
    y_sym = multihead_as_sum(Xb, Wqb, Wkb, Wvb, Wo, h, mask=causal.tolist())
    y_sym = torch.tensor(sp.N(y_sym).tolist(), dtype=torch.float64) + ours.out_proj.bias.detach()
    out["multi-head: sum over heads (sympy) vs ours"] = _relative(y_sym, y_ours[0])
    out["multi-head: ours vs nn.MultiheadAttention"] = _relative(y_ours, y_ref)

    emb = Embedding(5, 3).double().requires_grad_(False)
    idx = torch.tensor([[0, 4, 2]])
    one_hot = F.one_hot(idx, 5).double()
    out["embedding: one-hot @ E vs ours"] = _relative(one_hot @ emb.weight, emb(idx))
    out["embedding: ours vs F.embedding"] = _relative(emb(idx), F.embedding(idx, emb.weight))
    return out
