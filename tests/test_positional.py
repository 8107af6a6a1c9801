"""Chapter 6: transformer_lab.positional against SymPy, closed forms and independent torch formulae (float64).

Tolerances: float64, rtol = atol = 1e-12 for values and gradients (sin/cos of angles up to a few hundred radians are
exact to ~1e-14); the SymPy derivations are compared through ``ch6.check`` at 1e-10.
"""

from __future__ import annotations

import math

import pytest
import torch

from transformer_lab import positional as P
from transformer_lab.derivations import ch6

TOL = {"rtol": 1e-12, "atol": 1e-12}


def _rope_complex(x, positions, base=10000.0):
    """Independent reference: pairs as complex numbers times e^{i m ω_i} (the LLaMA formulation)."""
    d = x.shape[-1]
    omega = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    angle = positions.to(torch.float64)[..., None] * omega
    z = torch.view_as_complex(x.reshape(*x.shape[:-1], d // 2, 2).contiguous())
    return torch.view_as_real(z * torch.polar(torch.ones_like(angle), angle)).flatten(-2)


# ---------------------------------------------------------------- derivations
def test_derivation_check_agrees():
    for name, diff in ch6.check(seed=2).items():
        assert diff < 1e-10, f"{name}: {diff}"


def test_symbolic_identities():
    assert ch6.pe_relative_rotation()[-1][1] == ch6.sp.zeros(2, 1)
    assert ch6.pe_dot_product(6)[-1][1] == 0
    steps = dict(ch6.rope_relative())
    assert steps["score - qᵀ Rot((n-m)θ) k"] == 0
    assert steps["Rot(a) - B(a)^T  (B: the sinusoidal block)"] == ch6.sp.zeros(2, 2)
    # both advance the phase by a; the transpose is only the (sin, cos) vs (cos, sin) storage order
    assert steps["B(a)(sin φ, cos φ) - (sin(φ+a), cos(φ+a))"] == ch6.sp.zeros(2, 1)
    assert steps["Rot(a)(cos φ, sin φ) - (cos(φ+a), sin(φ+a))"] == ch6.sp.zeros(2, 1)
    for label, diff in ch6.pe_rotation_group():  # one block B(kω) of R(k): a rotation, B(0) = I, a group
        assert diff == (0 if label.startswith("det") else ch6.sp.zeros(2, 2)), label
    assert steps["∂score/∂m + ∂score/∂n  (shift both: no change)"] == 0
    counted = dict(ch6.causal_pair_count())
    n = ch6.sp.symbols("n", positive=True, integer=True)
    assert ch6.sp.simplify(counted["causal pairs Σ_{i=1}^n i"] - n * (n + 1) / 2) == 0
    assert counted["limit n → ∞"] == ch6.sp.Rational(1, 2)
    heads = dict(ch6.head_split_count(8))  # the product of binomials is the multinomial, symbolic d_k
    assert heads["C(d, d_k) C(d - d_k, d_k) ⋯ - d!/(d_k!)^h, symbolic d_k, h = 2, 3, 4"] == ch6.sp.zeros(3, 1)


# ---------------------------------------------------------------- sinusoidal encoding
def test_sinusoidal_closed_form():
    pe = P.sinusoidal_encoding(50, 16, dtype=torch.float64)
    pos, i = 37, 5
    w = 10000.0 ** (-2 * i / 16)
    assert pe[pos, 2 * i].item() == pytest.approx(math.sin(pos * w), abs=1e-15)
    assert pe[pos, 2 * i + 1].item() == pytest.approx(math.cos(pos * w), abs=1e-15)
    assert pe.shape == (50, 16)
    torch.testing.assert_close(pe[0], torch.tensor([0.0, 1.0] * 8, dtype=torch.float64))  # sin 0, cos 0
    assert P.sinusoidal_encoding(3, 4).dtype == torch.get_default_dtype()
    assert P.sinusoidal_encoding(3, 4, base=100.0, dtype=torch.float64)[1, 2].item() == pytest.approx(math.sin(0.1))


@pytest.mark.parametrize("k", [1, 5, 63, 2.5, -4])
def test_relative_rotation(k):
    d = 12
    R = P.relative_rotation(k, d, dtype=torch.float64)
    torch.testing.assert_close(R @ R.T, torch.eye(d, dtype=torch.float64), **TOL)  # orthogonal
    positions = torch.arange(20, 40, dtype=torch.float64)
    omega = P.sinusoidal_frequencies(d, dtype=torch.float64)
    pe = lambda p: torch.stack((torch.sin(p[:, None] * omega), torch.cos(p[:, None] * omega)), -1).flatten(1)  # noqa: E731
    torch.testing.assert_close(pe(positions + k), pe(positions) @ R.T, **TOL)  # PE(pos+k) = R(k) PE(pos)


def test_pe_similarity_depends_on_offset_only():
    pe = P.sinusoidal_encoding(200, 32, dtype=torch.float64)
    sim = pe @ pe.T  # (200, 200)
    for k in (0, 1, 7, 50):
        diag = torch.diagonal(sim, offset=k)
        torch.testing.assert_close(diag, torch.full_like(diag, diag[0].item()), **TOL)
        omega = P.sinusoidal_frequencies(32, dtype=torch.float64)
        assert diag[0].item() == pytest.approx(torch.cos(k * omega).sum().item(), abs=1e-12)


# ---------------------------------------------------------------- RoPE
def test_rope_matches_complex_reference_values_and_gradients():
    g = torch.Generator().manual_seed(0)
    x0 = torch.randn(2, 4, 9, 16, generator=g, dtype=torch.float64)
    for positions in (None, torch.arange(9) + 100, torch.randint(0, 1000, (2, 4, 9), generator=g)):
        x1, x2 = x0.clone().requires_grad_(True), x0.clone().requires_grad_(True)
        ours = P.apply_rope(x1, positions)
        ref = _rope_complex(x2, torch.arange(9) if positions is None else positions)
        torch.testing.assert_close(ours, ref, **TOL)
        w = torch.randn(ours.shape, generator=g, dtype=torch.float64)
        (ours * w).sum().backward()
        (ref * w).sum().backward()
        torch.testing.assert_close(x1.grad, x2.grad, **TOL)


def test_rope_scores_depend_on_relative_position_only():
    g = torch.Generator().manual_seed(1)
    q, k = torch.randn(12, 8, generator=g, dtype=torch.float64), torch.randn(12, 8, generator=g, dtype=torch.float64)
    pos = torch.arange(12)
    s0 = P.apply_rope(q, pos) @ P.apply_rope(k, pos).T
    for shift in (1, 13, 1000):
        torch.testing.assert_close(P.apply_rope(q, pos + shift) @ P.apply_rope(k, pos + shift).T, s0, **TOL)
    # the same q, k at every position: the score depends on m - n only (a Toeplitz matrix)
    qs, ks = q[:1].expand(12, 8), k[:1].expand(12, 8)
    s = P.apply_rope(qs, pos) @ P.apply_rope(ks, pos).T
    for off in (-3, 0, 5):
        diag = torch.diagonal(s, offset=off)
        torch.testing.assert_close(diag, torch.full_like(diag, diag[0].item()), **TOL)


def test_rope_preserves_norm_and_position_zero():
    x = torch.randn(5, 6, dtype=torch.float64)
    torch.testing.assert_close(P.apply_rope(x).norm(dim=-1), x.norm(dim=-1), **TOL)
    torch.testing.assert_close(P.apply_rope(x)[0], x[0], **TOL)
    one = torch.randn(1, 4, dtype=torch.float64)  # a length-1 sequence is left unchanged
    torch.testing.assert_close(P.apply_rope(one), one, **TOL)


def test_rope_float32():
    x = torch.randn(3, 10, 8)
    out = P.apply_rope(x)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.double(), P.apply_rope(x.double()), rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- causal mask and counting
def test_causal_mask():
    m = P.causal_mask(4)
    assert m.dtype == torch.bool
    assert torch.equal(m, torch.ones(4, 4, dtype=torch.bool).tril())
    m2 = P.causal_mask(2, 5)  # the last 2 of 5 positions query all keys up to themselves
    assert torch.equal(m2, torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]], dtype=torch.bool))
    assert torch.equal(P.causal_mask(1), torch.ones(1, 1, dtype=torch.bool))
    for n in range(1, 30):
        assert P.causal_mask(n).sum().item() == P.causal_pairs(n) == n * (n + 1) // 2
        assert P.attention_pairs(n) == n * n


