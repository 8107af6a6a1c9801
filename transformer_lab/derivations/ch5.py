"""Chapter 5 (information theory) derivations in SymPy.

Each function returns SymPy objects (mostly a list of ``(step, expression)`` pairs, the steps a textbook does by
hand) ending in the form ``transformer_lab.information`` implements. :func:`check` lambdifies the results and
compares them with our code and with PyTorch (``F.cross_entropy``, ``F.kl_div``) in float64.
"""

from __future__ import annotations

import numpy as np
import sympy as sp
import torch
import torch.nn.functional as F

from transformer_lab import information as info


def distributions(n: int = 3):
    """Symbols p_1 … p_n and q_1 … q_n, positive (the probabilities of n outcomes under p and under q)."""
    p = sp.symbols(f"p_1:{n + 1}", positive=True)
    q = sp.symbols(f"q_1:{n + 1}", positive=True)
    return p, q


def entropy_expr(p) -> sp.Expr:
    """H(p) = -Σ p_i log p_i."""
    return -sum(pi * sp.log(pi) for pi in p)


def cross_entropy_expr(p, q) -> sp.Expr:
    """H(p, q) = -Σ p_i log q_i."""
    return -sum(pi * sp.log(qi) for pi, qi in zip(p, q, strict=True))


def kl_expr(p, q) -> sp.Expr:
    """KL(p ‖ q) = Σ p_i log(p_i / q_i)."""
    return sum(pi * sp.log(pi / qi) for pi, qi in zip(p, q, strict=True))


def cross_entropy_decomposition(n: int = 3) -> list[tuple[str, sp.Expr]]:
    """H(p, q) = H(p) + KL(p ‖ q): expand the logs of the KL term and the difference vanishes."""
    p, q = distributions(n)
    H_pq, H_p, KL = cross_entropy_expr(p, q), entropy_expr(p), kl_expr(p, q)
    KL_expanded = sp.expand(sp.expand_log(KL, force=True))  # log(p/q) = log p - log q
    return [
        ("H(p, q)", H_pq),
        ("H(p)", H_p),
        ("KL(p‖q)", KL),
        ("KL(p‖q), logs expanded", KL_expanded),
        ("H(p) + KL(p‖q)", sp.expand(H_p + KL_expanded)),
        ("H(p, q) - [H(p) + KL(p‖q)]", sp.simplify(H_pq - H_p - KL_expanded)),
    ]


def gibbs_inequality() -> list[tuple[str, sp.Expr]]:
    """KL(p ‖ q) ≥ 0 from log x ≤ x - 1.

    f(x) = x - 1 - log x ≥ 0 with equality only at x = 1 (calculus). Term by term, for any p_i, q_i > 0,
    p_i log(p_i / q_i) = p_i f(q_i / p_i) - (q_i - p_i); summed, KL(p ‖ q) = Σ_i p_i f(q_i / p_i) - (Σ q - Σ p),
    and Σ q = Σ p = 1 leaves a sum of non-negative terms.
    """
    x = sp.symbols("x", positive=True)
    p_i, q_i = sp.symbols("p_i q_i", positive=True)
    f = x - 1 - sp.log(x)
    crit = sp.solve(sp.diff(f, x), x)
    term = p_i * sp.log(p_i / q_i)  # one term of KL(p ‖ q)
    key = p_i * f.subs(x, q_i / p_i) - (q_i - p_i)
    p, q = distributions(3)
    on_simplex = {q[-1]: 1 - sum(q[:-1]), p[-1]: 1 - sum(p[:-1])}
    return [
        ("f(x) = x - 1 - log x", f),
        ("f'(x)", sp.diff(f, x)),
        ("critical points", sp.FiniteSet(*crit)),
        ("f''(x)", sp.diff(f, x, 2)),
        ("f''(x) > 0  (True: x is declared positive; f is convex)", sp.diff(f, x, 2) > 0),
        ("f(1)", f.subs(x, 1)),
        ("one KL term, p_i log(p_i/q_i)", term),
        ("p_i f(q_i/p_i) - (q_i - p_i)", key),
        ("difference of the two", sp.simplify(sp.expand_log(term - key, force=True))),
        ("Σ_i (q_i - p_i) for two distributions (n = 3, Σ = 1)", sp.expand(sum(q) - sum(p)).subs(on_simplex)),
    ]


