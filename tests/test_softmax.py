"""Chapter 2: softmax, log-softmax, the softmax Jacobian and the language-model head.

Three-way agreement in float64: SymPy (lambdified) = transformer_lab = PyTorch (F.softmax, F.log_softmax,
torch.func.jacrev), values and gradients. Tolerance atol = rtol = 1e-12 (round-off is ~1e-16 here), except where
stated.
"""

import numpy as np
import pytest
import sympy as sp
import torch
import torch.nn.functional as F

from transformer_lab.derivations import ch2
from transformer_lab.softmax import LMHead, log_softmax, softmax, softmax_jacobian

TOL = {"atol": 1e-12, "rtol": 1e-12}


def rnd(*shape, seed=0, scale=1.0, grad=False):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).requires_grad_(grad)


def test_softmax_sympy_ours_torch():
    der = ch2.softmax_jacobian_derivation(4)
    z = rnd(4, seed=1, scale=3)
    sym_p = np.asarray(sp.lambdify([der["z"]], der["p"], "numpy")(z.tolist()), dtype=np.float64).reshape(-1)
    sym_J = np.asarray(sp.lambdify([der["z"]], der["J"], "numpy")(z.tolist()), dtype=np.float64)
    p = softmax(z)
    torch.testing.assert_close(p, torch.as_tensor(sym_p), **TOL)
    torch.testing.assert_close(p, F.softmax(z, -1), **TOL)
    torch.testing.assert_close(softmax_jacobian(p), torch.as_tensor(sym_J), **TOL)
    torch.testing.assert_close(softmax_jacobian(p), torch.func.jacrev(lambda t: F.softmax(t, -1))(z), **TOL)
    torch.testing.assert_close(softmax_jacobian(p), torch.func.jacrev(softmax)(z), **TOL)


def test_jacobian_derivation_simplifies_to_zero():
    assert ch2.softmax_jacobian_derivation(3)["difference"] == sp.zeros(3, 3)
    assert ch2.shift_invariance(3)["difference"] == sp.zeros(3, 1)


def test_general_n_derivations_simplify_to_zero():
    g = ch2.softmax_general()
    assert g["jacobian_difference"] == 0
    assert g["shift_difference"] == 0
    assert g["n"].is_Symbol  # n is a symbol, not a chosen size


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_softmax_and_log_softmax_values_and_gradients(dim):
    x = rnd(3, 5, 4, seed=2, scale=4, grad=True)
    up = rnd(3, 5, 4, seed=3)
    for ours_fn, ref_fn in ((softmax, F.softmax), (log_softmax, F.log_softmax)):
        ours, ref = ours_fn(x, dim=dim), ref_fn(x, dim=dim)
        torch.testing.assert_close(ours, ref, **TOL)
        g_ours = torch.autograd.grad((ours * up).sum(), x)[0]
        g_ref = torch.autograd.grad((ref * up).sum(), x)[0]
        torch.testing.assert_close(g_ours, g_ref, **TOL)


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")  # torch.func's own
@pytest.mark.parametrize("dim", [0, -1])
def test_forward_mode_jvp_jacfwd_and_hessian(dim):
    """Forward mode works too (the review found jacfwd/jvp/hessian raising "You must implement the jvp function")."""
    x, t = rnd(3, 5, seed=5, scale=3), rnd(3, 5, seed=6)
    ours, ref = (lambda z: softmax(z, dim=dim)), (lambda z: F.softmax(z, dim))
    torch.testing.assert_close(torch.func.jvp(ours, (x,), (t,))[1], torch.func.jvp(ref, (x,), (t,))[1], **TOL)
    torch.testing.assert_close(torch.func.jacfwd(ours)(x), torch.func.jacfwd(ref)(x), **TOL)
    w = rnd(3, 5, seed=7)
    hess = [torch.func.hessian(lambda z, f=f: (f(z) ** 2 * w).sum())(x) for f in (ours, ref)]
    torch.testing.assert_close(hess[0], hess[1], **TOL)


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")  # torch.func's own
@pytest.mark.xfail(strict=True, reason="forward-over-forward through a custom autograd.Function gives 0 (PyTorch "
                                       "limit, documented in transformer_lab.softmax); strict, so a fix is noticed")