def test_head_counting():
    assert P.valid_head_counts(12) == [1, 2, 3, 4, 6, 12]
    assert P.valid_head_counts(7) == [1, 7]
    assert P.head_partitions(8, 2) == 35  # C(8, 4) / 2
    assert P.head_partitions(8, 8) == 1
    assert P.head_partitions(8, 1) == 1
    assert P.head_partitions(6, 3) == 15


# ---------------------------------------------------------------- bad input
@pytest.mark.parametrize(("args", "kw", "match"), [
    ((10, 7), {}, "d_model must be even"),
    ((0, 8), {}, "n_pos must be a positive integer"),
    ((10, 0), {}, "d_model must be a positive integer"),
    ((10.0, 8), {}, "n_pos must be a positive integer"),
    ((10, 8), {"base": 0.0}, "base must be"),
    ((10, 8), {"base": -2.0}, "base must be"),
    ((10, 8), {"base": math.inf}, "base must be"),
])
def test_sinusoidal_bad_input(args, kw, match):
    with pytest.raises(ValueError, match=match):
        P.sinusoidal_encoding(*args, **kw)


def test_relative_rotation_bad_input():
    with pytest.raises(ValueError, match="d_model must be even"):
        P.relative_rotation(1, 5)
    with pytest.raises(ValueError, match="finite number"):
        P.relative_rotation(math.nan, 4)
    with pytest.raises(ValueError, match="finite number"):
        P.relative_rotation(torch.tensor(1), 4)


