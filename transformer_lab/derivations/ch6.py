"""Chapter 6 (combinatorics) derivations in SymPy.

Relative position is linear for sinusoidal encodings (PE(pos + k) = R(k)·PE(pos)); RoPE scores depend on m - n
only; a causal mask admits n(n+1)/2 of the n² pairs; the ways heads can split d_model. :func:`check` lambdifies
the results and compares them with ``transformer_lab.positional`` and with independent references.
"""

from __future__ import annotations

import itertools

import numpy as np
import sympy as sp
import torch
from sympy.utilities.iterables import multiset_partitions

from transformer_lab import positional as pos_mod

pos, k, omega = sp.symbols("pos k omega", real=True)


def pe_block(angle: sp.Expr) -> sp.Matrix:
    """B(a) = [[cos a, sin a], [-sin a, cos a]], acting on a (sin φ, cos φ) pair: R(k) = diag(B(k ω_i))."""
    return sp.Matrix([[sp.cos(angle), sp.sin(angle)], [-sp.sin(angle), sp.cos(angle)]])


def pe_pair(position: sp.Expr, w: sp.Expr = omega) -> sp.Matrix:
    """One (sin, cos) pair of the sinusoidal encoding: (PE(pos, 2i), PE(pos, 2i+1)) with frequency ω_i."""
    return sp.Matrix([sp.sin(w * position), sp.cos(w * position)])


def pe_relative_rotation() -> list[tuple[str, sp.Expr]]:
    """PE(pos + k) = R(k)·PE(pos): the angle-addition formulas, pair by pair."""
    shifted = pe_pair(pos + k)
    rotated = pe_block(k * omega) * pe_pair(pos)
    return [
        ("PE pair at pos + k", shifted),
        ("… angle-addition formulas", sp.expand_trig(shifted.applyfunc(lambda e: e.subs(omega * (pos + k),
                                                                                          omega * pos + omega * k)))),
        ("B(kω), the pair's block of R(k)", pe_block(k * omega)),
        ("B(kω)·PE pair at pos", sp.expand(rotated)),
        ("PE pair at pos + k - B(kω)·PE pair at pos", sp.simplify(sp.expand_trig(shifted - rotated))),
    ]


def pe_rotation_group() -> list[tuple[str, sp.Expr]]:
    """One block B(kω) of R(k): R(k)R(k)ᵀ = I, det R(k) = 1, R(0) = I, R(j)R(k) = R(j + k), R(-k) = R(k)ᵀ, each
    difference 0 (a scalar for the determinant, a 2 × 2 matrix for the others).

    R is block-diagonal, so each identity holds for the whole matrix iff it holds block by block (the determinant
    of R(k) is the product of its blocks' determinants). Orthogonal with determinant 1 makes R(k) a rotation, and
    the last three identities make k ↦ R(k) a homomorphism from (ℤ, +) into the rotations.
    """
    j = sp.symbols("j", real=True)
    eye = sp.eye(2)
    return [
        ("B(kω)B(kω)^T - I", sp.simplify(pe_block(k * omega) * pe_block(k * omega).T - eye)),
        ("det B(kω) - 1", sp.simplify(pe_block(k * omega).det() - 1)),
        ("B(0) - I", pe_block(0) - eye),
        ("B(jω)B(kω) - B((j + k)ω)", sp.simplify(sp.expand_trig(pe_block(j * omega) * pe_block(k * omega)
                                                                 - pe_block((j + k) * omega)))),
        ("B(-kω) - B(kω)^T", sp.simplify(pe_block(-k * omega) - pe_block(k * omega).T)),
    ]