def cross_entropy_minimum(n: int = 3) -> list[tuple[str, sp.Expr]]:
    """Minimise H(p, q) over q with Σ q = 1 (Lagrange): the unique stationary point is q = p, a minimum.

    The last two steps substitute the *derived* stationary point into q - p and H(p, q) - H(p), with Σ p = 1.
    """
    p, q = distributions(n)
    lam = sp.symbols("lambda", positive=True)
    lagrangian = cross_entropy_expr(p, q) + lam * (sum(q) - 1)
    grad = [sp.diff(lagrangian, qi) for qi in q]
    q_star = {qi: sp.solve(g, qi)[0] for qi, g in zip(q, grad, strict=True)}  # q_i = p_i / λ
    lam_star = sp.solve(sp.Eq(sum(q_star.values()), 1), lam)[0]  # λ = Σ p_i
    sol = {qi: v.subs(lam, lam_star) for qi, v in q_star.items()}  # q_i* = p_i / Σ p
    simplex = {p[-1]: 1 - sum(p[:-1])}  # Σ p = 1
    hessian = sp.hessian(cross_entropy_expr(p, q), q)
    at_star = (cross_entropy_expr(p, q).subs(sol) - entropy_expr(p)).subs(simplex)
    return [
        ("Lagrangian", lagrangian),
        ("∂/∂q_i = 0", sp.Matrix(grad)),
        ("q_i =", sp.Matrix(list(q_star.values()))),
        ("λ (from Σ q = 1)", lam_star),
        ("q* - p (with Σ p = 1)", sp.simplify(sp.Matrix([sol[qi] - pi for qi, pi in zip(q, p, strict=True)])
                                              .subs(simplex))),
        ("Hessian of H(p, q) in q", hessian),
        ("Hessian diagonal p_i/q_i^2 > 0  (True: p_i, q_i declared positive)",
         sp.And(*[hessian[i, i] > 0 for i in range(n)])),
        ("H(p, q*) - H(p) (with Σ p = 1)", sp.simplify(sp.expand_log(at_star, force=True))),
    ]


def nats_and_bits() -> list[tuple[str, sp.Expr]]:
    """log₂ x = ln x / ln 2, so an entropy or a loss in bits is the one in nats divided by ln 2."""
    x = sp.symbols("x", positive=True)
    p, _ = distributions(2)
    H_bits = -sum(pi * sp.log(pi, 2) for pi in p)
    return [
        ("log_2 x", sp.log(x, 2)),
        ("H in bits", H_bits),
        ("H in bits · ln 2 - H in nats", sp.simplify(H_bits * sp.log(2) - entropy_expr(p))),
        ("1 nat in bits", 1 / sp.log(2)),
        ("… numerically", sp.N(1 / sp.log(2), 6)),
    ]


def softmax_cross_entropy(V: int = 3, target: int = 0) -> list[tuple[str, sp.Expr]]:
    """-log softmax(z)_y = LSE(z) - z_y, and LSE(z) = m + log Σ e^{z_j - m} for every m (the stable form)."""
    z = sp.symbols(f"z_1:{V + 1}", real=True)
    m = sp.symbols("m", real=True)
    softmax_y = sp.exp(z[target]) / sum(sp.exp(zj) for zj in z)
    nll = -sp.log(softmax_y)
    lse = sp.log(sum(sp.exp(zj) for zj in z))
    shifted = m + sp.log(sum(sp.exp(zj - m) for zj in z)) - z[target]
    grad = sp.Matrix([sp.simplify(sp.diff(nll, zj)) for zj in z])
    softmax = sp.Matrix([sp.exp(zi) / sum(sp.exp(zj) for zj in z) for zi in z])
    onehot = sp.Matrix([int(i == target) for i in range(V)])
    return [
        ("softmax(z)_y", softmax_y),
        ("-log softmax(z)_y", nll),
        ("… logs expanded", sp.expand_log(nll, force=True)),
        ("= LSE(z) - z_y, difference", sp.simplify(sp.expand_log(nll, force=True) - (lse - z[target]))),
        ("shifted form, any m", shifted),
        ("shifted form at m = 0, minus (LSE(z) - z_y)", sp.simplify(shifted.subs(m, 0) - (lse - z[target]))),
        ("∂(shifted)/∂m  (independent of m: choose m = max z)", sp.simplify(sp.diff(shifted, m))),
        ("∂L/∂z", grad),
        ("∂L/∂z - (softmax(z) - onehot(y))", sp.simplify(grad - (softmax - onehot))),
    ]


