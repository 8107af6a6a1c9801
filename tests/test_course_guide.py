"""The course guide's midterm problem set: every result its worked solutions state, checked with SymPy on
general symbols (problems 1–4) or computed (problem 5), and the sentence as the page writes it."""

import math

import sympy as sp
from conftest import ROOT

GUIDE = " ".join((ROOT / "book" / "course-guide.md").read_text(encoding="utf8").split())


def test_problem_1_softmax_jacobian_and_cross_entropy_gradient():
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


def test_problem_2_adam_first_moment_closed_form():
    beta, g = sp.symbols("beta_1 g", real=True)
    t = sp.symbols("t", integer=True, positive=True)
    m = lambda t: (1 - beta**t) * g  # noqa: E731 - the closed form the solution states
    assert sp.simplify(m(1) - (1 - beta) * g) == 0  # m_1 from m_0 = 0
    assert sp.simplify(beta * m(t - 1) + (1 - beta) * g - m(t)) == 0  # the recurrence, for every t
    assert sp.Rational(1) - sp.Rational(9, 10) ** 1 == sp.Rational(1, 10)
    assert "(0.1 at the first step for $\\beta_1 = 0.9$)" in GUIDE
    assert r"m_t = (1 - \beta_1^t)\,g" in GUIDE


def test_problem_3_variance_of_a_dot_product():
    from sympy.stats import E, Normal, variance

    Q, K = Normal("Q", 0, 1), Normal("K", 0, 1)
    assert E(Q * K) == 0 and sp.simplify(variance(Q * K)) == 1  # one product: mean 0, variance 1
    d = sp.symbols("d_k", integer=True, positive=True)
    assert sp.Sum(1, (sp.Symbol("i"), 1, d)).doit() == d  # d_k independent products: variances add
    assert r"\operatorname{Var}(q\cdot k) = d_k" in GUIDE


def test_problem_4_causal_pairs():
    n, i = sp.symbols("n i", integer=True, positive=True)
    assert sp.simplify(sp.Sum(i, (i, 1, n)).doit() - n * (n + 1) / 2) == 0
    assert 256 * 257 // 2 == 32_896 and 256**2 == 65_536 and round(257 / 512, 3) == 0.502
    assert "32,896 of 65,536" in GUIDE and r"257/512 \approx 0.502" in GUIDE


def test_problem_5_bits_and_perplexity():
    assert round(1.8649 / math.log(2), 3) == 2.690 and round(math.exp(1.8649), 3) == 6.455
    assert r"\approx 2.690$ bits per character" in GUIDE and r"e^{1.8649} \approx 6.455" in GUIDE