def pe_rotation_matrix(d_model: int = 4, base: int = 10000) -> sp.Matrix:
    """The full block-diagonal R(k) for a small d_model, frequencies ω_i = base^{-2i/d}."""
    base = sp.Integer(base)
    return sp.diag(*[pe_block(k * base ** sp.Rational(-2 * i, d_model)) for i in range(d_model // 2)])


def pe_encoding_expr(d_model: int = 4, base: int = 10000) -> sp.Matrix:
    """PE(pos) as a column of d_model expressions in pos."""
    base = sp.Integer(base)
    return sp.Matrix([f(pos * base ** sp.Rational(-2 * (j // 2), d_model))
                      for j, f in zip(range(d_model), itertools.cycle((sp.sin, sp.cos)))])


def pe_dot_product(d_model: int = 4) -> list[tuple[str, sp.Expr]]:
    """PE(pos)·PE(pos + k) = Σ_i cos(k ω_i): a function of the offset k only, not of pos."""
    w = sp.symbols(f"omega_0:{d_model // 2}", positive=True)
    dot = sum((pe_pair(pos, wi).T * pe_pair(pos + k, wi))[0] for wi in w)
    return [
        ("PE(pos)·PE(pos+k)", dot),
        ("simplified", sp.simplify(sp.expand_trig(dot))),
        ("∂/∂pos", sp.simplify(sp.diff(dot, pos))),
    ]


def rope_rotation(a: sp.Expr) -> sp.Matrix:
    """RoPE's 2×2 rotation Rot(a) = [[cos a, -sin a], [sin a, cos a]]: counter-clockwise by a, = pe_block(a)ᵀ."""
    return sp.Matrix([[sp.cos(a), -sp.sin(a)], [sp.sin(a), sp.cos(a)]])


def rope_relative() -> list[tuple[str, sp.Expr]]:
    """⟨Rot(mθ)q, Rot(nθ)k⟩ = qᵀ Rot((n - m)θ) k for one pair: RoPE scores depend on m - n only."""
    m, n, theta, a, phi = sp.symbols("m n theta a phi", real=True)
    q = sp.Matrix(sp.symbols("q_1 q_2", real=True))
    key = sp.Matrix(sp.symbols("k_1 k_2", real=True))
    score = sp.expand((rope_rotation(m * theta) * q).T * (rope_rotation(n * theta) * key))[0]
    relative = (q.T * rope_rotation((n - m) * theta) * key)[0]
    return [
        ("Rot(a), RoPE's rotation", rope_rotation(a)),
        ("Rot(a) - B(a)^T  (B: the sinusoidal block)", rope_rotation(a) - pe_block(a).T),
        ("B(a)(sin φ, cos φ) - (sin(φ+a), cos(φ+a))",
         sp.simplify(sp.expand_trig(pe_block(a) * sp.Matrix([sp.sin(phi), sp.cos(phi)])
                                    - sp.Matrix([sp.sin(phi + a), sp.cos(phi + a)])))),
        ("Rot(a)(cos φ, sin φ) - (cos(φ+a), sin(φ+a))",
         sp.simplify(sp.expand_trig(rope_rotation(a) * sp.Matrix([sp.cos(phi), sp.sin(phi)])
                                    - sp.Matrix([sp.cos(phi + a), sp.sin(phi + a)])))),
        ("RoPE(q, m) = Rot(mθ) q", rope_rotation(m * theta) * q),
        ("score ⟨RoPE(q, m), RoPE(k, n)⟩", score),
        ("simplified", sp.simplify(sp.trigsimp(score))),
        ("score - qᵀ Rot((n-m)θ) k", sp.simplify(sp.expand_trig(sp.expand(score - relative)))),
        ("∂score/∂m + ∂score/∂n  (shift both: no change)", sp.simplify(sp.diff(score, m) + sp.diff(score, n))),
    ]


def causal_pair_count() -> list[tuple[str, sp.Expr]]:
    """Query i sees keys 1 … i: Σ_{i=1}^{n} i = n(n+1)/2 of the n² pairs, a fraction that tends to 1/2."""
    n, i = sp.symbols("n i", positive=True, integer=True)
    causal = sp.summation(i, (i, 1, n))
    return [
        ("all (query, key) pairs", n**2),
        ("causal pairs Σ_{i=1}^n i", sp.factor(causal)),
        ("= n + C(n, 2) (the diagonal plus each unordered pair once)", sp.factor(n + sp.binomial(n, 2).expand(func=True))),
        ("fraction of all pairs", sp.simplify(causal / n**2)),
        ("limit n → ∞", sp.limit(causal / n**2, n, sp.oo)),
    ]


def head_split_count(d_model: int = 8) -> list[tuple[str, sp.Expr]]:
    """Equal head splits: n_head must divide d_model; the ways to deal the d_model projected coordinates (the
    columns of W_Q, with W_K, W_V alike) into unordered heads. Every head reads all of the input.

    Head 1 takes d_k of the d coordinates, head 2 d_k of the rest, …: C(d, d_k) C(d - d_k, d_k) ⋯ = d!/(d_k!)^h
    (the multinomial coefficient) for labelled heads, derived for symbolic d_k and h = 2, 3, 4; each unordered
    split is counted once per order of its h heads, h! times. Checked against enumeration in :func:`check`.
    """
    d, h = sp.symbols("d h", positive=True, integer=True)
    d_k = sp.symbols("d_k", positive=True, integer=True)
    power = sp.Pow(sp.factorial(d / h), h, evaluate=False)  # unevaluated, so that it prints as d!/((d/h)!)^h
    ordered = sp.Mul(sp.factorial(d), sp.Pow(power, -1, evaluate=False), evaluate=False)
    formula = sp.Mul(sp.factorial(d), sp.Pow(sp.Mul(power, sp.factorial(h), evaluate=False), -1, evaluate=False),
                     evaluate=False)
    product_minus_multinomial = sp.Matrix([  # Π_{j<h} C(h d_k - j d_k, d_k) - (h d_k)!/(d_k!)^h, symbolic d_k
        sp.gammasimp(sp.expand_func(sp.Mul(*[sp.binomial((hh - j) * d_k, d_k) for j in range(hh)]))
                     - sp.factorial(hh * d_k) / sp.factorial(d_k) ** hh) for hh in (2, 3, 4)])
    return [
        (f"valid n_head for d_model = {d_model}", sp.FiniteSet(*sp.divisors(d_model))),
        ("C(d, d_k) C(d - d_k, d_k) ⋯ - d!/(d_k!)^h, symbolic d_k, h = 2, 3, 4", product_minus_multinomial),
        ("labelled heads: multinomial d!/(d_k!)^h, d_k = d/h", ordered),
        ("unordered heads: each split counted h! times", formula),
        (f"… for d_model = {d_model}: rows (n_head, splits)", sp.Matrix([[hh, formula.subs({d: d_model, h: hh})]
                                                  for hh in sp.divisors(d_model)])),
    ]


# ---------------------------------------------------------------- numerical agreement
def _brute_force_partitions(d_model: int, n_head: int) -> int:
    """Count set partitions of d_model coordinates into n_head blocks of equal size, by enumeration."""
    return sum(1 for part in multiset_partitions(list(range(d_model)), n_head)
               if all(len(b) == d_model // n_head for b in part))


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    """The largest |a - b| / max(1, |b|): a difference relative to the size of the value compared (absolute for
    values below 1)."""
    return ((a - b).abs() / b.abs().clamp(min=1.0)).max().item()


def check(seed: int = 0) -> dict[str, float]:
    """Largest relative difference, |a - b| / max(1, |b|), between SymPy (lambdified), ours and the independent
    references, float64; the two counts are compared exactly."""
    gen = torch.Generator().manual_seed(seed)
    out: dict[str, float] = {}
    d, n_pos, base = 8, 64, 10000
    pe_sym = sp.lambdify(pos, pe_encoding_expr(d, base), "numpy")
    positions = np.arange(n_pos, dtype=np.float64)
    sym = torch.from_numpy(np.asarray(pe_sym(positions), dtype=np.float64).squeeze(1).T)  # (n_pos, d)
    ours = pos_mod.sinusoidal_encoding(n_pos, d, base=base, dtype=torch.float64)
    out["PE: sympy vs ours"] = _relative(sym, ours)
    R_sym = sp.lambdify(k, pe_rotation_matrix(d, base), "numpy")
    worst_R, worst_shift = 0.0, 0.0
    for kk in (1, 3, 17, 40):
        R = pos_mod.relative_rotation(kk, d, base=base, dtype=torch.float64)
        worst_R = max(worst_R, _relative(torch.from_numpy(np.asarray(R_sym(float(kk)), dtype=np.float64)), R))
        worst_shift = max(worst_shift, _relative(ours[:-kk] @ R.T, ours[kk:]))  # PE(p+k) = R(k) PE(p)
    out["R(k): sympy vs ours"] = worst_R
    out["PE(pos+k) - R(k)·PE(pos): ours"] = worst_shift
    # RoPE: ours vs the complex-number reference (x_{2i} + i x_{2i+1}) · e^{i m ω_i}
    B, h, T, dk = 2, 3, 10, 8
    x = torch.randn(B, h, T, dk, generator=gen, dtype=torch.float64)
    omega = base ** (-torch.arange(0, dk, 2, dtype=torch.float64) / dk)  # ω_i from the formula, not from the package
    angle = torch.arange(T, dtype=torch.float64)[:, None] * omega
    ref = torch.view_as_real(torch.view_as_complex(x.reshape(B, h, T, dk // 2, 2).contiguous())
                             * torch.polar(torch.ones_like(angle), angle)).flatten(-2)
    out["RoPE: ours vs complex reference"] = _relative(pos_mod.apply_rope(x), ref)
    # RoPE scores depend on m - n only: shift every position by s
    q, key = torch.randn(T, dk, generator=gen, dtype=torch.float64), torch.randn(T, dk, generator=gen, dtype=torch.float64)
    p0 = torch.arange(T)
    s0 = pos_mod.apply_rope(q, p0) @ pos_mod.apply_rope(key, p0).T
    s1 = pos_mod.apply_rope(q, p0 + 37) @ pos_mod.apply_rope(key, p0 + 37).T
    out["RoPE scores shifted by 37: ours"] = _relative(s1, s0)
    # the symbolic 2-d score, lambdified, against ours on the first pair
    m_, n_, th = sp.symbols("m n theta", real=True)
    score = dict(rope_relative())["score ⟨RoPE(q, m), RoPE(k, n)⟩"]
    f = sp.lambdify((*sp.symbols("q_1 q_2 k_1 k_2", real=True), m_, n_, th), score, "numpy")
    w0 = 1.0  # ω_0 = base^0
    sym_s = torch.tensor([[f(q[a, 0].item(), q[a, 1].item(), key[b, 0].item(), key[b, 1].item(), a, b, w0)
                           for b in range(T)] for a in range(T)], dtype=torch.float64)
    ours_s = pos_mod.apply_rope(q[:, :2], p0) @ pos_mod.apply_rope(key[:, :2], p0).T
    out["RoPE score (one pair): sympy vs ours"] = _relative(sym_s, ours_s)
    # counting
    n = sp.symbols("n", positive=True, integer=True)
    closed = sp.lambdify(n, causal_pair_count()[1][1])
    out["causal pairs: mask.sum vs n(n+1)/2 vs sympy, n = 1..64"] = float(max(
        abs(pos_mod.causal_mask(nn).sum().item() - pos_mod.causal_pairs(nn)) + abs(closed(nn) - pos_mod.causal_pairs(nn))
        for nn in range(1, 65)))
    out["head partitions: brute force vs ours"] = float(max(
        abs(_brute_force_partitions(dd, hh) - pos_mod.head_partitions(dd, hh))
        for dd in (4, 6, 8) for hh in pos_mod.valid_head_counts(dd)))
    return out
