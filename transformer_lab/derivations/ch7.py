"""Chapter 7 (numerical analysis), derived with SymPy.

* :func:`dot_product_variance` -- ``Var(q . k) = d_k sigma_q^2 sigma_k^2``, hence the factor ``1/sqrt(d_k)``;
* :func:`logsumexp_shift` -- ``log sum e^{z_i} = m + log sum e^{z_i - m}`` for any ``m``, and its gradient;
* :func:`layer_norm_properties` -- LayerNorm's normalised value ``\\hat x`` (before ``gamma`` and ``beta``) has
  mean 0 and variance ``sigma^2 / (sigma^2 + eps)``, and is invariant to the input's scale and shift (at ``eps = 0``);
* :func:`layer_norm_jacobian` -- ``d\\hat x/dx = r (I - 11^T/C - \\hat x \\hat x^T / C)`` for ``C = n`` features
  (with ``gamma``, ``dy/dx = diag(gamma) d\\hat x/dx``), the backward pass the fast version writes by hand.

:func:`check` lambdifies the results and returns the largest disagreements with ``transformer_lab`` and PyTorch.
"""

from __future__ import annotations

import numpy as np
import sympy as sp
import torch

__all__ = ["check", "dot_product_variance", "layer_norm_expr", "layer_norm_jacobian", "layer_norm_properties",
           "logsumexp_shift"]


# ---------------------------------------------------------------- Var(q . k) = d_k
def dot_product_variance() -> dict[str, sp.Expr]:
    """The variance of an attention score ``s = sum_{i=1}^{d_k} q_i k_i``, all entries independent, mean 0.

    Steps: one term's mean and variance (SymPy's probability module integrates over two normals); the
    covariance of two different terms (four normals) is 0, so variances add; then the scaled score.
    """
    from sympy.stats import E, Normal, variance

    sq, sk = sp.symbols("sigma_q sigma_k", positive=True)
    d_k = sp.Symbol("d_k", integer=True, positive=True)
    i = sp.Symbol("i", integer=True, positive=True)
    q1, k1 = Normal("q_1", 0, sq), Normal("k_1", 0, sk)
    q2, k2 = Normal("q_2", 0, sq), Normal("k_2", 0, sk)
    term_mean = E(q1 * k1)  # E[q_i k_i] = E[q_i] E[k_i] = 0
    term_var = sp.simplify(variance(q1 * k1))  # E[q_i^2 k_i^2] - 0 = sigma_q^2 sigma_k^2
    cross = sp.simplify(E(q1 * k1 * q2 * k2) - E(q1 * k1) * E(q2 * k2))  # Cov(q_1 k_1, q_2 k_2) = 0
    total = sp.Sum(term_var, (i, 1, d_k)).doit()  # Var(sum) = sum of Var when covariances vanish
    scaled = sp.simplify(total / sp.sqrt(d_k) ** 2)  # Var(s / sqrt(d_k)) = Var(s) / d_k
    return {"term_mean": term_mean, "term_variance": term_var, "covariance_of_two_terms": cross,
            "variance": total, "scaled_variance": scaled,
            "unit_variance": total.subs({sq: 1, sk: 1}), "unit_scaled_variance": scaled.subs({sq: 1, sk: 1}),
            "symbols": (d_k, sq, sk)}


# ---------------------------------------------------------------- log-sum-exp
def logsumexp_shift(n: int = 3) -> dict[str, sp.Expr]:
    """``LSE(z) = log sum_i e^{z_i}`` equals ``m + log sum_i e^{z_i - m}`` for every real ``m``.

    Returns the two sides, the factored intermediate step, their difference (simplified to 0), the
    derivative of the shifted form with respect to ``m`` (0: the shift is a constant for the gradient) and
    the gradient with respect to ``z`` (softmax).
    """
    z = sp.symbols(f"z_1:{n + 1}", real=True)
    m = sp.Symbol("m", real=True)
    lhs = sp.log(sum(sp.exp(zi) for zi in z))
    rhs = m + sp.log(sum(sp.exp(zi - m) for zi in z))
    factored = m + sp.log(sp.exp(-m) * sum(sp.exp(zi) for zi in z))  # e^{z_i - m} = e^{-m} e^{z_i}
    split = sp.expand_log(sp.log(sp.exp(-m) * sum(sp.exp(zi) for zi in z)), force=True)  # log(e^{-m} S) = -m + log S
    difference = sp.simplify(sp.expand_log(sp.powsimp(sp.expand(rhs - lhs)), force=True))
    d_dm = sp.simplify(sp.diff(rhs, m))
    grad = [sp.simplify(sp.diff(lhs, zi)) for zi in z]
    return {"z": z, "m": m, "lhs": lhs, "rhs": rhs, "factored": factored, "split": split,
            "difference": difference, "d_rhs_dm": d_dm, "gradient": grad}


