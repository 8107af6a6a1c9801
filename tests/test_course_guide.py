"""The course guide's midterm problem sets, the first and the make-up: every result their worked solutions state,
checked with SymPy on general symbols or computed, and the sentence as the page writes it."""

import math
import re

import sympy as sp
from conftest import ROOT

GUIDE = " ".join((ROOT / "book" / "course-guide.md").read_text(encoding="utf8").split())


def test_problem_1_a_transformer_is_not_a_stack_of_linear_maps():
    C, c = 2, sp.Symbol("c", real=True)
    x, b1, b2 = (sp.Matrix(1, C, sp.symbols(f"{s}0:{C}")) for s in ("x", "b1_", "b2_"))
    W1, W2 = (sp.Matrix(C, C, sp.symbols(f"{s}0:{C * C}")) for s in ("u", "w"))
    assert ((x * W1 + b1) * W2 + b2 - (x * (W1 * W2) + (b1 * W2 + b2))).expand() == sp.zeros(1, C)  # one affine map

    def f(X, Wq, Wk, Wv):  # attention with the softmax deleted and no biases; d_k = the columns of Wq
        return (X * Wq) * (X * Wk).T * (X * Wv) / sp.sqrt(Wq.cols)

    X = sp.Matrix(3, C, sp.symbols("X0:6"))  # T = 3 positions
    W = [sp.Matrix(C, C, sp.symbols(f"{s}0:{C * C}")) for s in ("q", "k", "v")]
    assert (f(c * X, *W) - c**3 * f(X, *W)).expand() == sp.zeros(3, C)  # homogeneous of degree 3
    one = lambda v: f(sp.Matrix([[v]]), *[sp.ones(1, 1)] * 3)[0]  # noqa: E731 - T = C = d_k = 1, every W = 1
    assert sp.expand(one(sp.Symbol("s")) - sp.Symbol("s") ** 3) == 0
    assert (one(1), one(2), one(1) + one(1)) == (1, 8, 2)  # f(1 + 1) ≠ f(1) + f(1) and f(2·1) ≠ 2 f(1)
    assert r"x(W_1W_2) + (b_1W_2 + b_2)" in GUIDE and "$f(cX) = c^3 f(X)$" in GUIDE
    assert "$f(1) = 1$ and $f(2) = 8$, but $f(1) + f(1) = 2$" in GUIDE


def test_problem_2_softmax_jacobian_and_cross_entropy_gradient():
    n = 4
    z = sp.symbols("z0:4", real=True)
    S = sum(sp.exp(zk) for zk in z)
    p = [sp.exp(zi) / S for zi in z]
    for i in range(n):
        for j in range(n):
            assert sp.simplify(sp.diff(p[i], z[j]) - p[i] * ((1 if i == j else 0) - p[j])) == 0
    y = 2
    loss = -sp.log(p[y])
    assert all(sp.simplify(sp.diff(loss, z[j]) - (p[j] - (1 if j == y else 0))) == 0 for j in range(n))
    assert r"p_i(\delta_{ij} - p_j)" in GUIDE and "the gradient is $p - e_y$" in GUIDE


def test_problem_3_adam_first_moment_closed_form():
    beta, g = sp.symbols("beta_1 g", real=True)
    t = sp.symbols("t", integer=True, positive=True)
    m = lambda t: (1 - beta**t) * g  # noqa: E731 - the closed form the solution states
    assert sp.simplify(m(1) - (1 - beta) * g) == 0  # m_1 from m_0 = 0
    assert sp.simplify(beta * m(t - 1) + (1 - beta) * g - m(t)) == 0  # the recurrence, for every t
    assert sp.Rational(1) - sp.Rational(9, 10) ** 1 == sp.Rational(1, 10)
    assert "(0.1 at the first step for $\\beta_1 = 0.9$)" in GUIDE
    assert r"m_t = (1 - \beta_1^t)\,g" in GUIDE