def chain_rule_nll(T: int = 4) -> list[tuple[str, sp.Expr]]:
    """-log P(w_1 … w_T) = Σ_t -log P(w_t | w_<t): the summed per-token cross-entropy is the sequence NLL.

    With J_t = P(w_1 … w_t) (J_0 = 1) and the definition of conditional probability P(w_t | w_<t) = J_t / J_{t-1},
    the product of the conditionals telescopes to J_T (the chain rule), and the logarithm turns it into a sum.
    """
    J = sp.symbols(f"J_1:{T + 1}", positive=True)  # J_t = P(w_1 … w_t)
    prefix = (sp.Integer(1), *J)  # J_0 = 1
    cond = [prefix[t] / prefix[t - 1] for t in range(1, T + 1)]  # P(w_t | w_<t) = J_t / J_{t-1}
    product = sp.Mul(*cond, evaluate=False)
    nll_sum = sum(-sp.log(c) for c in cond)  # Σ_t of the per-token cross-entropy -log P(w_t | w_<t)
    return [
        ("P(w_t | w_<t) = J_t / J_{t-1}, t = 1 … T", sp.Matrix(cond)),
        ("Π_t P(w_t | w_<t)", product),
        ("Π_t P(w_t | w_<t) - P(w_1 … w_T)", sp.simplify(sp.Mul(*cond) - J[-1])),
        ("Σ_t -log P(w_t | w_<t)", nll_sum),
        ("Σ_t -log P(w_t | w_<t) - [-log P(w_1 … w_T)]", sp.simplify(sp.expand_log(nll_sum + sp.log(J[-1]),
                                                                                       force=True))),
    ]


def mutual_information(nx: int = 2, ny: int = 2) -> list[tuple[str, sp.Expr]]:
    """I(X; Y) = KL(p(x, y) ‖ p(x) p(y)) = H(Y) - H(Y | X) on a joint table of general positive entries.

    p_ij = P(X = i, Y = j); the marginals are row and column sums; the identity needs no normalisation.
    """
    P = sp.Matrix(nx, ny, lambda i, j: sp.Symbol(f"p_{i + 1}{j + 1}", positive=True))
    px = [sum(P[i, :]) for i in range(nx)]  # P(X = i)
    py = [sum(P[:, j]) for j in range(ny)]  # P(Y = j)
    cells = [(i, j) for i in range(nx) for j in range(ny)]
    mi = sum(P[i, j] * sp.log(P[i, j] / (px[i] * py[j])) for i, j in cells)
    H_y = -sum(py[j] * sp.log(py[j]) for j in range(ny))
    H_y_given_x = -sum(P[i, j] * sp.log(P[i, j] / px[i]) for i, j in cells)  # -Σ p(x, y) log p(y | x)
    return [
        ("joint p(x, y)", P),
        ("I(X; Y) = KL(p(x, y) ‖ p(x) p(y))", mi),
        ("H(Y | X) = -Σ p(x, y) log p(y | x)", H_y_given_x),
        ("I(X; Y) - [H(Y) - H(Y | X)]", sp.simplify(sp.expand(sp.expand_log(mi - H_y + H_y_given_x, force=True)))),
    ]


def label_smoothing(n: int = 3) -> list[tuple[str, sp.Expr]]:
    """Label smoothing adds ε H(u, q) = ε [log n + KL(u ‖ q)]; the confidence penalty -β H(q) = β [KL(q ‖ u) - log n].

    Smoothed target t = (1 - ε) onehot(y) + ε u, u uniform over n classes: H(t, q) = (1 - ε) H(onehot, q) + ε H(u, q).
    """
    _, q = distributions(n)
    eps = sp.symbols("epsilon", positive=True)
    u = [sp.Integer(1) / n] * n
    onehot = [sp.Integer(1)] + [sp.Integer(0)] * (n - 1)  # the target is class 1
    target = [(1 - eps) * o + eps * ui for o, ui in zip(onehot, u, strict=True)]
    smoothed = cross_entropy_expr(target, q)
    split = (1 - eps) * cross_entropy_expr(onehot, q) + eps * cross_entropy_expr(u, q)
    simplex = {q[-1]: 1 - sum(q[:-1])}
    return [
        ("H((1-ε) onehot + ε u, q) - [(1-ε) H(onehot, q) + ε H(u, q)]", sp.simplify(smoothed - split)),
        ("H(u, q) - [log n + KL(u ‖ q)]", sp.simplify(sp.expand_log(cross_entropy_expr(u, q) - sp.log(n)
                                                                     - kl_expr(u, q), force=True))),
        ("-H(q) - [KL(q ‖ u) - log n]  (Σ q = 1)", sp.simplify(sp.expand_log(
            (-entropy_expr(q) - kl_expr(q, u) + sp.log(n)).subs(simplex), force=True))),
    ]