# ---------------------------------------------------------------- LayerNorm
def layer_norm_expr(n: int = 4):
    """Symbols and the LayerNorm output ``y_i = (x_i - mu) / sqrt(sigma^2 + eps) * gamma_i + beta_i`` for ``n``
    features. Returns ``(x, gamma, beta, eps, y)`` with ``y`` a list of ``n`` expressions."""
    x = sp.symbols(f"x_1:{n + 1}", real=True)
    gamma = sp.symbols(f"gamma_1:{n + 1}", real=True)
    beta = sp.symbols(f"beta_1:{n + 1}", real=True)
    eps = sp.Symbol("epsilon", nonnegative=True)
    mu = sum(x) / n  # mu = (1/n) sum x_i
    var = sum((xi - mu) ** 2 for xi in x) / n  # sigma^2 = (1/n) sum (x_i - mu)^2
    y = [(xi - mu) / sp.sqrt(var + eps) * g + b for xi, g, b in zip(x, gamma, beta, strict=True)]
    return x, gamma, beta, eps, y


def layer_norm_properties(n: int = 4) -> dict[str, sp.Expr]:
    """The normalised part ``\\hat x`` (gamma = 1, beta = 0) has mean 0 and variance ``sigma^2 / (sigma^2 + eps)``
    (exactly 1 when eps = 0), and ``\\hat x(a x + c) = \\hat x(x)`` for ``a > 0`` when eps = 0. With eps > 0 the
    invariance is only approximate: ``\\hat x_eps(a x + c) = \\hat x_{eps / a^2}(x)``, i.e. scaling the input by
    ``a`` is the same as dividing eps by ``a^2`` (``scale_eps_difference`` is 0; ``scale_difference_eps`` is the
    non-zero change at fixed eps)."""
    x, gamma, beta, eps, y = layer_norm_expr(n)
    xhat = [yi.subs({**{g: 1 for g in gamma}, **{b: 0 for b in beta}}) for yi in y]
    mu = sum(x) / n
    var = sum((xi - mu) ** 2 for xi in x) / n
    mean_out = sp.simplify(sum(xhat) / n)  # (1/n) sum \hat x_i
    var_out = sum(e**2 for e in xhat) / n  # (1/n) sum \hat x_i^2 (the mean is 0)
    ratio = sp.simplify(var_out * (var + eps) / var)  # = 1, i.e. Var(\hat x) = sigma^2 / (sigma^2 + eps)
    a, c = sp.Symbol("a", positive=True), sp.Symbol("c", real=True)
    xhat0 = [e.subs(eps, 0) for e in xhat]
    moved = [e.subs({xi: a * xi + c for xi in x}, simultaneous=True) for e in xhat0]
    moved_eps = [e.subs({xi: a * xi + c for xi in x}, simultaneous=True) for e in xhat]  # eps > 0 kept
    same_as_smaller_eps = [e.subs(eps, eps / a**2) for e in xhat]  # \hat x with eps / a^2
    return {"xhat": xhat, "mean": mean_out, "variance_ratio": ratio,
            "scale_eps_difference": [sp.simplify(mv - e) for mv, e in zip(moved_eps, same_as_smaller_eps, strict=True)],
            "scale_difference_eps": sp.simplify(moved_eps[0] - xhat[0]),
            "variance_eps0": sp.simplify(var_out.subs(eps, 0)),
            "scale_shift_difference": [sp.simplify(mv - e) for mv, e in zip(moved, xhat0, strict=True)],
            "symbols": (x, eps, a, c)}


def layer_norm_jacobian(n: int = 3) -> dict[str, sp.Matrix]:
    """``J = d\\hat x / dx`` by brute-force differentiation, and the closed form ``r (I - 11^T/C - \\hat x \\hat x^T/C)``
    (``C = n`` features) with ``r = 1/sqrt(sigma^2 + eps)``; their difference simplifies to the zero matrix. Also
    ``J x = 0`` at eps = 0: the gradient of a scale-invariant function is orthogonal to its input."""
    x, gamma, beta, eps, y = layer_norm_expr(n)
    unit = {**{g: 1 for g in gamma}, **{b: 0 for b in beta}}
    xhat = sp.Matrix([yi.subs(unit) for yi in y])
    J = xhat.jacobian(sp.Matrix(x))
    mu = sum(x) / n
    r = 1 / sp.sqrt(sum((xi - mu) ** 2 for xi in x) / n + eps)
    closed = r * (sp.eye(n) - sp.ones(n, n) / n - xhat * xhat.T / n)
    diff = sp.simplify(J - closed)
    Jx = sp.simplify((J * sp.Matrix(x)).subs(eps, 0))
    return {"x": x, "eps": eps, "jacobian": J, "closed_form": closed, "difference": diff, "J_times_x_eps0": Jx}