def test_forward_over_forward_second_derivative():
    x, t, s = rnd(4, seed=8), rnd(4, seed=9), rnd(4, seed=10)

    def second(f):
        return torch.func.jvp(lambda y: torch.func.jvp(f, (y,), (t,))[1], (x,), (s,))[1]

    ours, ref = (lambda z: softmax(z, dim=-1)), (lambda z: F.softmax(z, -1))
    assert second(ref).abs().max() > 1e-3  # the true second derivative is not 0 here
    torch.testing.assert_close(second(ours), second(ref), **TOL)
    torch.testing.assert_close(torch.func.jacfwd(torch.func.jacfwd(ours))(x),
                               torch.func.jacfwd(torch.func.jacfwd(ref))(x), **TOL)


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")  # torch.func's own
def test_second_derivatives_through_reverse_mode_are_exact():
    """The documented alternatives to forward-over-forward: jacrev∘jacrev, jacrev∘jacfwd, hessian (jacfwd∘jacrev)."""
    x = rnd(4, seed=8)
    ours, ref = (lambda z: softmax(z, dim=-1)), (lambda z: F.softmax(z, -1))
    J, Jf = torch.func.jacrev, torch.func.jacfwd
    for combo in (lambda f: J(J(f)), lambda f: J(Jf(f)), lambda f: Jf(J(f))):
        torch.testing.assert_close(combo(ours)(x), combo(ref)(x), **TOL)


def test_batched_jacobian():
    z = rnd(2, 3, 5, seed=4)
    J = softmax_jacobian(softmax(z))
    assert J.shape == (2, 3, 5, 5)
    ref = torch.func.vmap(torch.func.vmap(torch.func.jacrev(lambda t: F.softmax(t, -1))))(z)
    torch.testing.assert_close(J, ref, **TOL)
    torch.testing.assert_close(J.sum(-1), torch.zeros(2, 3, 5, dtype=torch.float64), **TOL)  # rows sum to 0


def test_huge_logits_do_not_overflow():
    z = torch.tensor([1000.0, 999.0, -1000.0], dtype=torch.float64)
    p, logp = softmax(z), log_softmax(z)
    assert torch.isfinite(p).all()
    assert torch.isfinite(logp).all()
    torch.testing.assert_close(p, F.softmax(z, -1), **TOL)
    torch.testing.assert_close(logp, F.log_softmax(z, -1), **TOL)
    z32 = torch.tensor([88.0, 89.0, 90.0])  # exp(89) overflows float32
    assert torch.isinf(torch.exp(z32)).any()
    torch.testing.assert_close(softmax(z32), F.softmax(z32, -1), atol=1e-7, rtol=1e-6)


def test_shift_invariance_and_minus_inf():
    z = rnd(6, seed=5)
    torch.testing.assert_close(softmax(z + 123.0), softmax(z), atol=1e-13, rtol=1e-12)
    z[2] = float("-inf")
    p = softmax(z)
    assert p[2] == 0
    torch.testing.assert_close(p, F.softmax(z, -1), **TOL)
    assert torch.isnan(softmax(torch.full((3,), float("-inf")))).all()  # as torch: no distribution
    assert torch.isnan(F.softmax(torch.full((3,), float("-inf")), -1)).all()


def test_length_one_vocabulary():
    z = rnd(4, 1, seed=6)
    assert torch.equal(softmax(z), torch.ones(4, 1, dtype=torch.float64))
    assert torch.equal(log_softmax(z), torch.zeros(4, 1, dtype=torch.float64))


def test_temperature_limits_symbolic():
    lim = ch2.temperature_limits()
    assert lim["limit_to_0"] == [1, 0, 0]
    assert lim["limit_to_oo"] == [sp.Rational(1, 3)] * 3
    assert lim["shift_difference"] == sp.zeros(3, 1)
    assert ch2.temperature_limit_tied()["limit_to_0"] == [sp.Rational(1, 2), sp.Rational(1, 2), 0]


def test_temperature_to_zero_with_tied_maxima_numerically():
    z = torch.tensor([2.0, 2.0, -1.0], dtype=torch.float64)
    torch.testing.assert_close(softmax(z / 1e-3), torch.tensor([0.5, 0.5, 0.0], dtype=torch.float64), **TOL)


