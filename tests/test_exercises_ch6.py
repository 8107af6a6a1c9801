"""Chapter 6 exercise checkers: each accepts the solution and correct answers written in other styles, and
rejects the typical wrong answers (CATALOGUE) with a message naming the fault."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import sympy as sp
import torch
from conftest import assert_accepted, assert_rejected, right_answers, wrong_answers

from transformer_lab import positional as P
from transformer_lab.exercises import ch6, registry


# ---------------------------------------------------------------- solutions (as in the chapter)
def sinusoidal(n_pos, d_model):
    pos = torch.arange(n_pos, dtype=torch.float64)[:, None]
    omega = 10000.0 ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    pe = torch.zeros(n_pos, d_model, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(pos * omega)
    pe[:, 1::2] = torch.cos(pos * omega)
    return pe


def rotation_for_offset(k, d_model):
    omega = 10000.0 ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    R = torch.zeros(d_model, d_model, dtype=torch.float64)
    for i, w in enumerate(omega.tolist()):
        c, s = torch.cos(torch.tensor(k * w)), torch.sin(torch.tensor(k * w))
        R[2 * i:2 * i + 2, 2 * i:2 * i + 2] = torch.tensor([[c, s], [-s, c]])
    return R


def rope(x, sign=1.0, start=0):
    T, d = x.shape
    omega = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    angle = sign * (torch.arange(T, dtype=torch.float64)[:, None] + start) * omega
    x1, x2 = x[:, 0::2], x[:, 1::2]
    out = torch.empty_like(x)
    out[:, 0::2] = x1 * torch.cos(angle) - x2 * torch.sin(angle)
    out[:, 1::2] = x1 * torch.sin(angle) + x2 * torch.cos(angle)
    return out


def kv_causal_mask(T, T_k):
    return torch.ones(T, T_k, dtype=torch.bool).tril(diagonal=T_k - T)


def kv_pair_count(T, T_k):
    return T * (T_k - T) + T * (T + 1) // 2


def alibi(T, n_head, first_h=1, slopes_for=None):
    H = n_head if slopes_for is None else slopes_for
    m = 2.0 ** (-8 * torch.arange(first_h, first_h + n_head, dtype=torch.float64) / H)  # m_h = 2^{-8h/H}
    dist = torch.arange(T)[None, :] - torch.arange(T)[:, None]  # (T, T): j - i
    return m[:, None, None] * dist


def head_splits(d_model, n_head):
    d_k = d_model // n_head
    return math.factorial(d_model) // (math.factorial(d_k) ** n_head * math.factorial(n_head))


def is_equivariant(layer, x):
    out = layer(x)
    return all(torch.allclose(layer(x[list(perm)]), out[list(perm)], rtol=1e-4, atol=1e-6)
               for perm in itertools.permutations(range(x.shape[0])))


def score_drift(kind, q, k, T_train, T_test, opposite=False, cross_terms=True):
    d = q.shape[-1]
    pos = torch.arange(T_test, dtype=torch.float64)
    if kind == "sinusoidal":
        pe = P.sinusoidal_encoding(T_test, d, dtype=torch.float64)
        S = (q + pe) @ (k + pe).T if cross_terms else pe @ pe.T
    elif kind == "rope":
        S = P.apply_rope(q.expand(T_test, d)) @ P.apply_rope(k.expand(T_test, d), -pos if opposite else None).T
    else:
        S = q @ k + 0.5 * (pos[None, :] - pos[:, None])
    return max((S.diagonal(-delta) - S[delta, 0]).abs().max().item() for delta in range(T_train))


def rope_score(q1, q2, k1, k2, delta, theta):
    m = sp.Symbol("m", real=True)

    def rot(a):
        return sp.Matrix([[sp.cos(a), -sp.sin(a)], [sp.sin(a), sp.cos(a)]])

    score = ((rot(m * theta) * sp.Matrix([q1, q2])).T * (rot((m + delta) * theta) * sp.Matrix([k1, k2])))[0]
    return sp.simplify(sp.expand_trig(score))


def layer_comparison(n, d):
    return {"attention": (4 * n * d * d + 2 * n * n * d, 1, 1), "recurrent": (2 * n * d * d, n, n)}


def untrained_rows(table, T_train, n_steps, lr, weight_decay):
    return table[T_train:] * (1 - lr * weight_decay) ** n_steps


# ---------------------------------------------------------------- typical wrong answers
def _sin_cos_first(n_pos, d_model):
    return sinusoidal(n_pos, d_model)[:, [i ^ 1 for i in range(d_model)]]


def _sin_exponent_i_over_d(n_pos, d_model):  # ω_i = 10000^{-i/d} instead of 10000^{-2i/d}
    pos = torch.arange(n_pos, dtype=torch.float64)[:, None]
    omega = 10000.0 ** (-torch.arange(d_model // 2, dtype=torch.float64) / d_model)
    return torch.stack((torch.sin(pos * omega), torch.cos(pos * omega)), -1).flatten(1)


def _sin_blocks(n_pos, d_model):  # sin half then cos half: a different layout
    pe = sinusoidal(n_pos, d_model)
    return torch.cat((pe[:, 0::2], pe[:, 1::2]), dim=1)


def _sin_positions_from_1(n_pos, d_model):
    return sinusoidal(n_pos + 1, d_model)[1:]


def _sin_one_column_short(n_pos, d_model):
    return sinusoidal(n_pos, d_model)[:, :-1]


def _rot_transposed(k, d_model):
    return rotation_for_offset(k, d_model).T


def _rot_one_frequency(k, d_model):  # every block rotates by k·ω_0 = k
    return torch.kron(torch.eye(d_model // 2, dtype=torch.float64), rotation_for_offset(k, 2))


def _rot_exponent_i_over_d(k, d_model):
    R = torch.zeros(d_model, d_model, dtype=torch.float64)
    for i in range(d_model // 2):
        a = k * 10000.0 ** (-i / d_model)
        R[2 * i:2 * i + 2, 2 * i:2 * i + 2] = torch.tensor([[math.cos(a), math.sin(a)], [-math.sin(a), math.cos(a)]])
    return R


def _rot_pe_ratio(k, d_model):  # "PE(pos + k) / PE(pos)" made diagonal: not a linear map that works for every pos
    pe = sinusoidal(k + 2, d_model)
    return torch.diag(pe[k + 1] / pe[1])


def _rope_clockwise(x):
    return rope(x, sign=-1.0)


def _rope_from_1(x):
    return rope(x, start=1)


def _rope_half_split(x):  # GPT-NeoX layout: pairs (i, i + d/2) instead of (2i, 2i+1); with d = 2 both agree
    d = x.shape[-1]
    perm = torch.cat((torch.arange(0, d, 2), torch.arange(1, d, 2)))
    out = torch.empty_like(x)
    out[:, perm] = rope(x[:, perm])
    return out


def _rope_one_frequency(x):  # every pair rotated by m (ω_i = 1 for all i); with d = 2 it is right
    T, d = x.shape
    angle = torch.arange(T, dtype=torch.float64)[:, None].expand(T, d // 2)
    x1, x2 = x[:, 0::2], x[:, 1::2]
    return torch.stack((x1 * angle.cos() - x2 * angle.sin(), x1 * angle.sin() + x2 * angle.cos()), -1).flatten(1)


def _mask_no_offset(T, T_k):
    return torch.ones(T, T_k, dtype=torch.bool).tril()


def _mask_float(T, T_k):
    return kv_causal_mask(T, T_k).float()


def _mask_square(T, T_k):
    return torch.ones(T_k, T_k, dtype=torch.bool).tril()


def _mask_strict(T, T_k):  # forgets that a query sees itself
    return torch.ones(T, T_k, dtype=torch.bool).tril(diagonal=T_k - T - 1)


def _mask_future(T, T_k):  # True where masked: the complement
    return ~kv_causal_mask(T, T_k)


def _mask_numpy_float(T, T_k):  # a NumPy mask is fine, but it must be bool
    return np.tri(T, T_k, T_k - T)


def _count_all_pairs(T, T_k):
    return T * T_k


def _count_no_cache(T, T_k):
    return T * (T + 1) // 2


def _count_strict(T, T_k):
    return T * (T_k - T) + T * (T - 1) // 2


def _count_all_queries(T, T_k):
    return T_k * (T_k + 1) // 2


def _count_float(T, T_k):
    return T * (T_k - T) + T * (T + 1) / 2


def _count_tensor(T, T_k):  # the mask's sum is a 0-d tensor, not an int
    return kv_causal_mask(T, T_k).sum()


def _alibi_abs(T, n_head):  # -m·|j - i|: right below the diagonal, wrong above it
    return -alibi(T, n_head).abs()


def _alibi_causal(T, n_head):  # the causal mask applied inside: -inf above the diagonal
    return alibi(T, n_head).masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))


def _alibi_last_dim_heads(T, n_head):
    return alibi(T, n_head).permute(1, 2, 0)


def _eq_invariance(layer, x):  # compares with layer(x) itself: invariance, which attention does not have
    perm = [*range(1, x.shape[0]), 0]
    return torch.allclose(layer(x[perm]), layer(x))


def _eq_exact(layer, x):  # no tolerance: the sums over keys round differently in another order
    out = layer(x)
    return all(torch.equal(layer(x[list(p)]), out[list(p)]) for p in itertools.permutations(range(x.shape[0])))


def _eq_one_swap(layer, x):  # one fixed swap of the first two tokens: blind to what happens to the last one
    perm = [1, 0, *range(2, x.shape[0])]
    return torch.allclose(layer(x[perm]), layer(x)[perm])


def _eq_swap_last_two(layer, x):  # one fixed swap of the last two tokens: blind to a marker on the first one
    perm = [*range(x.shape[0] - 2), x.shape[0] - 1, x.shape[0] - 2]
    return torch.allclose(layer(x[perm]), layer(x)[perm])


def _eq_roll(layer, x):  # one cyclic shift (and its powers): blind to a layer that wraps around
    return all(torch.allclose(layer(x.roll(k, 0)), layer(x).roll(k, 0)) for k in range(1, x.shape[0]))


def _eq_flip(layer, x):  # the reversed order only: blind to a pattern that reads the same backwards
    return torch.allclose(layer(x.flip(0)), layer(x).flip(0))


def _eq_swap_ends(layer, x):  # the first and the last token swapped
    perm = [x.shape[0] - 1, *range(1, x.shape[0] - 1), 0]
    return torch.allclose(layer(x[perm]), layer(x)[perm])


def _eq_one_cycle(layer, x):  # one 3-cycle of the first two tokens and the last
    perm = [1, x.shape[0] - 1, *range(2, x.shape[0] - 1), 0]
    return torch.allclose(layer(x[perm]), layer(x)[perm])


def _eq_one_seeded_random(layer, x):  # "a random permutation", but the same one every time
    perm = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(1))
    return torch.allclose(layer(x[perm]), layer(x)[perm])


def _eq_generators(layer, x):  # a swap and a cyclic shift generate every permutation: testing both suffices
    perms = [[1, 0, *range(2, x.shape[0])], [*range(1, x.shape[0]), 0]]
    out = layer(x)
    return all(torch.allclose(layer(x[p]), out[p], rtol=1e-4, atol=1e-6) for p in perms)


def _eq_float64_tolerance(layer, x):  # a float64-sized tolerance, too strict for float32 rounding
    out = layer(x)
    return all(torch.allclose(layer(x[list(p)]), out[list(p)], rtol=0, atol=1e-12)
               for p in itertools.permutations(range(x.shape[0])))


def _eq_inverse_order(layer, x):  # reorders the output by the inverse permutation
    perm = torch.tensor([*range(1, x.shape[0]), 0])
    return torch.allclose(layer(x[perm]), layer(x)[perm.argsort()])


def _eq_tensor(layer, x):  # a 0-d float tensor, not a bool
    return torch.tensor(float(is_equivariant(layer, x)))


def _drift_pe_only(kind, q, k, T_train, T_test):
    return score_drift(kind, q, k, T_train, T_test, cross_terms=False)


def _drift_every_offset(kind, q, k, T_train, T_test):
    return score_drift(kind, q, k, T_test, T_test)


def _drift_inside_training(kind, q, k, T_train, T_test):
    return score_drift(kind, q, k, T_train, T_train)


def _drift_rope_opposite(kind, q, k, T_train, T_test):
    return score_drift(kind, q, k, T_train, T_test, opposite=True)


def _drift_against_last(kind, q, k, T_train, T_test):  # compares with the pair ending at T_train - 1
    d = q.shape[-1]
    pe = P.sinusoidal_encoding(T_test, d, dtype=torch.float64)
    S = (q + pe) @ (k + pe).T if kind == "sinusoidal" else None
    if S is None:
        return score_drift(kind, q, k, T_train, T_test)
    return max((S.diagonal(-dl) - S.diagonal(-dl)[T_train - 1 - dl]).abs().max().item() for dl in range(T_train))


def _drift_tensor(kind, q, k, T_train, T_test):  # a 1-element tensor is accepted; a (T_train,) one is not
    return torch.tensor([score_drift(kind, q, k, dl + 1, T_test) for dl in range(T_train)])


def _rs_m_minus_n(q1, q2, k1, k2, delta, theta):  # δ = m - n: the sine term's sign flips
    return ch6._ref_rope_score(q1, q2, k1, k2, -delta, theta)


def _rs_cos_only(q1, q2, k1, k2, delta, theta):
    return sp.cos(delta * theta) * (q1 * k1 + q2 * k2)


def _rs_no_theta(q1, q2, k1, k2, delta, theta):
    return ch6._ref_rope_score(q1, q2, k1, k2, delta, 1)


def _rs_same_position(q1, q2, k1, k2, delta, theta):  # both rotated by mθ: the rotation cancels
    return ch6._ref_rope_score(q1, q2, k1, k2, 0, theta)


def _rs_positions_left(q1, q2, k1, k2, delta, theta):  # the score in m and n, never rewritten in δ
    m, n = sp.symbols("m n", real=True)
    rot = lambda a: sp.Matrix([[sp.cos(a), -sp.sin(a)], [sp.sin(a), sp.cos(a)]])  # noqa: E731
    return ((rot(m * theta) * sp.Matrix([q1, q2])).T * (rot(n * theta) * sp.Matrix([k1, k2])))[0]


def _rs_numeric(q1, q2, k1, k2, delta, theta):  # a float from torch, not an expression
    return float(P.apply_rope(torch.ones(2, 2))[1, 0])


def _layers_no_projections(n, d):
    return {"attention": (2 * n * n * d, 1, 1), "recurrent": (2 * n * d * d, n, n)}


def _layers_flops(n, d):
    return {"attention": (8 * n * d * d + 4 * n * n * d, 1, 1), "recurrent": (4 * n * d * d, n, n)}


def _layers_path_off_by_one(n, d):
    return {"attention": (4 * n * d * d + 2 * n * n * d, 1, 1), "recurrent": (2 * n * d * d, n, n - 1)}


def _layers_one_rnn_product(n, d):
    return {"attention": (4 * n * d * d + 2 * n * n * d, 1, 1), "recurrent": (n * d * d, n, n)}


def _layers_sequential_attention(n, d):  # generation, token by token, is not one layer's forward pass
    return {"attention": (4 * n * d * d + 2 * n * n * d, n, 1), "recurrent": (2 * n * d * d, n, n)}


def _layers_scores_only(n, d):
    return {"attention": (4 * n * d * d + n * n * d, 1, 1), "recurrent": (2 * n * d * d, n, n)}


def _layers_floats(n, d):
    return {"attention": (4.0 * n * d * d + 2 * n * n * d, 1, 1), "recurrent": (2 * n * d * d, n, n)}


def _layers_list(n, d):
    return [(4 * n * d * d + 2 * n * n * d, 1, 1), (2 * n * d * d, n, n)]


def _rows_unchanged(table, T_train, n_steps, lr, weight_decay):  # plain Adam's answer: no decay
    return table[T_train:]


def _rows_no_lr(table, T_train, n_steps, lr, weight_decay):
    return table[T_train:] * (1 - weight_decay) ** n_steps


def _rows_linear(table, T_train, n_steps, lr, weight_decay):
    return table[T_train:] * (1 - n_steps * lr * weight_decay)


def _rows_one_step_short(table, T_train, n_steps, lr, weight_decay):
    return table[T_train:] * (1 - lr * weight_decay) ** (n_steps - 1)


def _rows_from_last_trained(table, T_train, n_steps, lr, weight_decay):  # off by one: row T_train - 1 is trained
    return table[T_train - 1:] * (1 - lr * weight_decay) ** n_steps


def _rows_after_first_untrained(table, T_train, n_steps, lr, weight_decay):  # off by one the other way
    return table[T_train + 1:] * (1 - lr * weight_decay) ** n_steps


def _rows_trained_ones(table, T_train, n_steps, lr, weight_decay):
    return table[:T_train] * (1 - lr * weight_decay) ** n_steps


def _rows_to_zero(table, T_train, n_steps, lr, weight_decay):  # "weight decay removes them"
    return torch.zeros_like(table[T_train:])


# ---------------------------------------------------------------- correct alternatives, other styles
def _sin_numpy(n_pos, d_model):
    pe = np.zeros((n_pos, d_model))
    for p in range(n_pos):
        for i in range(d_model // 2):
            pe[p, 2 * i] = math.sin(p / 10000 ** (2 * i / d_model))
            pe[p, 2 * i + 1] = math.cos(p / 10000 ** (2 * i / d_model))
    return torch.from_numpy(pe)


def _sin_div_term(n_pos, d_model):  # the Annotated Transformer's exp(-ln(10000)·2i/d)
    div = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float64) * (-math.log(10000.0) / d_model))
    angle = torch.arange(n_pos, dtype=torch.float64)[:, None] * div
    return torch.stack((angle.sin(), angle.cos()), dim=-1).reshape(n_pos, d_model)


def _rot_block_diag(k, d_model):
    blocks = []
    for i in range(d_model // 2):
        a = k / 10000 ** (2 * i / d_model)
        blocks.append(torch.tensor([[math.cos(a), math.sin(a)], [-math.sin(a), math.cos(a)]], dtype=torch.float64))
    return torch.block_diag(*blocks)


def _rot_solved(k, d_model):  # each block solved from the map itself: [PE(k), PE(k+1)] = R [PE(0), PE(1)]
    pe = sinusoidal(abs(k) + 2, d_model)  # positions 0 … |k| + 1
    R = torch.zeros(d_model, d_model, dtype=torch.float64)
    for i in range(d_model // 2):
        s = slice(2 * i, 2 * i + 2)
        X = pe[0:2, s].T  # columns PE_pair(0), PE_pair(1)
        Y = pe[abs(k):abs(k) + 2, s].T  # columns PE_pair(|k|), PE_pair(|k| + 1)
        R_abs = Y @ torch.linalg.inv(X)
        R[s, s] = R_abs if k >= 0 else R_abs.T  # R(-k) = R(k)ᵀ
    return R


def _rope_complex(x):
    T, d = x.shape
    omega = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    z = torch.view_as_complex(x.reshape(T, d // 2, 2).contiguous())
    return torch.view_as_real(z * torch.exp(1j * torch.arange(T, dtype=torch.float64)[:, None] * omega)).reshape(T, d)


def _rope_matrices(x):
    T, d = x.shape
    out = torch.empty_like(x)
    for m in range(T):
        for i in range(d // 2):
            a = m * 10000 ** (-2 * i / d)
            rot = torch.tensor([[math.cos(a), -math.sin(a)], [math.sin(a), math.cos(a)]], dtype=x.dtype)
            out[m, 2 * i:2 * i + 2] = rot @ x[m, 2 * i:2 * i + 2]
    return out


def _rope_float32_llama(x):  # LLaMA / Hugging Face: inv_freq and the angles in float32, torch.polar
    T, d = x.shape
    inv_freq = 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d))
    cis = torch.polar(torch.ones(T, d // 2), torch.outer(torch.arange(T).float(), inv_freq))
    z = torch.view_as_complex(x.float().reshape(T, d // 2, 2).contiguous()) * cis
    return torch.view_as_real(z).reshape(T, d).to(x.dtype)


def _rot_float32_angles(k, d_model):
    inv_freq = 1.0 / (10000 ** (torch.arange(0, d_model, 2).float() / d_model))
    c, s = torch.cos(k * inv_freq).double(), torch.sin(k * inv_freq).double()
    blocks = [torch.stack((torch.stack((ci, si)), torch.stack((-si, ci)))) for ci, si in zip(c, s, strict=True)]
    return torch.block_diag(*blocks)


def _mask_loops(T, T_k):
    return torch.tensor([[j <= T_k - T + i for j in range(T_k)] for i in range(T)], dtype=torch.bool)


def _mask_numpy(T, T_k):
    return torch.from_numpy(np.tri(T, T_k, T_k - T, dtype=bool))


def _mask_numpy_bool(T, T_k):
    return np.tri(T, T_k, T_k - T, dtype=bool)


def _count_loop(T, T_k):
    return sum(min(T_k, T_k - T + i + 1) for i in range(T))


def _count_from_mask(T, T_k):
    return int(np.tri(T, T_k, T_k - T, dtype=bool).sum())


def _alibi_loops(T, n_head):
    out = torch.zeros(n_head, T, T, dtype=torch.float64)
    for h in range(1, n_head + 1):
        for i in range(T):
            for j in range(T):
                out[h - 1, i, j] = 2 ** (-8 * h / n_head) * (j - i)
    return out


def _alibi_numpy(T, n_head):
    slopes = np.geomspace(2 ** (-8 / n_head), 2.0 ** -8, n_head)
    return torch.from_numpy(slopes[:, None, None] * np.subtract.outer(np.arange(T), np.arange(T)).T)


def _splits_binomials(d_model, n_head):  # head 1 chooses, then head 2 from the rest, …; then forget the order
    d_k = d_model // n_head
    return math.prod(math.comb(d_model - j * d_k, d_k) for j in range(n_head)) // math.factorial(n_head)


def _splits_recursive(d_model, n_head):  # the head holding the first coordinate picks its d_k - 1 companions
    if n_head == 1:
        return 1
    d_k = d_model // n_head
    return math.comb(d_model - 1, d_k - 1) * _splits_recursive(d_model - d_k, n_head - 1)


def _splits_labelled(d_model, n_head):
    return math.factorial(d_model) // math.factorial(d_model // n_head) ** n_head


def _splits_one_head(d_model, n_head):
    return math.comb(d_model, d_model // n_head)


def _splits_one_factorial(d_model, n_head):
    return math.factorial(d_model) // (math.factorial(d_model // n_head) * math.factorial(n_head))


def _splits_only_h(d_model, n_head):
    return math.factorial(d_model) // math.factorial(n_head)


def _rs_matrix_form(q1, q2, k1, k2, delta, theta):  # qᵀ Rot(δθ) k, as the RoPE section wrote it
    a = delta * theta
    return (sp.Matrix([[q1, q2]]) * sp.Matrix([[sp.cos(a), -sp.sin(a)], [sp.sin(a), sp.cos(a)]])
            * sp.Matrix([k1, k2]))[0]


def _rs_complex(q1, q2, k1, k2, delta, theta):  # Re(conj(q) k e^{iδθ}) with q, k as complex numbers
    return sp.re(sp.expand(sp.conjugate(q1 + sp.I * q2) * (k1 + sp.I * k2) * sp.exp(sp.I * delta * theta),
                           complex=True))


def _eq_permutation_matrices(layer, x):  # Π X against Π layer(X), every permutation matrix
    T = x.shape[0]
    out = layer(x)
    for perm in itertools.permutations(range(T)):
        Pi = torch.eye(T, dtype=x.dtype)[list(perm)]
        if not torch.allclose(layer(Pi @ x), Pi @ out, rtol=1e-5, atol=1e-6):
            return False
    return True


def _eq_random_perms(layer, x):  # 30 seeded random permutations, largest difference against a relative tolerance
    g = torch.Generator().manual_seed(0)
    out = layer(x)
    worst = max((layer(x[p]) - out[p]).abs().max().item()
                for p in (torch.randperm(x.shape[0], generator=g) for _ in range(30)))
    return bool(worst <= 1e-5 * out.abs().max().item())


def _drift_loops(kind, q, k, T_train, T_test):  # pair by pair, with the package's ALiBi bias
    d = q.shape[-1]
    if kind == "alibi":
        bias = P.alibi_bias(T_test, n_head=8, dtype=torch.float64)[0]
        S = q @ k + bias
    elif kind == "sinusoidal":
        pe = P.sinusoidal_encoding(T_test, d, dtype=torch.float64)
        S = torch.stack([torch.stack([(q + pe[m]) @ (k + pe[n]) for n in range(T_test)]) for m in range(T_test)])
    else:
        rq, rk = P.apply_rope(q.expand(T_test, d)), P.apply_rope(k.expand(T_test, d))
        S = rq @ rk.T
    return max(abs(S[m, m - dl] - S[dl, 0]).item() for dl in range(T_train) for m in range(dl, T_test))


def _drift_float32_tensor(kind, q, k, T_train, T_test):  # float32 arithmetic, a 0-d tensor
    return torch.tensor(score_drift(kind, q.float().double(), k.float().double(), T_train, T_test),
                        dtype=torch.float32)


def _layers_step_by_step(n, d):
    projections = 4 * (n * d * d)
    scores = n * n * d
    weighted_sum = n * n * d
    return {"recurrent": [n * (d * d + d * d), n, n], "attention": [projections + scores + weighted_sum, 1, 1]}


def _rows_loop(table, T_train, n_steps, lr, weight_decay):  # step by step, as the optimizer does it
    rows = table[T_train:].clone()
    for _ in range(n_steps):
        rows = rows - lr * weight_decay * rows
    return rows


def _rows_torch_adamw(table, T_train, n_steps, lr, weight_decay):  # run AdamW with the zero gradient
    rows = torch.nn.Parameter(table[T_train:].clone())
    opt = torch.optim.AdamW([rows], lr=lr, weight_decay=weight_decay)
    for _ in range(n_steps):
        opt.zero_grad()
        rows.grad = torch.zeros_like(rows)  # a zero gradient, not None: None would skip the parameter
        opt.step()
    return rows.detach()


def _rows_numpy_log(table, T_train, n_steps, lr, weight_decay):
    return np.asarray(table)[T_train:] * math.exp(n_steps * math.log1p(-lr * weight_decay))


def _layers_numpy_ints(n, d):
    return {"attention": (np.int64(4 * n * d * d + 2 * n * n * d), 1, 1), "recurrent": (np.int64(2 * n * d * d), n, n)}



def _sin_columns(n_pos, d_model, exponent):  # column j is sin (even j) or cos (odd j) of pos / 10000^exponent(j)
    j = torch.arange(d_model)
    angle = torch.arange(n_pos, dtype=torch.float64)[:, None] / 10000.0 ** exponent(j).double()
    return torch.where(j % 2 == 0, angle.sin(), angle.cos())


def _rope_freq(x, exponent):  # interleaved RoPE with pair i's frequency 10000^(-exponent(i, d))
    T, d = x.shape
    omega = 10000.0 ** (-exponent(torch.arange(d // 2, dtype=torch.float64), d))
    angle = torch.arange(T, dtype=torch.float64)[:, None] * omega
    x1, x2 = x[:, 0::2], x[:, 1::2]
    return torch.stack((x1 * angle.cos() - x2 * angle.sin(), x1 * angle.sin() + x2 * angle.cos()), -1).flatten(1)


def _rope_neox(x):  # the rotate_half layout: pair i is (x_i, x_{i + d/2})
    T, d = x.shape
    angle = torch.arange(T, dtype=torch.float64)[:, None] * 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    cos, sin = torch.cat((angle.cos(), angle.cos()), 1), torch.cat((angle.sin(), angle.sin()), 1)
    return x * cos + torch.cat((-x[:, d // 2:], x[:, : d // 2]), 1) * sin


def _alibi_slopes(T, slope, n_head):  # m_h = slope(h, H) for h = 1 … H, times j - i
    h = torch.arange(1, n_head + 1, dtype=torch.float64)
    return slope(h, n_head)[:, None, None] * (torch.arange(T)[None, :] - torch.arange(T)[:, None])

CATALOGUE = {
    "sinusoidal": {
        "wrong": [(_sin_cos_first, ["differs", "worst at", "sin and cos are swapped"]),
                  (_sin_exponent_i_over_d, ["differs", "worst at", "not 10000^(-i/d)"]),
                  (_sin_blocks, ["differs", "worst at", "interleave"]),
                  (_sin_positions_from_1, ["differs", "case 1", "positions start at 0"]),
                  (_sin_one_column_short, ["shape"]),
                  (lambda n_pos, d_model: _sin_columns(n_pos, d_model, lambda j: j / d_model),
                   ["case 1", "share one frequency", "not its own index"]),  # pos / 10000^(j/d), j the column
                  (lambda n_pos, d_model: _sin_columns(n_pos, d_model, lambda j: 2 * j / d_model),
                   ["case 1", "i counts pairs, not columns"]),  # pos / 10000^(2j/d), j the column
                  (lambda n_pos, d_model: _sin_columns(n_pos, d_model, lambda j: -2 * (j // 2) / d_model),
                   ["case 2", "do not multiply"])],  # pos · 10000^(2i/d)
        "right": [_sin_numpy, _sin_div_term],
    },
    "rotation_for_offset": {
        "wrong": [(_rot_transposed, ["differs", "that is the transpose", "(sin, cos)"]),
                  (_rot_one_frequency, ["case 2"]),  # d = 2 has only ω_0 = 1
                  (_rot_exponent_i_over_d, ["case 2", "differs"]), (_rot_pe_ratio, ["differs"])],
        "right": [_rot_block_diag, _rot_solved, _rot_float32_angles],
    },
    "rope": {
        "wrong": [(_rope_clockwise, ["differs", "turns the wrong way"]),
                  (_rope_from_1, ["differs", "case 1", "positions start at 0"]),
                  (_rope_half_split, ["case 2"]), (_rope_one_frequency, ["case 2", "differs", "its own frequency"]),
                  (_rope_neox, ["case 2", "not the two halves", "rotate_half"]),
                  (lambda x: _rope_freq(x, lambda i, d: i / d), ["case 2", "not 10000^(-i/d)"]),
                  (lambda x: _rope_freq(x, lambda i, d: 4 * i / d), ["case 2", "i counts pairs", "10000^(-4i/d)"]),
                  (lambda x: _rope_freq(x, lambda i, d: 2 * (i + 1) / d), ["case 1", "pairs count from i = 0"])],
        "right": [_rope_complex, _rope_matrices, _rope_float32_llama],
    },
    "kv_causal_mask": {
        "wrong": [(_mask_no_offset, ["case 2", "entries"]), (_mask_float, ["bool"]), (_mask_square, ["shape"]),
                  (_mask_strict, ["case 1", "entries"]), (_mask_future, ["entries"]),
                  (_mask_numpy_float, ["dtype bool", "float64"])],
        "right": [_mask_loops, _mask_numpy, _mask_numpy_bool],
    },
    "kv_pair_count": {
        "wrong": [(_count_all_pairs, ["the count is 9, expected 6", "every (query, key) pair"]),
                  (_count_no_cache, ["expected 9", "without a cache"]),
                  (_count_strict, ["the count is 0, expected 1", "its own key"]),
                  (_count_all_queries, ["only the last T are new"]),
                  (_count_float, ["must be an int"]), (_count_tensor, ["must be an int", "Tensor"])],
        "right": [_count_loop, _count_from_mask],
    },
    "alibi": {
        "wrong": [(lambda T, n_head: -alibi(T, n_head), ["sign is flipped"]),
                  (lambda T, n_head: alibi(T, n_head).transpose(1, 2), ["sign is flipped", "i and j are swapped"]),
                  (lambda T, n_head: alibi(T, n_head).flip(0), ["reverse order", "steepest slope 2^{-8/H} = 2^{-1}"]),
                  (lambda T, n_head: alibi(T, n_head, slopes_for=8), ["case 2", "H = 4", "not 2^{-h}"]),
                  (lambda T, n_head: alibi(T, n_head, first_h=0), ["first slope is 2^{-8/H}"]),
                  (_alibi_abs, ["differs", "not -m_h·|j - i|"]), (_alibi_last_dim_heads, ["shape"]),
                  (lambda T, n_head: _alibi_slopes(T, lambda h, H: h * 2.0 ** (-8 / H), n_head),
                   ["case 1", "geometric", "not h·2^{-8/H}"]),  # arithmetic slopes
                  (lambda T, n_head: _alibi_slopes(T, lambda h, H: 2.0 ** (-8 / h), n_head),
                   ["case 1", "not 2^{-8/h}"]),
                  (lambda T, n_head: _alibi_slopes(T, lambda h, H: 2.0 ** (-h / H), n_head),
                   ["case 1", "the factor 8"]),
                  (lambda T, n_head: alibi(T, n_head).abs(), ["case 1", "not |j - i|"]),  # offsets |j - i|
                  (_alibi_causal, ["leave the mask out", "applied separately"])],
        "right": [_alibi_loops, _alibi_numpy],
    },
    "head_splits": {
        "wrong": [(_splits_labelled, ["the count is 6, expected 3", "divide by h!"]),
                  (_splits_one_head, ["only head 1's choice"]), (_splits_one_factorial, ["(d_k!)^h, not d_k!"]),
                  (_splits_only_h, ["the count is 12, expected 3", "divide by (d_k!)^h"]),
                  (lambda d_model, n_head: head_splits(d_model, n_head) * 1.0, ["must be an int", "float"]),
                  (lambda d_model, n_head: torch.tensor(head_splits(d_model, n_head)), ["must be an int"])],
        "right": [_splits_binomials, _splits_recursive],
    },
    "rope_score": {
        "wrong": [(_rs_m_minus_n, ["simplifies to", "δ is n - m"]), (_rs_cos_only, ["a term sin(δθ)"]),
                  (_rs_no_theta, ["the angle is δθ"]), (_rs_same_position, ["by its own position"]),
                  (_rs_positions_left, ["uses m, n, which it may not contain"]),
                  (_rs_numeric, ["floating-point numbers", "exact"])],
        "right": [_rs_matrix_form, _rs_complex],
    },
    "is_equivariant": {
        "wrong": [(_eq_invariance, ["case 1 of 13", "the answer is False, expected True", "that is invariance"]),
                  (_eq_exact, ["case 1 of 13", "within a tolerance"]),
                  (_eq_one_swap, ["marker added to the last position", "not one fixed swap"]),
                  (_eq_float64_tolerance, ["attention in float32", "too strict"]),
                  (_eq_inverse_order, ["case 1 of 13", "not with the inverse order"]),
                  (lambda layer, x: True, ["causal mask (case 2 of 13)", "keys 0 … i only"]),
                  (_eq_tensor, ["must be a bool", "Tensor"]),
                  (_eq_swap_last_two, ["marker added to token 0 (case 8 of 13)", "the answer is True",
                                       "leaves token 0 in place", "not one fixed swap"]),
                  (_eq_roll, ["ring 0-1-2-3 (case 11 of 13)", "the answer is True, expected False",
                              "a cyclic shift, torch.roll", "not one fixed swap, shift"]),
                  (_eq_flip, ["ring 0-1-2-3", "the answer is True", "the reversed order", "or reversal"]),
                  (_eq_swap_ends, ["marker added to token 1 (case 9 of 13)", "leaves token 1 in place"]),
                  (_eq_one_cycle, ["marker added to token 2 (case 10 of 13)", "leaves token 2 in place"]),
                  (_eq_one_seeded_random, ["the answer is True, expected False", "not one fixed swap"])],
        "right": [_eq_permutation_matrices, _eq_random_perms, _eq_generators],
    },
    "score_drift": {
        "wrong": [(_drift_pe_only, ["expected 10.", "cross terms"]),
                  (_drift_every_offset, ["case 4", "only offsets seen in training"]),
                  (_drift_inside_training, ["case 1", "positions up to T_test - 1"]),
                  (_drift_rope_opposite, ["case 2", "depends on m + n"]),
                  (_drift_against_last, ["case 1", "S[δ, 0]"]),
                  (_drift_tensor, ["must be a float", "Tensor"])],
        "right": [_drift_loops, _drift_float32_tensor],
    },
    "layer_comparison": {
        "wrong": [(_layers_no_projections, ["attention multiply-adds", "four projections"]),
                  (_layers_flops, ["counts FLOPs"]),
                  (_layers_path_off_by_one, ["recurrent path length: got 3, expected 4", "counting both ends"]),
                  (_layers_one_rnn_product, ["recurrent multiply-adds", "x_t W_x and h_{t-1} W_h"]),
                  (_layers_sequential_attention, ["attention sequential steps", "at once"]),
                  (_layers_scores_only, ["AV costs"]),
                  (_layers_floats, ["must be an int"]), (_layers_list, ["must be a dict"])],
        "right": [_layers_step_by_step, _layers_numpy_ints],
    },
    "untrained_rows": {
        "wrong": [(_rows_unchanged, ["case 1", "decays every row"]), (_rows_no_lr, ["not 1 - λ"]),
                  (_rows_linear, ["compounds"]), (_rows_one_step_short, ["n steps, n factors"]),
                  (_rows_from_last_trained, ["shape", "row T_train - 1 is trained"]),
                  (_rows_after_first_untrained, ["shape", "untrained too"]),
                  (_rows_trained_ones, ["shape", "T_train and up"]), (_rows_to_zero, ["differs"])],
        "right": [_rows_loop, _rows_torch_adamw, _rows_numpy_log],
    },
}


def test_registry():
    assert set(registry(6)) == {"sinusoidal", "rotation_for_offset", "rope", "kv_causal_mask", "kv_pair_count",
                                "alibi", "head_splits", "is_equivariant", "score_drift", "layer_comparison",
                                "rope_score", "untrained_rows"}
    assert set(CATALOGUE) == set(registry(6))


def test_solutions_pass():
    for name, fn in [("sinusoidal", sinusoidal), ("rotation_for_offset", rotation_for_offset),
                     ("rope", lambda x: rope(x)), ("kv_causal_mask", kv_causal_mask),
                     ("kv_pair_count", kv_pair_count),
                     ("alibi", lambda T, n_head: alibi(T, n_head)), ("head_splits", head_splits),
                     ("is_equivariant", is_equivariant), ("score_drift", lambda *a: score_drift(*a)),
                     ("layer_comparison", layer_comparison), ("rope_score", rope_score),
                     ("untrained_rows", untrained_rows)]:
        result = ch6.EXERCISES[name](fn)
        assert result.passed, f"{name}: {result.message}"


@pytest.mark.parametrize(("name", "wrong", "words"), wrong_answers(CATALOGUE))
def test_typical_wrong_answer_rejected(name, wrong, words):
    assert_rejected(ch6.EXERCISES[name], wrong, *words)


@pytest.mark.parametrize(("name", "right"), right_answers(CATALOGUE))
def test_correct_alternative_accepted(name, right):
    assert_accepted(ch6.EXERCISES[name], right)


def test_rope_score_reference_is_the_rotated_score():
    """The checker's closed form equals Rot(mθ)q · Rot(nθ)k with n = m + δ (symbolic), and the package's RoPE."""
    q1, q2, k1, k2, delta, theta, m = sp.symbols("q1 q2 k1 k2 delta theta m", real=True)
    rot = lambda a: sp.Matrix([[sp.cos(a), -sp.sin(a)], [sp.sin(a), sp.cos(a)]])  # noqa: E731
    score = ((rot(m * theta) * sp.Matrix([q1, q2])).T * (rot((m + delta) * theta) * sp.Matrix([k1, k2])))[0]
    assert sp.simplify(sp.expand_trig(score - ch6._ref_rope_score(q1, q2, k1, k2, delta, theta))) == 0
    q, k = torch.tensor([0.3, -1.2], dtype=torch.float64), torch.tensor([0.7, 0.4], dtype=torch.float64)
    rq, rk = P.apply_rope(q.expand(9, 2)), P.apply_rope(k.expand(9, 2))  # d = 2: θ = ω_0 = 1
    expected = ch6._ref_rope_score(0.3, -1.2, 0.7, 0.4, sp.Integer(6), 1)  # query at 2, key at 8
    assert abs(float(rq[2] @ rk[8]) - float(expected)) < 1e-12
