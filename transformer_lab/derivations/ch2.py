"""Chapter 2 (probability): softmax, its Jacobian, its limits, and the chain rule of probability.

Every function returns SymPy objects; :func:`check` lambdifies them and measures the largest disagreement with
``transformer_lab.softmax`` / ``transformer_lab.sampling`` and the PyTorch reference on random float64 inputs,
relative to the size of the numbers compared.
"""

from __future__ import annotations

import itertools

import sympy as sp
import torch
import torch.nn.functional as F

__all__ = ["chain_rule", "check", "cross_entropy_one_hot", "logits_symbols", "shift_invariance",
           "softmax_general", "softmax_jacobian_derivation", "softmax_symbolic", "temperature_limit_tied",
           "temperature_limits"]


def logits_symbols(n: int = 3) -> list[sp.Symbol]:
    """Real symbols z_1 … z_n."""
    return list(sp.symbols(f"z_1:{n + 1}", real=True))


def softmax_symbolic(z: list) -> sp.Matrix:
    """The column vector ``p_i = exp(z_i) / Σ_j exp(z_j)``."""
    total = sum(sp.exp(zj) for zj in z)
    return sp.Matrix([sp.exp(zi) / total for zi in z])


def softmax_jacobian_derivation(n: int = 3) -> dict:
    """Differentiate softmax entry by entry and show the result is ``diag(p) - p pᵀ``.

    Returns ``{"z", "p", "J" (the raw derivatives ∂p_i/∂z_j), "J_formula" (diag(p) - p pᵀ, written in the same z),
    "difference" (J - J_formula, simplified: the zero matrix)}``.
    """
    z = logits_symbols(n)
    p = softmax_symbolic(z)
    J = p.jacobian(z)
    J_formula = sp.diag(*p) - p * p.T
    diff = (J - J_formula).applyfunc(sp.simplify)
    return {"z": z, "p": p, "J": J, "J_formula": J_formula, "difference": diff}


def softmax_general() -> dict:
    """Softmax of n logits for a SYMBOLIC n: ``p_i = e^{z_i} / Σ_{k=1}^n e^{z_k}`` with indexed z and symbolic i, j.

    Returns ``{"dp": ∂p_i/∂z_j as SymPy computes it, "J_formula": p_i (δ_ij - p_j), "jacobian_difference": their
    difference for 1 <= j <= n (0), "shift_difference": softmax(z + c)_i - softmax(z)_i (0)}``.
    """
    n = sp.Symbol("n", integer=True, positive=True)
    i, j, k = sp.symbols("i j k", integer=True, positive=True)
    c = sp.Symbol("c", real=True)
    z = sp.IndexedBase("z", real=True)
    total = sp.Sum(sp.exp(z[k]), (k, 1, n))

    def p(a):
        return sp.exp(z[a]) / total

    dp = sp.diff(p(i), z[j]).doit()  # the Sum's derivative picks out the k = j term (when 1 <= j <= n)
    J_formula = p(i) * (sp.KroneckerDelta(i, j) - p(j))
    shifted = sp.exp(z[i] + c) / sp.Sum(sp.expand(sp.exp(z[k] + c)), (k, 1, n))  # e^{z_k + c} = e^c e^{z_k}
    return {"n": n, "i": i, "j": j, "z": z, "p_i": p(i), "dp": dp, "J_formula": J_formula,
            "jacobian_difference": sp.simplify(sp.simplify(dp - J_formula).subs(j <= n, True)),
            "shift_difference": sp.simplify(sp.factor_terms(shifted) - p(i))}


def shift_invariance(n: int = 3) -> dict:
    """``softmax(z + c) - softmax(z)`` simplifies to 0: exp(c) cancels between numerator and denominator."""
    z = logits_symbols(n)
    c = sp.Symbol("c", real=True)
    shifted = softmax_symbolic([zi + c for zi in z])
    return {"shifted": shifted, "difference": (shifted - softmax_symbolic(z)).applyfunc(sp.simplify)}


