"""Chapter 4 (calculus): the gradients of backpropagation, derived with SymPy.

Each function returns a dict of named SymPy expressions (cached: treat it as read-only), the steps a textbook
does by hand, ending in the form :mod:`transformer_lab.backprop` implements. :func:`check` lambdifies them and
compares with our backward passes and with ``torch.autograd``.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import sympy as sp
import torch
import torch.nn.functional as F

x = sp.Symbol("x", real=True)
_NUMPY = [{"erf": np.vectorize(math.erf)}, "numpy"]  # numpy has no erf (and scipy is not a dependency)


@functools.cache
def gelu_exact_derivative() -> dict[str, sp.Expr]:
    """GELU(x) = x Φ(x) ⇒ GELU′(x) = Φ(x) + x φ(x) (product rule, Φ′ = φ)."""
    Phi = (1 + sp.erf(x / sp.sqrt(2))) / 2  # standard normal CDF
    phi = sp.exp(-x**2 / 2) / sp.sqrt(2 * sp.pi)  # standard normal density
    gelu = x * Phi
    derivative = sp.diff(gelu, x)
    closed_form = Phi + x * phi
    return {"Phi": Phi, "phi": phi, "gelu": gelu, "derivative": derivative, "closed_form": closed_form,
            "difference": sp.simplify(derivative - closed_form), "at_zero": derivative.subs(x, 0)}


@functools.cache
def gelu_slope_shape() -> dict[str, object]:
    """The shape of GELU′: GELU″ = φ(x)(2 − x²), so GELU′ peaks at x = √2; GELU′(x) + GELU′(−x) = 1 (since
    Φ(x) + Φ(−x) = 1 and φ is even); GELU′ → 1 as x → ∞. ``crossing`` (GELU′ = 1, x > 0) is found with ``nsolve``
    (30 digits), and by the symmetry −``crossing`` is where GELU′ = 0, GELU's minimum. ``increasing_on`` and
    ``decreasing_on`` are where GELU″ > 0 and < 0 (``solveset``): GELU′ rises on (−√2, √2) and falls beyond √2."""
    d = gelu_exact_derivative()
    second = sp.factor(sp.simplify(sp.diff(d["derivative"], x)))
    critical = sp.solve(second, x)
    peak_x = max(critical)
    crossing = sp.nsolve(d["derivative"] - 1, x, 0.75, prec=30)
    return {"second": second, "second_difference": sp.simplify(second - d["phi"] * (2 - x**2)),
            "increasing_on": sp.solveset(second > 0, x, sp.Reals), "decreasing_on": sp.solveset(second < 0, x, sp.Reals),
            "critical": critical, "peak_x": peak_x, "peak": d["derivative"].subs(x, peak_x),
            "symmetry": sp.simplify(d["derivative"] + d["derivative"].subs(x, -x)),
            "limit": sp.limit(d["derivative"], x, sp.oo), "crossing": crossing,
            "minimum": d["gelu"].subs(x, -crossing).evalf(30)}


@functools.cache
def gelu_tanh_derivative() -> dict[str, sp.Expr]:
    """GELU_tanh(x) = ½ x (1 + tanh u), u = √(2/π)(x + 0.044715 x³) ⇒ ½(1 + tanh u) + ½ x (1 − tanh² u) u′."""
    c = sp.Rational(44715, 1000000)
    u = sp.sqrt(2 / sp.pi) * (x + c * x**3)
    gelu = x * (1 + sp.tanh(u)) / 2
    derivative = sp.diff(gelu, x)
    t = sp.tanh(u)
    closed_form = (1 + t) / 2 + x * (1 - t**2) * sp.diff(u, x) / 2
    return {"u": u, "gelu": gelu, "derivative": derivative, "closed_form": closed_form,
            "difference": sp.simplify(derivative - closed_form)}


@functools.cache
def relu_at_zero() -> dict[str, object]:
    """ReLU = max(0, x): one-sided derivatives 0 and 1 at 0, and its subdifferential there, derived.

    The subdifferential ∂f(0) is the set of slopes s with f(h) ≥ f(0) + s h for every h. For h > 0 (a positive
    symbol) the inequality solves to s ≤ 1, for h < 0 to s ≥ 0; ∂ReLU(0) is the intersection. SymPy's own
    derivative, Heaviside(x), takes the value ½ at 0: a convention of SymPy's, not a derivative.
    """
    h = sp.Symbol("h", real=True)
    relu = sp.Max(0, x)
    quotient = (relu.subs(x, h) - relu.subs(x, 0)) / h
    s = sp.Symbol("s", real=True)
    pos, neg = sp.Symbol("h", positive=True), sp.Symbol("h", negative=True)
    below = [sp.solveset(relu.subs(x, t) - relu.subs(x, 0) - s * t >= 0, s, sp.Reals) for t in (pos, neg)]
    derivative = sp.diff(relu, x)
    return {"relu": relu, "derivative": derivative, "sympy_at_zero": derivative.subs(x, 0),
            "right_derivative": sp.limit(quotient, h, 0, "+"), "left_derivative": sp.limit(quotient, h, 0, "-"),
            "from_right": below[0], "from_left": below[1], "subdifferential": sp.Intersection(*below)}


@functools.cache
def softmax_ce_gradient(n: int = 3) -> dict[str, object]:
    """L = −Σᵢ yᵢ log softmax(z)ᵢ ⇒ ∂L/∂zⱼ = pⱼ Σᵢ yᵢ − yⱼ = pⱼ − yⱼ (since Σ yᵢ = 1)."""
    z = sp.symbols(f"z0:{n}", real=True)
    y = sp.symbols(f"y0:{n}", real=True)
    denom = sum(sp.exp(zi) for zi in z)
    p = [sp.exp(zi) / denom for zi in z]
    loss = -sum(yi * sp.log(pi) for yi, pi in zip(y, p, strict=True))
    raw = [sp.simplify(sp.diff(loss, zj)) for zj in z]
    on_simplex = [sp.simplify(r.subs(y[-1], 1 - sum(y[:-1]))) for r in raw]  # use Σ yᵢ = 1
    target = [sp.simplify((pj - yj).subs(y[-1], 1 - sum(y[:-1]))) for pj, yj in zip(p, y, strict=True)]
    # the same by the vector chain rule through chapter 2's Jacobian: ∂L/∂z = Jᵀ ∂L/∂p, J = diag(p) − p pᵀ
    jac = sp.Matrix(n, n, lambda i, j: (p[i] if i == j else 0) - p[i] * p[j])
    via_jac = jac.T * sp.Matrix([-yi / pi for yi, pi in zip(y, p, strict=True)])  # ∂L/∂pᵢ = −yᵢ/pᵢ
    return {"z": z, "y": y, "p": p, "loss": loss, "gradient": raw,
            "difference": [sp.simplify(a - b) for a, b in zip(on_simplex, target, strict=True)],
            "jacobian": jac, "via_jacobian_difference": [sp.simplify(a - b) for a, b in zip(via_jac, raw, strict=True)]}


@functools.cache
def linear_gradient(n: int = 2, d_in: int = 3, d_out: int = 4) -> dict[str, object]:
    """Y = X Wᵀ + b on a batch, L = Σ_{n,k} G_{nk} Y_{nk} (G = ∂L/∂Y): differentiated entry by entry, ∂L/∂X = G W,
    ∂L/∂W = Gᵀ X, ∂L/∂b = Σ_n G_n· (``difference_*`` are zero matrices). An instance of the sizes (N, d_in, d_out)."""
    X = sp.Matrix(n, d_in, lambda i, j: sp.Symbol(f"X_{i}{j}", real=True))
    W = sp.Matrix(d_out, d_in, lambda i, j: sp.Symbol(f"W_{i}{j}", real=True))
    b = sp.Matrix(1, d_out, lambda _, j: sp.Symbol(f"b_{j}", real=True))
    G = sp.Matrix(n, d_out, lambda i, j: sp.Symbol(f"G_{i}{j}", real=True))
    Y = X * W.T + sp.ones(n, 1) * b
    loss = sum(G[i, k] * Y[i, k] for i in range(n) for k in range(d_out))
    direct = {"X": X.applyfunc(lambda e: sp.diff(loss, e)), "W": W.applyfunc(lambda e: sp.diff(loss, e)),
              "b": b.applyfunc(lambda e: sp.diff(loss, e))}
    chain = {"X": G * W, "W": G.T * X, "b": sp.ones(1, n) * G}
    return {"X": X, "W": W, "b": b, "G": G, "loss": loss, **{f"chain_{k}": v for k, v in chain.items()},
            **{f"difference_{k}": (direct[k] - chain[k]).applyfunc(sp.expand) for k in direct}}


@functools.cache
def layer_norm_gradient(n: int = 3) -> dict[str, object]:
    """∂x̂ᵢ/∂xⱼ = r (δᵢⱼ − 1/n − x̂ᵢ x̂ⱼ / n) with r = 1/√(σ² + ε); so ∂L/∂x = r (ĝ − mean ĝ − x̂ mean(ĝ x̂)).
    Also d/dc x̂(c x) at c = 1 equals ε r² x̂ (``scale_difference`` = 0): scale-invariant only at ε = 0, and there
    for every c > 0 (``scale_invariance_at_eps0`` = 0); for c < 0, x̂(c x) = −x̂(x) (``sign_flip_at_eps0`` = 0)."""
    xs = sp.symbols(f"x0:{n}", real=True)
    g = sp.symbols(f"g0:{n}", real=True)  # upstream gradient ĝ = ∂L/∂x̂
    eps = sp.Symbol("epsilon", positive=True)
    mu = sum(xs) / n
    var = sum((xi - mu) ** 2 for xi in xs) / n
    r = 1 / sp.sqrt(var + eps)
    xhat = [(xi - mu) * r for xi in xs]
    jac = sp.Matrix(n, n, lambda i, j: sp.diff(xhat[i], xs[j]))
    jac_form = sp.Matrix(n, n, lambda i, j: r * (sp.KroneckerDelta(i, j) - sp.Rational(1, n) - xhat[i] * xhat[j] / n))
    grad = jac.T * sp.Matrix(g)  # chain rule: ∂L/∂x = Jᵀ ĝ
    mean_g, mean_gx = sum(g) / n, sum(gi * xi for gi, xi in zip(g, xhat, strict=True)) / n
    grad_form = sp.Matrix([r * (g[j] - mean_g - xhat[j] * mean_gx) for j in range(n)])
    # ε > 0: the gradient is orthogonal to 1 but not to x̂: x̂ᵀ ∂L/∂x = ε r² · r ĝᵀx̂, since Σ x̂ⱼ² = C(1 − ε r²)
    along_xhat = sum(xh * gj for xh, gj in zip(xhat, grad, strict=True))
    along_ones = sum(grad)
    xhat_rhs = eps * r**2 * r * sum(gi * xh for gi, xh in zip(g, xhat, strict=True))
    # scale invariance only at ε = 0: d/dc LN(c x) at c = 1 equals ε r² x̂ (differentiate x̂ with x → c x)
    cs = sp.Symbol("c", positive=True)
    xhat_c = [xh.subs({xi: cs * xi for xi in xs}, simultaneous=True) for xh in xhat]
    scale = [sp.diff(xh, cs).subs(cs, 1) for xh in xhat_c]
    neg = sp.Symbol("c_neg", negative=True)
    at_eps0 = [xh.subs(eps, 0) for xh in xhat]
    invariance = [sp.simplify(xc.subs(eps, 0) - xh) for xc, xh in zip(xhat_c, at_eps0, strict=True)]
    flip = [sp.simplify(xc.subs({eps: 0, cs: neg}) + xh) for xc, xh in zip(xhat_c, at_eps0, strict=True)]
    return {"x": xs, "g": g, "eps": eps, "xhat": xhat, "r": r, "jacobian": jac, "jacobian_form": jac_form,
            "jacobian_difference": (jac - jac_form).applyfunc(sp.simplify), "gradient": grad,
            "gradient_form": grad_form, "gradient_difference": (grad - grad_form).applyfunc(sp.simplify),
            "along_ones": sp.simplify(along_ones), "along_xhat": along_xhat, "along_xhat_rhs": xhat_rhs,
            "along_xhat_difference": sp.simplify(along_xhat - xhat_rhs), "scale_derivative": scale,
            "scale_difference": [sp.simplify(a - eps * r**2 * xh) for a, xh in zip(scale, xhat, strict=True)],
            "scale_invariance_at_eps0": invariance, "sign_flip_at_eps0": flip}


@functools.cache
def mlp_chain_rule(d_model: int = 2, d_hidden: int = 2) -> dict[str, object]:
    """L = c · (W₂ f(W₁x + b₁) + b₂), f an undefined SymPy function: each of the five gradients, differentiated
    directly, equals its chain-rule form (δ = (W₂ᵀc) ⊙ f′(h)): ∂L/∂W₁ = δ xᵀ, ∂L/∂b₁ = δ, ∂L/∂x = W₁ᵀ δ,
    ∂L/∂W₂ = c f(h)ᵀ, ∂L/∂b₂ = c. An instance of the sizes (default 2 × 2), for every f."""
    f = sp.Function("f")
    W1 = sp.Matrix(d_hidden, d_model, lambda i, j: sp.Symbol(f"W1_{i}{j}", real=True))
    W2 = sp.Matrix(d_model, d_hidden, lambda i, j: sp.Symbol(f"W2_{i}{j}", real=True))
    b1 = sp.Matrix(d_hidden, 1, lambda i, _: sp.Symbol(f"b1_{i}", real=True))
    b2 = sp.Matrix(d_model, 1, lambda i, _: sp.Symbol(f"b2_{i}", real=True))
    xv = sp.Matrix(d_model, 1, lambda i, _: sp.Symbol(f"x_{i}", real=True))
    c = sp.Matrix(d_model, 1, lambda i, _: sp.Symbol(f"c_{i}", real=True))  # upstream ∂L/∂y
    h = W1 * xv + b1
    y = W2 * h.applyfunc(f) + b2
    loss = (c.T * y)[0]
    direct_W1 = sp.Matrix(d_hidden, d_model, lambda i, j: sp.diff(loss, W1[i, j]))
    direct_x = sp.Matrix(d_model, 1, lambda i, _: sp.diff(loss, xv[i]))
    s = sp.Symbol("s", real=True)
    fprime = h.applyfunc(lambda hi: sp.diff(f(s), s).subs(s, hi))  # f′(h) elementwise
    delta = (W2.T * c).multiply_elementwise(fprime)  # ∂L/∂h = (W₂ᵀ c) ⊙ f′(h)
    direct = {"W1": direct_W1, "x": direct_x,
              "b1": sp.Matrix(d_hidden, 1, lambda i, _: sp.diff(loss, b1[i])),
              "W2": sp.Matrix(d_model, d_hidden, lambda i, j: sp.diff(loss, W2[i, j])),
              "b2": sp.Matrix(d_model, 1, lambda i, _: sp.diff(loss, b2[i]))}
    chain = {"W1": delta * xv.T, "x": W1.T * delta, "b1": delta, "W2": c * h.applyfunc(f).T, "b2": c}
    return {"f": f, "W1": W1, "W2": W2, "b1": b1, "b2": b2, "x": xv, "c": c, "loss": loss, "delta": delta,
            "direct_W1": direct_W1, "direct_x": direct_x, **{f"chain_{k}": v for k, v in chain.items()},
            **{f"difference_{k}": (direct[k] - chain[k]).applyfunc(sp.simplify) for k in direct}}


def check(seed: int = 0, *, relative: bool = False) -> dict[str, float]:
    """Largest |difference| of each pair among SymPy (lambdified), ours and torch.autograd, float64, random inputs:
    three rows per piece (GELU exact, GELU tanh, linear, softmax + CE, LayerNorm, MLP block).

    With ``relative=True`` each difference is divided by the size of the numbers its formula combines (at least 1),
    so that every row measures float64 rounding whatever the draw: the largest |value| compared, and for LayerNorm
    r·max|ĝ|·(1 + r·max|x|) with r = 1/√(σ² + ε), the size of the terms of r(ĝ − mean ĝ − x̂ mean(ĝx̂)) times the
    digits that x − μ loses when a row's spread is small next to its entries."""
    from transformer_lab.backprop import gelu_grad, layer_norm_backward, linear_backward, softmax_cross_entropy_backward
    from transformer_lab.mlp import MLP

    def size(*tensors) -> float:  # what a difference is divided by: 1, or the largest |value| (at least 1)
        return max(1.0, *(t.detach().abs().max().item() for t in tensors)) if relative else 1.0

    gen = torch.Generator().manual_seed(seed)
    out: dict[str, float] = {}
    xs = torch.randn(200, generator=gen, dtype=torch.float64) * 3
    xa = xs.clone().requires_grad_(True)
    for name, deriv, approx in (("gelu_exact", gelu_exact_derivative, "none"),
                                ("gelu_tanh", gelu_tanh_derivative, "tanh")):
        sym = torch.from_numpy(sp.lambdify(x, deriv()["derivative"], _NUMPY)(xs.numpy()))
        ours = gelu_grad(xs, approx)
        (auto,) = torch.autograd.grad(F.gelu(xa, approximate=approx).sum(), xa)
        scale = size(sym, ours, auto)
        out[f"{name}: sympy vs ours"] = (sym - ours).abs().max().item() / scale
        out[f"{name}: ours vs autograd"] = (ours - auto).abs().max().item() / scale
        out[f"{name}: sympy vs autograd"] = (sym - auto).abs().max().item() / scale

    d = linear_gradient()  # the batched linear layer: ∂L/∂X, ∂L/∂W, ∂L/∂b
    (n, d_in), d_out = d["X"].shape, d["W"].shape[0]
    fn = sp.lambdify([*d["X"], *d["W"], *d["G"]], [d[f"chain_{k}"] for k in "XWb"], "numpy")
    xv, wv = (torch.randn(n, d_in, generator=gen, dtype=torch.float64),
              torch.randn(d_out, d_in, generator=gen, dtype=torch.float64))
    bv, gv = torch.randn(d_out, generator=gen, dtype=torch.float64), torch.randn(n, d_out, generator=gen, dtype=torch.float64)
    sym = [torch.tensor(a, dtype=torch.float64) for a in fn(*xv.flatten().tolist(), *wv.flatten().tolist(),
                                                            *gv.flatten().tolist())]
    ours = linear_backward(gv, xv, wv, bias=True)
    leaves = [t.clone().requires_grad_(True) for t in (xv, wv, bv)]
    auto = torch.autograd.grad(F.linear(*leaves), leaves, gv)
    scale = size(*sym, *ours, *auto)
    out["linear (batched, X, W, b): sympy vs ours"] = max((s.reshape(o.shape) - o).abs().max().item()
                                                          for s, o in zip(sym, ours, strict=True)) / scale
    out["linear (batched, X, W, b): ours vs autograd"] = max((o - a).abs().max().item()
                                                             for o, a in zip(ours, auto, strict=True)) / scale
    out["linear (batched, X, W, b): sympy vs autograd"] = max((s.reshape(a.shape) - a).abs().max().item()
                                                              for s, a in zip(sym, auto, strict=True)) / scale

    n = 3
    d = softmax_ce_gradient(n)
    grad_fn = sp.lambdify([d["z"], d["y"]], d["gradient"], "numpy")
    z = torch.randn(n, generator=gen, dtype=torch.float64) * 4
    k = int(torch.randint(0, n, (1,), generator=gen))
    y = F.one_hot(torch.tensor(k), n).double()
    sym = torch.tensor(grad_fn(z.numpy(), y.numpy()), dtype=torch.float64)
    ours = softmax_cross_entropy_backward(z[None], torch.tensor([k]))[0]
    za = z.clone().requires_grad_(True)
    (auto,) = torch.autograd.grad(F.cross_entropy(za[None], torch.tensor([k])), za)
    scale = size(sym, ours, auto)
    out["softmax_ce: sympy vs ours"] = (sym - ours).abs().max().item() / scale
    out["softmax_ce: ours vs autograd"] = (ours - auto).abs().max().item() / scale
    out["softmax_ce: sympy vs autograd"] = (sym - auto).abs().max().item() / scale

    d = layer_norm_gradient(n)
    grad_fn = sp.lambdify([d["x"], d["g"], d["eps"]], list(d["gradient"]), "numpy")
    xv = torch.randn(n, generator=gen, dtype=torch.float64)
    g = torch.randn(n, generator=gen, dtype=torch.float64)
    sym = torch.tensor(grad_fn(xv.numpy(), g.numpy(), 1e-5), dtype=torch.float64)
    ours = layer_norm_backward(g, xv, None, 1e-5)[0]
    xa = xv.clone().requires_grad_(True)
    (auto,) = torch.autograd.grad((F.layer_norm(xa, (n,), eps=1e-5) * g).sum(), xa)
    r = 1.0 / math.sqrt(xv.var(unbiased=False).item() + 1e-5)
    scale = max(1.0, r * g.abs().max().item() * (1.0 + r * xv.abs().max().item())) if relative else 1.0
    out["layer_norm: sympy vs ours"] = (sym - ours).abs().max().item() / scale
    out["layer_norm: ours vs autograd"] = (ours - auto).abs().max().item() / scale
    out["layer_norm: sympy vs autograd"] = (sym - auto).abs().max().item() / scale

    # the whole block, with f = GELU (tanh form): all five gradients
    d = mlp_chain_rule()
    s = sp.Symbol("s", real=True)
    act = sp.Lambda(s, gelu_tanh_derivative()["gelu"].subs(x, s))
    syms = [*d["W1"], *d["W2"], *d["b1"], *d["b2"], *d["x"], *d["c"]]
    names = {"W1": "fc.weight", "b1": "fc.bias", "x": "x", "W2": "proj.weight", "b2": "proj.bias"}
    fn = sp.lambdify(syms, [d[f"chain_{k}"].subs(d["f"], act).doit() for k in names], "numpy")
    with torch.random.fork_rng():  # leave the caller's global RNG as it was
        torch.manual_seed(seed)
        mlp = MLP(2, 2, approximate="tanh").double()
    xv = torch.randn(2, generator=gen, dtype=torch.float64)
    c = torch.randn(2, generator=gen, dtype=torch.float64)
    vals = [mlp.fc.weight, mlp.proj.weight, mlp.fc.bias, mlp.proj.bias, xv, c]
    sym = {names[k]: torch.tensor(a, dtype=torch.float64)
           for k, a in zip(names, fn(*[float(v) for t in vals for v in t.detach().flatten()]), strict=True)}
    _, cache = mlp.forward_with_cache(xv)
    ours = mlp.backward(c, cache)
    xa = xv.clone().requires_grad_(True)
    params = dict(mlp.named_parameters())
    auto = dict(zip(["x", *params], torch.autograd.grad((mlp(xa) * c).sum(), [xa, *params.values()]), strict=True))
    scale = size(*sym.values(), *ours.values(), *auto.values())
    out["mlp_block (5 gradients): sympy vs ours"] = max((sym[k].reshape(ours[k].shape) - ours[k]).abs().max().item()
                                                        for k in names.values()) / scale
    out["mlp_block (5 gradients): ours vs autograd"] = max((ours[k] - auto[k]).abs().max().item()
                                                           for k in names.values()) / scale
    out["mlp_block (5 gradients): sympy vs autograd"] = max((sym[k].reshape(auto[k].shape) - auto[k]).abs().max()
                                                            .item() for k in names.values()) / scale
    return out