def test_problem_4_backward_through_a_tiny_relu_network():
    x, b1, w2 = sp.Matrix(sp.symbols("x0:2")), sp.Matrix(sp.symbols("c0:2")), sp.Matrix(sp.symbols("v0:2"))
    W1, b2, t = sp.Matrix(2, 2, sp.symbols("u0:4")), sp.Symbol("b2"), sp.Symbol("t")
    h = W1 * x + b1
    a = h.applyfunc(lambda e: sp.Max(0, e))
    y = (w2.T * a)[0] + b2
    loss = (y - t) ** 2 / 2
    values = dict(zip([*x, *W1, *b1, *w2, b2, t], [1, 2, 1, 1, 1, -2, 0, 1, 2, 1, 0, 4], strict=True))
    at = lambda e: sp.sympify(e).subs(values)  # noqa: E731 - the problem's numbers
    assert list(h.subs(values)) == [3, -2] and list(a.subs(values)) == [3, 0] and at(y) == 6 and at(loss) == 2
    grad = lambda M: M.applyfunc(lambda e: at(sp.diff(loss, e)))  # noqa: E731 - differentiated directly
    assert list(grad(w2)) == [6, 0] and grad(W1) == sp.Matrix([[4, 8], [0, 0]]) and list(grad(x)) == [4, 4]
    assert list(grad(b1)) == [4, 0]  # ∂L/∂h = ∂L/∂b1: the ReLU mask (1, 0) blocks the second unit
    delta = sp.Matrix([4, 0])
    assert grad(W1) == delta * x.T.subs(values) and grad(x) == W1.T.subs(values) * delta  # δxᵀ and W1ᵀδ
    assert r"$h = (1 + 2 + 0,\ 1 - 4 + 1) = (3, -2)$" in GUIDE and r"\tfrac12(6 - 4)^2 = 2$" in GUIDE
    assert r"(4, 2) \odot (1, 0) = (4, 0)$" in GUIDE and r"W_1^\top\delta = (4, 4)$" in GUIDE
    assert r"with rows $(4, 8)$ and $(0, 0)$" in GUIDE and r"= 2a = (6, 0)$" in GUIDE


def test_problem_5_bits_and_perplexity():
    assert round(1.8649 / math.log(2), 3) == 2.690 and round(math.exp(1.8649), 3) == 6.455
    assert r"\approx 2.690$ bits per character" in GUIDE and r"e^{1.8649} \approx 6.455" in GUIDE


# The make-up midterm: the same checks for its five problems.
def test_makeup_1_attention_weights_ignore_a_shared_key_shift():
    q1, q2, c1, c2, d = sp.symbols("q1 q2 c1 c2 d_k", positive=True)
    keys = [sp.symbols("a1 a2"), sp.symbols("b1 b2")]

    def weight(shift):
        s = [(q1 * (k[0] + shift[0]) + q2 * (k[1] + shift[1])) / sp.sqrt(d) for k in keys]
        return sp.exp(s[0]) / (sp.exp(s[0]) + sp.exp(s[1]))

    assert sp.simplify(weight((c1, c2)) - weight((0, 0))) == 0
    w = sp.exp(3 / sp.sqrt(2)) / (sp.exp(3 / sp.sqrt(2)) + 1)
    assert sp.simplify(w - 1 / (1 + sp.exp(-3 / sp.sqrt(2)))) == 0 and f"{float(w):.4f}" == "0.8930"
    assert r"1/(1 + e^{-3/\sqrt 2}) \approx 0.8930" in GUIDE and r"3/\sqrt 2 \approx 2.121" in GUIDE


def test_makeup_2_softmax_and_its_temperature_limits():
    t = sp.symbols("tau", positive=True)
    z = [2, 1, 1]
    p = [sp.exp(zi) / sum(sp.exp(zk) for zk in z) for zi in z]
    assert sp.simplify(p[0] - sp.E / (sp.E + 2)) == 0 and sp.simplify(p[1] - 1 / (sp.E + 2)) == 0
    assert f"{float(p[0]):.4f}" == "0.5761" and f"{float(p[1]):.4f}" == "0.2119"
    pt = [sp.exp(zi / t) / sum(sp.exp(zk / t) for zk in z) for zi in z]
    assert [sp.limit(x, t, 0, "+") for x in pt] == [1, 0, 0]
    assert [sp.limit(x, t, sp.oo) for x in pt] == [sp.Rational(1, 3)] * 3
    tied = [sp.exp(zi / t) / sum(sp.exp(zk / t) for zk in (1, 1, 0)) for zi in (1, 1, 0)]
    assert [sp.limit(x, t, 0, "+") for x in tied] == [sp.Rational(1, 2), sp.Rational(1, 2), 0]
    assert r"p_1 = e/(e + 2) \approx 0.5761" in GUIDE and r"$(1/2, 1/2, 0)$" in GUIDE
    assert r"$(1/3, 1/3, 1/3)$" in GUIDE