@pytest.mark.parametrize(("x", "positions", "match"), [
    (torch.randn(4, 7), None, "must be even"),
    (torch.randn(8), None, r"\(\.\.\., T, d\)"),
    (torch.ones(4, 8, dtype=torch.long), None, "floating-point"),
    (torch.randn(4, 8), torch.arange(5), "sequence length T = 4"),
    (torch.randn(4, 8), torch.tensor(3), "sequence length T = 4"),
    (torch.randn(4, 8), torch.ones(4, dtype=torch.bool), "numeric"),
    (torch.randn(4, 8), [0, 1, 2, 3], "numeric"),
    (torch.randn(4, 0), None, "> 0"),
])
def test_rope_bad_input(x, positions, match):
    with pytest.raises(ValueError, match=match):
        P.apply_rope(x, positions)


def test_counting_bad_input():
    with pytest.raises(ValueError, match="T_k must be >= T"):
        P.causal_mask(5, 3)
    with pytest.raises(ValueError, match="T must be a positive integer"):
        P.causal_mask(0)
    with pytest.raises(ValueError, match="n must be a positive integer"):
        P.causal_pairs(-1)
    with pytest.raises(ValueError, match="n must be a positive integer"):
        P.attention_pairs(2.0)
    with pytest.raises(ValueError, match="must divide"):
        P.head_partitions(10, 3)
    with pytest.raises(ValueError, match="d_model must be a positive integer"):
        P.valid_head_counts(0)


# ---------------------------------------------------------------- frequencies: the slowest is base^{-(d-2)/d}
@pytest.mark.parametrize("d_model", [2, 8, 64, 128])
def test_slowest_frequency_is_base_to_minus_d_minus_2_over_d(d_model):
    omega = P.sinusoidal_frequencies(d_model, dtype=torch.float64)
    assert omega[0].item() == 1.0
    assert math.isclose(omega[-1].item(), 10000.0 ** (-(d_model - 2) / d_model), rel_tol=1e-14)
    assert omega[-1].item() > 1 / 10000  # 1/base is reached only as d_model -> infinity


# ---------------------------------------------------------------- learned positions
def test_learned_positions_rows_and_gradient():
    torch.manual_seed(0)
    lp = P.LearnedPositions(10, 4)
    assert lp.weight.shape == (10, 4)
    assert abs(lp.weight.std().item() - 0.02) < 0.01  # N(0, 0.02²)
    pos = torch.tensor([[0, 3, 9], [2, 2, 5]])
    out = lp(pos)
    assert out.shape == (2, 3, 4)
    torch.testing.assert_close(out, lp.weight[pos], rtol=0, atol=0)
    out.sum().backward()  # each row's gradient counts how often the position occurs
    counts = torch.bincount(pos.flatten(), minlength=10).to(lp.weight.dtype)
    torch.testing.assert_close(lp.weight.grad, counts[:, None].expand(10, 4), rtol=0, atol=0)


def test_learned_positions_bad_input():
    lp = P.LearnedPositions(4, 2)
    with pytest.raises(ValueError, match="no row for position 4"):
        lp(torch.arange(5))
    with pytest.raises(ValueError, match="integer"):
        lp(torch.zeros(3))
    with pytest.raises(ValueError, match="n_pos must be a positive integer"):
        P.LearnedPositions(0, 2)


# ---------------------------------------------------------------- ALiBi against its closed form
def test_alibi_slopes_closed_form():
    for H in (1, 2, 4, 8, 16):  # powers of 2: m_h = 2^{-8h/H}
        expected = torch.tensor([2.0 ** (-8 * h / H) for h in range(1, H + 1)], dtype=torch.float64)
        torch.testing.assert_close(P.alibi_slopes(H, dtype=torch.float64), expected, rtol=0, atol=0)
    torch.testing.assert_close(P.alibi_slopes(8, dtype=torch.float64),  # Press et al.: 1/2, 1/4, …, 1/256
                               torch.tensor([1 / 2 ** h for h in range(1, 9)], dtype=torch.float64), rtol=0, atol=0)
    # not a power of 2 (the authors' code): the 4 slopes of H' = 4, then every other slope of 2H' = 8
    torch.testing.assert_close(P.alibi_slopes(6, dtype=torch.float64),
                               torch.tensor([2**-2, 2**-4, 2**-6, 2**-8, 2**-1, 2**-3], dtype=torch.float64),
                               rtol=0, atol=0)