def temperature_limits() -> dict:
    """Softmax of three logits at temperature τ, written with the gaps a = z_1 - z_2 > 0, b = z_1 - z_3 > 0.

    ``p_1 = 1 / (1 + e^{-a/τ} + e^{-b/τ})``: as τ → 0⁺ it tends to 1 (argmax), as τ → ∞ to 1/3 (uniform).
    """
    tau, a, b = sp.symbols("tau a b", positive=True)
    z1 = sp.Symbol("z_1", real=True)
    raw = softmax_symbolic([z1 / tau, (z1 - a) / tau, (z1 - b) / tau])  # softmax(z / τ)
    p = softmax_symbolic([0, -a / tau, -b / tau])  # the same after subtracting z_1 / τ (shift invariance)
    return {"tau": tau, "a": a, "b": b, "raw": raw, "p": p,
            "shift_difference": (raw - p).applyfunc(sp.simplify),
            "limit_to_0": [sp.limit(pi, tau, 0, "+") for pi in p],
            "limit_to_oo": [sp.limit(pi, tau, sp.oo) for pi in p]}


def temperature_limit_tied() -> dict:
    """Two tied maxima: logits (z_1, z_1, z_1 - b) with b > 0. As τ → 0⁺ the tied tokens share the mass, 1/2 each."""
    tau, b = sp.symbols("tau b", positive=True)
    p = softmax_symbolic([sp.Integer(0), sp.Integer(0), -b / tau])  # after subtracting z_1 / τ
    return {"tau": tau, "b": b, "p": p, "limit_to_0": [sp.limit(pi, tau, 0, "+") for pi in p]}


def chain_rule(n: int = 3, vocab: int = 2) -> dict:
    """``P(w_1 … w_n) = Π_t P(w_t | w_<t)`` for a general joint distribution over all ``vocab^n`` sequences.

    The joint table is a set of positive symbols p_{w1…wn}; marginals are sums of it, each conditional is a ratio
    of marginals, and for EVERY sequence w the product of its conditionals telescopes to p_w over the table's sum,
    which is 1. Returns the last sequence's steps (``sequence``, ``joint``, ``conditionals``, ``product``) for
    display, and ``differences``: {w: product - p_w with the constraint Σ p = 1 substituted}, each 0.
    """
    seqs = list(itertools.product(range(vocab), repeat=n))
    joint = {s: sp.Symbol("p_" + "".join(map(str, s)), positive=True) for s in seqs}

    def marginal(prefix: tuple) -> sp.Expr:
        return sum(joint[s] for s in seqs if s[:len(prefix)] == prefix)

    def conditionals(w: tuple) -> list[sp.Expr]:
        return [marginal(w[:t + 1]) / marginal(w[:t]) for t in range(n)]  # P(w_t | w_<t) = P(w_≤t) / P(w_<t)

    first = joint[seqs[0]]
    normalised = {first: 1 - (marginal(()) - first)}  # the table sums to 1
    differences = {w: sp.simplify(sp.Mul(*conditionals(w)).subs(normalised) - joint[w].subs(normalised))
                   for w in seqs}
    w = seqs[-1]
    return {"sequence": w, "joint": joint[w], "conditionals": conditionals(w),
            "product": sp.simplify(sp.Mul(*conditionals(w))), "differences": differences}


def cross_entropy_one_hot(n: int = 3, target: int = 0) -> dict:
    """``L = -Σ_i y_i log p_i`` with one-hot y picks ``-log p_target = log Σ_j e^{z_j} - z_target``."""
    z = logits_symbols(n)
    p = softmax_symbolic(z)
    y = [1 if i == target else 0 for i in range(n)]
    L = -sum(yi * sp.log(pi) for yi, pi in zip(y, p, strict=True))
    lse = sp.log(sum(sp.exp(zj) for zj in z))
    return {"L": L, "form": lse - z[target], "difference": sp.simplify(sp.expand_log(L - (lse - z[target]),
                                                                                      force=True))}