def test_makeup_3_gradient_descent_on_a_quadratic():
    eta, k = sp.symbols("eta", positive=True), sp.symbols("k", integer=True, nonnegative=True)
    th0 = sp.symbols("theta0")
    for lam in (1, 25):  # one coordinate: θ_{k+1} = θ_k − η λ θ_k, and the closed form satisfies it
        theta = (1 - eta * lam) ** k * th0
        assert sp.simplify(theta.subs(k, k + 1) - (theta - eta * lam * theta)) == 0
    assert sp.solve(sp.Eq(1 - 25 * eta, -1), eta) == [sp.Rational(2, 25)]  # |1 − 25η| < 1 ends there
    best = sp.solve(sp.Eq(1 - eta, 25 * eta - 1), eta)
    assert best == [sp.Rational(1, 13)] and 1 - best[0] == sp.Rational(12, 13) == sp.Rational(25 - 1, 25 + 1)
    assert r"$\eta = 2/26 = 1/13$" in GUIDE and r"$12/13 \approx 0.923" in GUIDE and "2/25 = 0.08" in GUIDE


def test_makeup_4_linear_layer_gradients():
    N, d_in, d_out = 2, 3, 2
    X, W = sp.Matrix(N, d_in, sp.symbols("x0:6")), sp.Matrix(d_out, d_in, sp.symbols("w0:6"))
    b, G = sp.Matrix(1, d_out, sp.symbols("b0:2")), sp.Matrix(N, d_out, sp.symbols("g0:4"))
    Y = X * W.T + sp.ones(N, 1) * b
    loss = sum(G[n, j] * Y[n, j] for n in range(N) for j in range(d_out))  # a loss with ∂L/∂Y = G
    grad = lambda M: M.applyfunc(lambda e: sp.diff(loss, e))  # noqa: E731
    assert grad(X) == G * W and grad(W) == G.T * X
    assert grad(b) == sp.ones(1, N) * G  # the column sums of G
    assert r"\partial\mathcal L/\partial X = GW" in GUIDE and r"\partial\mathcal L/\partial W = G^\top X" in GUIDE


def test_makeup_5_kl_both_ways_and_cross_entropy():
    p, q = [sp.Rational(1, 2)] * 2, [sp.Rational(1, 4), sp.Rational(3, 4)]
    kl = lambda a, b: sum(x * sp.log(x / y) for x, y in zip(a, b, strict=True))  # noqa: E731
    assert sp.simplify(kl(p, q) - sp.log(sp.Rational(4, 3)) / 2) == 0
    assert sp.simplify(kl(q, p) - (sp.Rational(3, 4) * sp.log(3) - sp.log(2))) == 0
    assert f"{float(kl(p, q)):.4f}" == "0.1438" and f"{float(kl(q, p)):.4f}" == "0.1308"
    cross = -sum(x * sp.log(y) for x, y in zip(p, q, strict=True))
    assert sp.simplify(cross - (sp.log(2) + kl(p, q))) == 0 and f"{float(cross):.4f}" == "0.8370"
    assert r"\approx 0.1438$ nats" in GUIDE and r"\approx 0.1308$ nats" in GUIDE and r"\approx 0.8370$" in GUIDE


def test_the_makeup_midterm_is_in_the_instructor_edition_only():
    text = (ROOT / "book" / "course-guide.md").read_text(encoding="utf8")
    inside = [m[1] for m in re.finditer(r"^```\{only\} instructor\n(.*?)^```$", text, re.S | re.M)]
    assert any("**Make-up midterm, with worked solutions**" in b and "**Problem 5, chapter 5.**" in b for b in inside)
    assert text.count("Make-up midterm, with worked solutions") == 1


# The written derivations: every prompt names the chapter's SymPy functions it is checked against, the model
# answers are in the instructor edition only, and each model answer's result is the one SymPy derives.
def _instructor_blocks(text: str) -> list[str]:
    return [m[1] for m in re.finditer(r"^```\{only\} instructor\n(.*?)^```$", text, re.S | re.M)]