def softmax_maximum_entropy(n: int = 3) -> list[tuple[str, sp.Expr]]:
    """The precise "entropy maximisation": softmax(z) maximises H(p) + Σ p_i z_i over distributions p."""
    p = sp.symbols(f"p_1:{n + 1}", positive=True)
    z = sp.symbols(f"z_1:{n + 1}", real=True)
    lam = sp.symbols("lambda", real=True)
    objective = entropy_expr(p) + sum(pi * zi for pi, zi in zip(p, z, strict=True))
    lagrangian = objective + lam * (1 - sum(p))
    p_of_lam = {pi: sp.solve(sp.diff(lagrangian, pi), pi)[0] for pi in p}  # p_i = e^{z_i - λ - 1}
    lam_star = sp.solve(sp.Eq(sum(p_of_lam.values()), 1), lam)[0]
    p_star = sp.Matrix([sp.simplify(v.subs(lam, lam_star)) for v in p_of_lam.values()])
    softmax = sp.Matrix([sp.exp(zi) / sum(sp.exp(zj) for zj in z) for zi in z])
    return [
        ("objective H(p) + Σ p_i z_i", objective),
        ("Lagrangian", lagrangian),
        ("∂/∂p_i = 0  ⇒  p_i =", sp.Matrix(list(p_of_lam.values()))),
        ("λ (from Σ p = 1)", sp.simplify(lam_star)),
        ("p*", p_star),
        ("p* - softmax(z)", sp.simplify(p_star - softmax)),
        ("Hessian of the objective", sp.hessian(objective, p)),
        ("Hessian diagonal -1/p_i < 0  (True: p_i declared positive)",
         sp.And(*[sp.hessian(objective, p)[i, i] < 0 for i in range(n)])),
    ]


# ---------------------------------------------------------------- numerical agreement
def _lambdified_ce(V: int):
    """Lambdified stable CE for each target y: f_y(z_1 … z_V, m), and the gradient expressions."""
    z = sp.symbols(f"z_1:{V + 1}", real=True)
    m = sp.symbols("m", real=True)
    fs, grads = [], []
    for y in range(V):
        shifted = m + sp.log(sum(sp.exp(zj - m) for zj in z)) - z[y]
        fs.append(sp.lambdify((*z, m), shifted, "numpy"))
        grads.append(sp.lambdify((*z, m), [sp.diff(shifted, zj) for zj in z], "numpy"))
    return fs, grads


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    """The largest |a - b| / max(1, |b|): a difference relative to the size of the value compared (absolute for
    values below 1), so that rounding reads the same for a loss of 3 and a loss of 3e4."""
    return ((a - b).abs() / b.abs().clamp(min=1.0)).max().item()