def _relative(a, b) -> float:
    """``max |a - b| / max(1, max |b|)``: the largest difference, relative to the size of ``b`` (below 1, absolute)."""
    a, b = torch.as_tensor(a), torch.as_tensor(b)
    return float((a - b).abs().max()) / max(1.0, float(b.abs().max()))


def check(seed: int = 0) -> dict[str, float]:
    """Largest difference between SymPy (lambdified), ``transformer_lab`` and PyTorch on random float64 data, each
    relative to the size of the numbers compared: ``max |a - b| / max(1, max |b|)`` (log-probabilities and the
    cross-entropy can be far from 1; probabilities and Jacobian entries are at most 1, so theirs is absolute)."""
    from transformer_lab.sampling import filter_logits
    from transformer_lab.softmax import log_softmax, softmax, softmax_jacobian

    gen = torch.Generator().manual_seed(seed)
    n = 4
    z = torch.randn(n, generator=gen, dtype=torch.float64) * 3
    der = softmax_jacobian_derivation(n)
    sym_p = torch.tensor(sp.lambdify([der["z"]], der["p"], "numpy")(z.tolist()), dtype=torch.float64).reshape(-1)
    sym_J = torch.tensor(sp.lambdify([der["z"]], der["J"], "numpy")(z.tolist()), dtype=torch.float64)
    ours_p = softmax(z)
    out = {
        "softmax: sympy vs ours": _relative(sym_p, ours_p),
        "softmax: ours vs F.softmax": _relative(ours_p, F.softmax(z, -1)),
        "log_softmax: ours vs F.log_softmax": _relative(log_softmax(z), F.log_softmax(z, -1)),
        "jacobian: sympy vs diag(p) - ppᵀ (ours)": _relative(sym_J, softmax_jacobian(ours_p)),
        "jacobian: ours vs torch.func.jacrev(F.softmax)":
            _relative(softmax_jacobian(ours_p), torch.func.jacrev(lambda t: F.softmax(t, -1))(z)),
        "shift invariance: softmax(z + 1000) vs softmax(z)": _relative(softmax(z + 1000), ours_p),
    }
    lim = temperature_limits()
    f = sp.lambdify([lim["tau"], lim["a"], lim["b"]], lim["p"], "numpy")
    zz = torch.tensor([1.5, 0.25, -0.5], dtype=torch.float64)
    worst = 0.0
    for tau in (0.05, 0.5, 1.0, 4.0, 100.0):
        sym = torch.tensor(f(tau, float(zz[0] - zz[1]), float(zz[0] - zz[2])), dtype=torch.float64).reshape(-1)
        worst = max(worst, _relative(sym, softmax(filter_logits(zz, temperature=tau))))
    out["temperature: sympy vs ours (τ = 0.05 … 100)"] = worst
    # τ → ∞ is approached, not reached: at τ = 10⁶ the distance to uniform is the first-order term (see the chapter)
    out["τ = 10⁶ vs uniform"] = _relative(softmax(zz / 1e6), torch.full((3,), 1 / 3, dtype=torch.float64))
    # the chain rule on a random joint over 2^3 sequences, with conditionals computed by counting marginals
    joint = torch.rand(2, 2, 2, generator=gen, dtype=torch.float64)
    joint = joint / joint.sum()
    p1 = joint.sum((1, 2))
    p2 = joint.sum(2) / p1[:, None]
    p3 = joint / joint.sum(2, keepdim=True)
    prod = p1[:, None, None] * p2[:, :, None] * p3
    out["chain rule: product of conditionals vs joint"] = _relative(prod, joint)
    ce = -log_softmax(z)[2]
    out["cross-entropy: -log_softmax(z)[y] vs F.cross_entropy"] = _relative(
        ce, F.cross_entropy(z[None], torch.tensor([2])))
    return out