def test_written_derivation_prompts_name_existing_sympy_functions():
    import importlib

    text = (ROOT / "book" / "course-guide.md").read_text(encoding="utf8")
    section = text[text.index("## Written derivations"):text.index("## Capstone project")]
    prompts = re.findall(r"^- \*\*(\d)([ab]?)\. .*?(?=^- \*\*|^\*\*Rubric)", section, re.S | re.M)
    assert sorted({int(ch) for ch, _ in prompts}) == list(range(1, 9)) and len(prompts) <= 16
    for block in re.findall(r"^- \*\*\d[ab]?\. .*?(?=^- \*\*|^\*\*Rubric)", section, re.S | re.M):
        chapter = re.match(r"- \*\*(\d)", block)[1]
        names = re.findall(r"`(?:derivations\.ch\d\.)?(\w+)\(\)`", block[block.index("Check:"):])
        module = importlib.import_module(f"transformer_lab.derivations.ch{chapter}")
        assert names and all(callable(getattr(module, n, None)) for n in names), block[:60]
    visible = text
    for block in _instructor_blocks(text):
        visible = visible.replace(block, "")
    assert "**Rubric.** Each derivation is marked out of 20 points." in visible and "**3a. Heavy ball" in visible
    answers = [b for b in _instructor_blocks(text) if "Written derivations: model answers" in b]
    assert len(answers) == 1 and all(f"- **{n}.**" in answers[0] for n in
                                     ("1a", "1b", "2", "3a", "3b", "4", "5a", "5b", "6a", "6b", "7a", "7b", "8a", "8b"))
    assert "Written derivations: model answers" not in visible


def test_written_derivation_model_answers_match_sympy():
    from transformer_lab.derivations import ch3, ch4, ch5, ch6, ch7, ch8

    hb = ch3.heavy_ball_quadratic()
    b = hb["beta"]
    lo, hi = hb["underdamped"].start, hb["underdamped"].end
    assert hb["product"] == b
    assert sp.expand(lo - (1 - sp.sqrt(b)) ** 2) == 0 and sp.expand(hi - (1 + sp.sqrt(b)) ** 2) == 0
    assert r"$(1 - \sqrt\beta)^2 < \eta a < (1 + \sqrt\beta)^2$" in GUIDE
    noise = ch3.sgd_noise_quadratic()
    eta = sp.Symbol("eta", positive=True)
    assert sp.simplify(noise["variance"] - eta * noise["sigma"] ** 2 / (noise["a"] * (2 - eta * noise["a"]))) == 0
    assert r"$V = \eta\sigma^2/(a(2 - \eta a))$" in GUIDE
    shape = ch4.gelu_slope_shape()
    assert shape["peak_x"] == sp.sqrt(2) and shape["symmetry"] == 1 and f"{float(shape['peak']):.3f}" == "1.129"
    assert sp.simplify(shape["peak"] - (sp.Rational(1, 2) + sp.erf(1) / 2 + sp.exp(-1) / sp.sqrt(sp.pi))) == 0
    assert r"e^{-1}/\sqrt\pi \approx 1.129" in GUIDE
    assert dict(ch5.cross_entropy_minimum(3))["λ (from Σ q = 1)"] == sp.Add(*sp.symbols("p_1:4", positive=True))
    assert dict(ch6.rope_relative())["score - qᵀ Rot((n-m)θ) k"] == 0
    assert r"q^\top\operatorname{Rot}((n - m)\theta)k" in GUIDE
    score = ch7.dot_product_variance()
    d_k, s_q, s_k = score["symbols"]
    assert score["term_mean"] == 0 and score["covariance_of_two_terms"] == 0
    assert sp.simplify(score["variance"] - d_k * s_q**2 * s_k**2) == 0 and score["unit_scaled_variance"] == 1
    assert r"$\operatorname{Var}(q\cdot k) = d_k\sigma_q^2\sigma_k^2$" in GUIDE
    V, T, L, C = sp.symbols("V T n_layer C", positive=True, integer=True)
    counted = ch8.param_count()
    named = {str(s): s for s in counted.free_symbols}
    mine = (V * C + T * C + 2 * C + L * (12 * C**2 + 13 * C)).subs(
        {V: named["V"], T: named["T"], C: named["C"], L: named[r"n_\text{layer}"]})
    assert sp.expand(counted - mine) == 0 and r"n_\text{layer}(12C^2 + 13C)" in GUIDE
    cost, n = ch8.generation_cost(), sp.Symbol("n", positive=True, integer=True)
    assert sp.simplify(cost["ratio"] - (n + 1) / 2) == 0 and sp.simplify(cost["pairs_ratio"] - (n + 2) / 3) == 0
    assert "a ratio of $(n+2)/3$" in GUIDE and "the ratio is $(n+1)/2$" in GUIDE