def check(seed: int = 0) -> dict[str, float]:
    """Largest relative difference, |a - b| / max(1, |b|), between the SymPy results (lambdified), ours and
    PyTorch, float64, random inputs.

    The Gibbs row is the size of the most negative divergence found (0 if none is negative), an absolute
    number, over the random pairs and over pairs with q close to p. For the "extreme logits" rows (std 1e4),
    e^{10^4} overflows, so SymPy's side evaluates the same shifted formula there: not an independent route. The
    "offset logits" reach SymPy minus the offset, which is exact in float64.
    """
    gen = torch.Generator().manual_seed(seed)
    n, N = 5, 64
    p = torch.softmax(torch.randn(N, n, generator=gen, dtype=torch.float64) * 2, dim=-1)
    q = torch.softmax(torch.randn(N, n, generator=gen, dtype=torch.float64) * 2, dim=-1)
    ps, qs = distributions(n)
    H_pq = sp.lambdify((*ps, *qs), cross_entropy_expr(ps, qs), "numpy")
    H_p = sp.lambdify(ps, entropy_expr(ps), "numpy")
    KL = sp.lambdify((*ps, *qs), kl_expr(ps, qs), "numpy")
    sym_hpq = torch.from_numpy(np.asarray(H_pq(*p.T.numpy(), *q.T.numpy())))
    sym_kl = torch.from_numpy(np.asarray(KL(*p.T.numpy(), *q.T.numpy())))
    sym_hp = torch.from_numpy(np.asarray(H_p(*p.T.numpy())))
    ours_hpq = info.distribution_cross_entropy(p, q)
    torch_hpq = F.cross_entropy(q.log(), p, reduction="none")  # soft targets: -Σ p log softmax(log q)
    torch_kl = F.kl_div(q.log(), p, reduction="none").sum(-1)
    # Gibbs: the random pairs plus near pairs q = p(1 + 1e-4 noise), renormalised, where KL ~ 1e-9 is small
    # enough that a sign error or a rounding-sized slip would show (own generator: the other rows keep theirs)
    noise = torch.randn(N, n, generator=torch.Generator().manual_seed(seed + 1), dtype=torch.float64)
    q_near = p * (1 + 1e-4 * noise)
    p_gibbs, q_gibbs = torch.cat([p, p]), torch.cat([q, q_near / q_near.sum(-1, keepdim=True)])
    out = {
        "H(p,q): sympy vs ours": _relative(sym_hpq, ours_hpq),
        "H(p,q): ours vs F.cross_entropy(soft)": _relative(ours_hpq, torch_hpq),
        "H(p,q) - H(p) - KL: ours": _relative(ours_hpq, info.entropy(p) + info.kl_divergence(p, q)),
        "H(p): sympy vs ours": _relative(sym_hp, info.entropy(p)),
        "KL: sympy vs ours": _relative(sym_kl, info.kl_divergence(p, q)),
        "KL: ours vs F.kl_div": _relative(info.kl_divergence(p, q), torch_kl),
        "Gibbs: largest negative KL (absolute)": max(0.0, -info.kl_divergence(p_gibbs, q_gibbs).min().item()),
    }
    # cross-entropy from logits, ordinary (std 3), extreme (std 1e4) and offset logits: values and gradients.
    # Offset: std 3 around a common 1e4, with a constant row and a near-tie row; SymPy's side is evaluated on
    # z - 1e4, which is exact in float64 (Sterbenz: z and 1e4 lie within a factor 2), so it does not share the
    # rounding of large numbers that the offset would cause
    V = 6
    fs, grads = _lambdified_ce(V)
    for label, scale in (("logits", 3.0), ("extreme logits", 1e4), ("offset logits", 3.0)):
        z = torch.randn(N, V, generator=gen, dtype=torch.float64) * scale
        offset = 1e4 if label == "offset logits" else 0.0
        if offset:
            z[0] = 0.0  # a constant row: the loss is exactly log V
            z[1] = torch.tensor([0.0, -0.5, -1.0, -1e-3, -0.5 - 1e-3, -2.0], dtype=torch.float64)  # near-ties
        z = (z + offset).requires_grad_(True)
        y = torch.randint(0, V, (N,), generator=gen)
        zn, m = z.detach().numpy() - offset, z.detach().amax(-1).numpy() - offset
        sym = torch.tensor([fs[t](*zn[i], m[i]) for i, t in enumerate(y.tolist())], dtype=torch.float64)
        sym_g = torch.tensor([grads[t](*zn[i], m[i]) for i, t in enumerate(y.tolist())], dtype=torch.float64) / N
        ours = info.cross_entropy(z, y, reduction="none")
        (g_ours,) = torch.autograd.grad(ours.mean(), z)
        ref = F.cross_entropy(z, y, reduction="none")
        (g_ref,) = torch.autograd.grad(ref.mean(), z)
        out[f"CE {label}: sympy vs ours"] = _relative(sym, ours.detach())
        out[f"CE {label}: ours vs F.cross_entropy"] = _relative(ours.detach(), ref.detach())
        out[f"dCE/dz {label}: sympy vs ours"] = _relative(sym_g, g_ours)
        out[f"dCE/dz {label}: ours vs torch"] = _relative(g_ours, g_ref)
    return out