def test_chain_rule_and_cross_entropy_symbolic():
    for n, vocab in ((3, 2), (2, 3)):  # every sequence of the table, not one
        differences = ch2.chain_rule(n, vocab)["differences"]
        assert len(differences) == vocab**n
        assert set(differences.values()) == {0}
    assert ch2.cross_entropy_one_hot(4, 2)["difference"] == 0
    z = rnd(5, 7, seed=7)
    y = torch.tensor([0, 6, 3, 3, 1])
    nll = -log_softmax(z).gather(-1, y[:, None]).squeeze(-1).mean()  # L = -Σ y_i log p_i, averaged
    torch.testing.assert_close(nll, F.cross_entropy(z, y), **TOL)


def test_derivation_check_all_small():
    for name, err in ch2.check(seed=0).items():
        bound = 1e-6 if "uniform" in name else 1e-12  # T = 1e6 is uniform only up to ~|z|/T
        assert err < bound, name


def test_lm_head():
    torch.manual_seed(0)
    head = LMHead(6, 11, bias=True).double()
    lin = torch.nn.Linear(6, 11, dtype=torch.float64)
    with torch.no_grad():
        head.bias.normal_()
        lin.weight.copy_(head.weight)
        lin.bias.copy_(head.bias)
    x = rnd(2, 3, 6, seed=8)
    torch.testing.assert_close(head(x), lin(x), **TOL)
    torch.testing.assert_close(head.probs(x), F.softmax(lin(x), -1), **TOL)
    assert LMHead(6, 11).bias is None


@pytest.mark.parametrize(("fn", "arg", "match"), [
    (softmax, torch.tensor([1, 2]), r"floating-point tensor \(float16, bfloat16, float32 or float64\)"),
    (log_softmax, torch.tensor(1.0), r"at least one dimension"),
    (softmax, [1.0, 2.0], r"torch.Tensor"),
    (softmax_jacobian, torch.tensor([1, 2]), r"floating-point"),
])
def test_bad_input(fn, arg, match):
    with pytest.raises(ValueError, match=match):
        fn(arg)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_every_dtype_the_error_message_names_is_accepted(dtype):
    """The error for an integer tensor lists float16 and bfloat16 (the review: it said float32 or float64 only)."""
    z = torch.tensor([[1.0, 2.0, 3.0]], dtype=dtype)
    torch.testing.assert_close(softmax(z).double(), F.softmax(z.double(), -1), atol=1e-2, rtol=1e-2)


def test_bad_dim():
    with pytest.raises(ValueError, match=r"dim=2 is out of range .* \(3, 4\)"):
        softmax(torch.zeros(3, 4), dim=2)


def test_lm_head_bad_input():
    with pytest.raises(ValueError, match=r"\(\.\.\., d_model=6\)"):
        LMHead(6, 11)(torch.zeros(2, 5))
    with pytest.raises(ValueError, match=r"vocab_size must be a positive int"):
        LMHead(6, 0)


# ---- half precision: computed in float32, rounded once to the input's dtype ----------------------------------

@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize(("fn", "ref"), [(softmax, torch.softmax), (log_softmax, torch.log_softmax)])
def test_half_precision_is_within_rounding_of_float32(dtype, fn, ref):
    """float16/bfloat16 logits give torch's float32 result rounded to the dtype: within half a unit in the last
    place of each entry (relative eps/2, with 1% for float32 round-off, plus the spacing of the dtype's subnormals)."""
    x = (torch.randn(64, 1000, generator=torch.Generator().manual_seed(0)) * 4).to(dtype)
    out = fn(x)
    assert out.dtype == dtype and out.shape == x.shape
    exact = ref(x.float(), dim=-1)  # the same half inputs, in float32
    info = torch.finfo(dtype)
    err = (out.float() - exact).abs()
    assert (err <= exact.abs() * info.eps / 2 * 1.01 + info.smallest_normal * info.eps).all(), float(err.max())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_gradient_flows_in_the_input_dtype(dtype):
    x = torch.randn(3, 7, generator=torch.Generator().manual_seed(1)).to(dtype).requires_grad_()
    (softmax(x)[:, 0].sum() + log_softmax(x)[:, 1].sum()).backward()
    assert x.grad.dtype == dtype and torch.isfinite(x.grad).all()