@pytest.mark.parametrize(("T", "T_k", "H"), [(1, 1, 1), (5, 5, 4), (2, 7, 8), (3, 3, 6)])
def test_alibi_bias_closed_form(T, T_k, H):
    bias = P.alibi_bias(T, T_k, n_head=H, dtype=torch.float64)
    assert bias.shape == (H, T, T_k)
    m = P.alibi_slopes(H, dtype=torch.float64)
    for h in range(H):
        for i in range(T):
            for j in range(T_k):
                assert bias[h, i, j].item() == m[h].item() * (j - (i + T_k - T))
    visible = P.causal_mask(T, T_k)
    assert (bias[:, visible] <= 0).all()  # a penalty on every key the causal mask lets a query see
    assert (bias.diagonal(offset=T_k - T, dim1=1, dim2=2) == 0).all()  # distance 0: no penalty


def test_alibi_scores_shift_invariant_and_float32():
    # the bias depends on j - i only: the last T queries of T_k see the same biases as a fresh sequence
    torch.testing.assert_close(P.alibi_bias(3, 9, n_head=4)[:, :, 6:], P.alibi_bias(3, n_head=4), rtol=0, atol=0)
    assert P.alibi_bias(4, n_head=2, dtype=torch.float32).dtype == torch.float32


def test_alibi_bad_input():
    with pytest.raises(ValueError, match="n_head must be a positive integer"):
        P.alibi_slopes(0)
    with pytest.raises(ValueError, match="T_k must be >= T"):
        P.alibi_bias(4, 2, n_head=2)


# ---------------------------------------------------------------- the GPT's learned table is LearnedPositions
def test_gpt_learned_table_is_learned_positions():
    from transformer_lab.gpt import GPT, GPTConfig
    model = GPT(GPTConfig(vocab_size=8, block_size=12, n_layer=1, n_head=2, d_model=8))
    assert isinstance(model.pos_emb, P.LearnedPositions) and isinstance(model.pos_emb, torch.nn.Embedding)
    assert "pos_emb.weight" in model.state_dict() and model.pos_emb.weight.shape == (12, 8)
    pos = torch.arange(3, 7)
    torch.testing.assert_close(model.pos_emb(pos), model.pos_emb.weight[3:7], rtol=0, atol=0)  # forward's slice


def test_gpt_initialisation_unchanged_by_learned_positions(monkeypatch):
    """Same seed, same draws: a GPT whose table is the book's ``attention.Embedding`` (as before) is bit-identical."""
    from transformer_lab import gpt
    from transformer_lab.attention import Embedding

    config = gpt.GPTConfig(vocab_size=16, block_size=32, n_layer=2, n_head=2, d_model=16)
    torch.manual_seed(3)
    new = gpt.GPT(config).state_dict()
    after_new = torch.randn(4)
    monkeypatch.setattr(gpt, "LearnedPositions", Embedding)
    torch.manual_seed(3)
    old = gpt.GPT(config).state_dict()
    after_old = torch.randn(4)
    assert new.keys() == old.keys()
    for key in new:
        torch.testing.assert_close(new[key], old[key], rtol=0, atol=0)
    torch.testing.assert_close(after_new, after_old, rtol=0, atol=0)
    assert abs(new["pos_emb.weight"].std().item() - 0.02) < 0.005  # re-drawn by init_gpt_weights: N(0, 0.02²)


def test_numpy_integers_accepted_bools_rejected():
    np = pytest.importorskip("numpy")
    torch.testing.assert_close(P.sinusoidal_encoding(np.int64(5), np.int64(4)), P.sinusoidal_encoding(5, 4))
    torch.testing.assert_close(P.relative_rotation(np.int64(3), 4), P.relative_rotation(3, 4))
    assert P.causal_pairs(np.int64(4)) == 10 and type(P.causal_pairs(np.int64(4))) is int
    for bad in (True, np.bool_(True)):
        with pytest.raises(ValueError, match="base must be"):
            P.sinusoidal_encoding(4, 4, base=bad)
        with pytest.raises(ValueError, match="n_pos must be a positive integer"):
            P.sinusoidal_encoding(bad, 4)
        with pytest.raises(ValueError, match="k must be a finite number"):
            P.relative_rotation(bad, 4)