# ---------------------------------------------------------------- agreement
def check(seed: int = 0) -> dict[str, float]:
    """Largest disagreements (float64, random inputs) between the SymPy results lambdified, ours
    (``transformer_lab``) and PyTorch's built-ins: absolute, except that the LayerNorm ones are divided by the
    largest entry of what they compare when it is above 1 (the Jacobian's entries grow like 1/σ, the gradient with
    respect to γ sums the rows); ``dot_variance_rel_mc`` is a relative Monte-Carlo error."""
    from transformer_lab.norm import layer_norm
    from transformer_lab.numerics import logsumexp

    gen = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    out: dict[str, float] = {}
    n = 5
    x, gamma, beta, eps, y = layer_norm_expr(n)
    f = sp.lambdify([x, gamma, beta, eps], y, "numpy")
    X = torch.randn(64, n, generator=gen, dtype=torch.float64) * 3 + 1
    G, B = torch.randn(n, generator=gen, dtype=torch.float64), torch.randn(n, generator=gen, dtype=torch.float64)
    sym = torch.tensor(np.array([f(row, G.numpy(), B.numpy(), 1e-5) for row in X.numpy()]))
    ours = layer_norm(X, G, B, 1e-5)
    ref = torch.nn.functional.layer_norm(X, (n,), G, B, 1e-5)
    size = max(1.0, ref.abs().max().item())  # outputs γ x̂ + β of size up to a few
    out["layer_norm_sympy_vs_ours"] = (sym - ours).abs().max().item() / size
    out["layer_norm_ours_vs_torch"] = (ours - ref).abs().max().item() / size
    # Jacobian: closed form lambdified vs autograd through ours
    jac = layer_norm_jacobian(3)
    fj = sp.lambdify([jac["x"], jac["eps"]], jac["closed_form"], "numpy")
    worst = 0.0
    for row in torch.randn(8, 3, generator=gen, dtype=torch.float64):
        auto = torch.autograd.functional.jacobian(lambda v: layer_norm(v, eps=1e-5), row)
        scale = max(1.0, float(auto.abs().max()))  # the entries grow like 1/σ: a row of three can have a small σ
        worst = max(worst, float(np.abs(np.array(fj(row.numpy(), 1e-5), dtype=float) - auto.numpy()).max()) / scale)
    out["layer_norm_jacobian_sympy_vs_ours"] = worst
    # gradients: ours vs nn.LayerNorm
    Xg = X.clone().requires_grad_()
    Gg, Bg = G.clone().requires_grad_(), B.clone().requires_grad_()
    up = torch.randn(64, n, generator=gen, dtype=torch.float64)
    g_ours = torch.autograd.grad(layer_norm(Xg, Gg, Bg), (Xg, Gg, Bg), up)
    g_ref = torch.autograd.grad(torch.nn.functional.layer_norm(Xg, (n,), Gg, Bg), (Xg, Gg, Bg), up)
    out["layer_norm_grad_ours_vs_torch"] = max((a - b).abs().max().item() / max(1.0, b.abs().max().item())
                                               for a, b in zip(g_ours, g_ref, strict=True))  # ∂L/∂γ sums 64 rows
    # log-sum-exp: lambdified unshifted formula (moderate z) vs ours vs torch
    lse = logsumexp_shift(4)
    fl = sp.lambdify([lse["z"]], lse["lhs"], "numpy")
    Z = torch.randn(32, 4, generator=gen, dtype=torch.float64) * 5
    sym = torch.tensor([fl(row) for row in Z.numpy()])
    out["logsumexp_sympy_vs_ours"] = (sym - logsumexp(Z)).abs().max().item()
    Zbig = Z * 200  # |z| up to ~ 5000: exp overflows float64, the shifted form does not
    out["logsumexp_ours_vs_torch_huge"] = (logsumexp(Zbig) - torch.logsumexp(Zbig, -1)).abs().max().item()
    Zg = Z.clone().requires_grad_()
    ga = torch.autograd.grad(logsumexp(Zg).sum(), Zg)[0]
    gb = torch.autograd.grad(torch.logsumexp(Zg, -1).sum(), Zg)[0]
    out["logsumexp_grad_ours_vs_torch"] = (ga - gb).abs().max().item()
    # Var(q . k) = d_k against simulation
    dv = dot_product_variance()
    d_k_sym = dv["symbols"][0]
    worst = 0.0
    for d_k in (4, 16, 64):
        q, k = rng.standard_normal((50_000, d_k)), rng.standard_normal((50_000, d_k))
        predicted = float(dv["unit_variance"].subs(d_k_sym, d_k))
        worst = max(worst, float(abs(np.einsum("ij,ij->i", q, k).var() / predicted - 1)))
    out["dot_variance_rel_mc"] = worst
    return out
