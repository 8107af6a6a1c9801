"""Chapter 4 (calculus) exercises: automatic checks.

* ``linear_grads(grad_out, x, weight)`` — (∂L/∂x, ∂L/∂W, ∂L/∂b) of y = x Wᵀ + b
* ``gelu_tanh_grad(x)`` — the derivative of the tanh-approximate GELU
* ``softmax_ce_grad(logits, targets)`` — ∂L/∂z of the mean softmax cross-entropy
* ``layer_norm_grad(grad_out, x, eps)`` — ∂L/∂x through LayerNorm without affine parameters
* ``relu_grad(grad_out, x)`` — ∂L/∂x through ReLU, with PyTorch's slope 0 at x = 0
* ``mlp_grads(grad_out, x, w1, b1, w2, b2)`` — all five gradients of the MLP block (tanh GELU), by the chain rule
* ``central_difference_grad(f, x, h)`` — the finite differences ``gradcheck`` compares a backward pass with
* ``depth_gradient_norms(weights, h0, grad_out, residual)`` — ‖∂L/∂h_l‖ at every layer of a tanh stack, by hand
* ``descent_flow_rate(a, eta)`` — the rate of the gradient flow that gradient descent follows exactly (SymPy)

Each checker compares with :mod:`transformer_lab.backprop` on fixed float64 cases. It cannot tell whether the
answer called ``torch.autograd``; the exercises ask for the formula, and autograd is the way to check it.
"""

from __future__ import annotations

import sympy as sp
import torch

from transformer_lab import backprop
from transformer_lab.exercises import CheckResult, check_expression, check_function, describe_difference, generator
from transformer_lab.mlp import MLP

D = torch.float64
LOOSE = {"atol": 1e-6, "rtol": 1e-5}  # float32 rounding: an answer this close on every case has the right formula
_FLOAT32 = ("compute in float64 (the inputs are float64; a .float(), or a tensor made without dtype=, rounds to "
            "about 7 digits)")
_GELU_CONSTANTS = ("a constant may be truncated: use math.sqrt(2 / math.pi) and 0.044715 as Python floats (a literal "
                   "like 0.79788456, or torch.tensor(2 / torch.pi), which is float32, loses digits)")
_NEAR = "a float32 intermediate or a finite difference loses digits: compute the formula itself in float64"


def _tensors(value) -> list:
    return [t for v in value for t in _tensors(v)] if isinstance(value, tuple | list) else [value]


def _not_float64(got) -> torch.dtype | None:
    """The first floating dtype other than float64 among the tensors of ``got``, if any."""
    return next((t.dtype for t in _tensors(got) if isinstance(t, torch.Tensor) and t.is_floating_point()
                 and t.dtype != D), None)


def _relative_error(got, expected) -> float:
    """The largest ‖got − expected‖_max / ‖expected‖_max over the outputs."""
    return max(((torch.as_tensor(g, dtype=D) - e).abs().max() / e.abs().max().clamp(min=1e-300)).item()
               for g, e in zip(_tensors(got), _tensors(expected), strict=True))


def _constant_hint(got, expected) -> str | None:
    """For GELU′: a float64 answer within 5e-5 (relative) of the reference, beyond rounding, suggests a truncated
    constant (0.0447 for 0.044715 gives 8e-6)."""
    if not all(isinstance(g, torch.Tensor) and g.dtype == D and g.shape == e.shape
               for g, e in zip(_tensors(got), _tensors(expected), strict=False)):
        return None
    if len(_tensors(got)) != len(_tensors(expected)):
        return None
    worst = _relative_error(got, expected)
    return f"close (relative error {worst:.1e}): {_GELU_CONSTANTS}" if worst < 5e-5 else None


def _slip_hint(reference, cases, slips):
    """A hint for answers that match a typical slip: ``slips`` is [(slip(**case) -> the slip's answer, message)].

    The case is found from the reference output ``expected``; the hint names a slip only when the answer equals
    that slip's answer on this case (to float32 rounding)."""
    table = [(reference(**c), c) for c in cases]

    def same(a, b, **tol) -> bool:
        a, b = _tensors(a), _tensors(b)
        return len(a) == len(b) and all(isinstance(u, torch.Tensor) and u.shape == v.shape and torch.allclose(
            u.to(D), v.to(D), **tol) for u, v in zip(a, b, strict=True))

    def hint(got, expected):
        case = next((c for e, c in table if same(e, expected, atol=0.0, rtol=0.0)), None)
        if case is None:
            return None
        return next((msg for slip, msg in slips if same(got, slip(**case), **LOOSE)), None)
    return hint


def _first_hint(*hints):
    """The first hint that has something to say."""
    return lambda got, expected: next((m for h in hints if (m := h(got, expected))), None)


def _compare(atol: float, rtol: float, hint=None, dtype_note: bool = True):
    """describe_difference, plus a note when the result is not float64, plus ``hint(got, expected)`` for an
    exercise's typical slips."""
    def compare(got, expected):
        msg = describe_difference(got, expected, atol=atol, rtol=rtol)
        if msg is None:
            return None
        dtype = _not_float64(got) if dtype_note else None
        notes = [f"your result is {dtype}: {_FLOAT32}" if dtype else None, hint(got, expected) if hint else None]
        return "; ".join([msg, *(n for n in notes if n)])
    return compare


def _check(name, fn, reference, cases, *, atol, rtol, hint=None, near=_NEAR) -> CheckResult:
    """check_function at (atol, rtol); if that fails, again at float32 tolerance (LOOSE) on every case.

    Failing there too: the first large miss, with the exercise's hint. Passing there: the answer is right up to
    rounding on every case, and the message says so, naming the likely cause (a float32 result, else ``near``).
    """
    cases = list(cases)
    strict = check_function(name, fn, reference, cases, compare=_compare(atol, rtol, hint))
    if strict.passed:
        return strict
    loose = check_function(name, fn, reference, cases, compare=_compare(**LOOSE, hint=hint))
    if not loose.passed:
        return loose
    first = check_function(name, fn, reference, cases, compare=_compare(atol, rtol, dtype_note=False))
    seen = []  # (dtype, relative error) on every case

    def record(got, expected):
        seen.append((_not_float64(got), _relative_error(got, expected)))

    check_function(name, fn, reference, cases, compare=record)
    dtype, worst = next((d for d, _ in seen if d), None), max(r for _, r in seen)
    why = (f"your result is {dtype}; the formula looks right (within float32 rounding on every case): {_FLOAT32}"
           if dtype else f"close on every case (relative error up to {worst:.1e}) but not exact: {near}")
    return CheckResult(name, False, f"{first.message}; {why}")


# ---------------------------------------------------------------- 1. linear
def _ref_linear_grads(grad_out, x, weight):
    return backprop.linear_backward(grad_out, x, weight, bias=True)


def check_linear_grads(fn) -> CheckResult:
    """``fn(grad_out (N, d_out), x (N, d_in), weight (d_out, d_in)) -> (grad_x, grad_weight, grad_bias)``."""
    g = generator(1)
    cases = [{"grad_out": torch.randn(n, o, generator=g, dtype=D), "x": torch.randn(n, i, generator=g, dtype=D),
              "weight": torch.randn(o, i, generator=g, dtype=D)} for n, i, o in ((4, 3, 5), (1, 2, 2), (7, 6, 3))]
    return _check("linear_grads", fn, _ref_linear_grads, cases, atol=1e-10, rtol=1e-9)


# ---------------------------------------------------------------- 2. GELU′ (tanh form)
_EXACT_FORM = ("this is the exact (erf) GELU′, Φ(x) + x φ(x); the exercise asks for the derivative of the tanh "
               "form ½ x (1 + tanh u), u = √(2/π)(x + 0.044715 x³)")


def _ref_gelu_tanh_grad(x):
    return backprop.gelu_grad(x, "tanh")


def check_gelu_tanh_grad(fn) -> CheckResult:
    """``fn(x) -> GELU′(x)`` elementwise, for GELU(x) = ½ x (1 + tanh(√(2/π)(x + 0.044715 x³)))."""
    g = generator(2)
    cases = [{"x": torch.linspace(-6, 6, 49, dtype=D)}, {"x": torch.randn(3, 4, generator=g, dtype=D) * 2},
             {"x": torch.tensor([0.0, -20.0, 20.0], dtype=D)}]
    exact = _slip_hint(_ref_gelu_tanh_grad, cases, [(lambda x: backprop.gelu_grad(x, "none"), _EXACT_FORM)])
    return _check("gelu_tanh_grad", fn, _ref_gelu_tanh_grad, cases, atol=1e-12, rtol=1e-11,
                  hint=_first_hint(exact, _constant_hint),
                  near=f"{_GELU_CONSTANTS}; a finite difference is not exact either")


# ---------------------------------------------------------------- 3. softmax + cross-entropy
def _ref_softmax_ce_grad(logits, targets):
    return backprop.softmax_cross_entropy_backward(logits, targets)


def check_softmax_ce_grad(fn) -> CheckResult:
    """``fn(logits (N, V), targets (N,)) -> (N, V)``: the gradient of the *mean* loss over the N rows."""
    g = generator(3)
    cases = [{"logits": torch.randn(4, 5, generator=g, dtype=D), "targets": torch.randint(0, 5, (4,), generator=g)},
             {"logits": torch.randn(1, 3, generator=g, dtype=D), "targets": torch.tensor([1])},
             {"logits": torch.tensor([[1000.0, 0.0, -1000.0], [5.0, 800.0, 1.0]], dtype=D),
              "targets": torch.tensor([1, 1])},  # huge logits: shift by the max
             {"logits": torch.tensor([[1000.0, 0.0], [-1000.0, -1001.0]], dtype=D),
              "targets": torch.tensor([0, 1])}]  # each row by its own max: the tensor's max leaves row 2 at exp(−2000)
    slips = _slip_hint(_ref_softmax_ce_grad, cases, [
        (lambda logits, targets: -_ref_softmax_ce_grad(logits, targets),
         "the sign is flipped: the gradient is p − y (softmax minus one-hot), not y − p"),
        (lambda logits, targets: _ref_softmax_ce_grad(logits, targets) * targets.numel(),
         "this is the gradient of the summed loss: the loss is the mean over the N rows, so divide p − y by N")])
    table = [(_ref_softmax_ce_grad(**c), _log_of_softmax_grad(**c)) for c in cases]

    def two_step(got, expected):  # autograd through log(softmax(z)): NaN where the route is NaN, the same elsewhere
        route = next((r for e, r in table if e.shape == expected.shape and torch.equal(e, expected)), None)
        if route is None or not isinstance(got, torch.Tensor) or got.shape != route.shape or route.isfinite().all():
            return None
        if not torch.allclose(got.detach().to(D), route, equal_nan=True, **LOOSE):
            return None
        return ("these logits are 1000 apart, so softmax rounds a probability to exactly 0 and log(0) = -inf; its "
                "derivative 1/p = inf times p's 0 is NaN: the two steps log(softmax(z)) are the trouble, not the "
                "shift (torch.softmax already shifts by the max). Use the one-step log_softmax (or F.cross_entropy)"
                ", or write p − y directly")

    return _check("softmax_ce_grad", fn, _ref_softmax_ce_grad, cases, atol=1e-10, rtol=1e-9,
                  hint=_first_hint(two_step, _softmax_hint, slips))


def _log_of_softmax_grad(logits, targets):
    """The gradient by autograd of the mean of −log(softmax(z))[y]: the two-step route, NaN where p rounds to 0."""
    z = logits.detach().clone().requires_grad_()
    loss = -torch.log(torch.softmax(z, -1)).gather(-1, targets[:, None]).mean()
    return torch.autograd.grad(loss, z)[0]


def _softmax_hint(got, expected):
    if isinstance(got, torch.Tensor) and got.is_floating_point() and not torch.isfinite(got).all():
        return ("shift each row by its own largest logit (logits.max(-1, keepdim=True)) before exp; one shift for "
                "the whole tensor still overflows or underflows in some row")
    return None


# ---------------------------------------------------------------- 4. LayerNorm
def _ref_layer_norm_grad(grad_out, x, eps):
    return backprop.layer_norm_backward(grad_out, x, None, eps)[0]


def check_layer_norm_grad(fn) -> CheckResult:
    """``fn(grad_out (N, C), x (N, C), eps) -> (N, C)``: ∂L/∂x for y = (x − μ)/√(σ² + ε) over the last dim."""
    g = generator(4)
    cases = [{"grad_out": torch.randn(3, 6, generator=g, dtype=D), "x": torch.randn(3, 6, generator=g, dtype=D),
              "eps": 1e-5},
             {"grad_out": torch.randn(2, 4, generator=g, dtype=D), "x": torch.full((2, 4), 2.0, dtype=D),
              "eps": 1e-5},  # zero variance
             {"grad_out": torch.randn(5, 8, generator=g, dtype=D), "x": torch.randn(5, 8, generator=g, dtype=D) * 3,
              "eps": 0.1},
             {"grad_out": torch.randn(3, 6, generator=g, dtype=D), "x": torch.randn(3, 6, generator=g, dtype=D) * 1e-3,
              "eps": 1e-5}]
    cases.insert(0, cases.pop())  # first: σ² ~ 1e-6 < ε, where ε's place (inside the root or not) changes it by O(1)
    # last: rows whose mean (10⁶) is far above their spread (1): a one-pass σ² = mean(x²) − μ² subtracts two numbers
    # near 10¹² that agree to 12 of their 16 digits, an error of ~1e-4 in σ²; two passes, mean((x − μ)²), lose nothing
    cases.append({"grad_out": torch.randn(3, 8, generator=g, dtype=D),
                  "x": torch.randn(3, 8, generator=g, dtype=D) + 1e6, "eps": 1e-5})
    large_mean = cases[-1]
    slips = _slip_hint(_ref_layer_norm_grad, cases, [
        (_ln_with(lambda x, eps: 1 / torch.sqrt(x.var(-1, keepdim=True) + eps)),
         "this uses the unbiased variance (÷ (C − 1)); LayerNorm's σ² is the biased one, ÷ C "
         "(x.var(-1, unbiased=False))"),
        (_ln_with(lambda x, eps: 1 / (x.var(-1, unbiased=False, keepdim=True).sqrt() + eps)),
         "ε is outside the root: r = 1/√(σ² + ε), not 1/(σ + ε)"),
        (_ln_with(lambda x, eps: 1 / x.var(-1, unbiased=False, keepdim=True).sqrt()),
         "ε is left out: r = 1/√(σ² + ε)"),
        (lambda grad_out, x, eps: grad_out / torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + eps),
         "this treats μ and σ as constants: they depend on x, which adds − mean(ĝ) − x̂ ⊙ mean(ĝ ⊙ x̂)")])
    reference_large = _ref_layer_norm_grad(**large_mean)

    def one_pass(got, expected):  # wrong only on the large-mean rows: σ² by cancellation (or another unstable form)
        if expected.shape != reference_large.shape or not torch.equal(expected, reference_large) or _not_float64(got):
            return None  # another case, or a float32 result (its own note says so)
        return ("these rows have mean 10⁶ and spread 1: a one-pass variance mean(x²) − μ² subtracts two numbers "
                "near 10¹² that agree in 12 of float64's 16 digits, so σ² (and r) keeps ~4 right digits; compute μ "
                "first, then σ² = mean((x − μ)²) and x̂ from x − μ (two passes)")
    return _check("layer_norm_grad", fn, _ref_layer_norm_grad, cases, atol=1e-9, rtol=1e-8,
                  hint=_first_hint(slips, one_pass))


def _ln_with(r_of):
    """LayerNorm's ∂L/∂x with r = r_of(x, eps) in place of 1/√(σ² + ε) (a typical slip)."""
    def grad(grad_out, x, eps):
        r = r_of(x, eps)
        xhat = (x - x.mean(-1, keepdim=True)) * r
        return r * (grad_out - grad_out.mean(-1, keepdim=True) - xhat * (grad_out * xhat).mean(-1, keepdim=True))
    return grad


# ---------------------------------------------------------------- 5. ReLU
def _ref_relu_grad(grad_out, x):
    return backprop.relu_backward(grad_out, x)


def _compare_relu(x):
    def compare(got, expected):
        msg = describe_difference(got, expected, atol=1e-12, rtol=1e-12)
        if msg and isinstance(got, torch.Tensor) and got.shape == expected.shape:
            got = got.to(D)
            if torch.equal(got, (x > 0).to(D)) or torch.equal(got, (x >= 0).to(D)):
                return f"{msg}; this is ReLU′(x) itself: the chain rule multiplies it by the upstream grad_out"
            if torch.equal(got, x.clamp(min=0)):
                return f"{msg}; this is ReLU(x), the forward value, not ∂L/∂x = grad_out ⊙ ReLU′(x)"
            zero = x == 0
            if zero.any() and not torch.allclose(got[zero], expected[zero]) and torch.allclose(got[~zero],
                                                                                             expected[~zero]):
                return (f"{msg}; only the entries where x = 0 differ: there ReLU has no derivative (its "
                        "subdifferential is [0, 1]) and PyTorch's convention, ours, is the slope 0, i.e. x > 0, "
                        "not x >= 0")
        return msg
    return compare


def check_relu_grad(fn) -> CheckResult:
    """``fn(grad_out, x) -> ∂L/∂x`` of y = max(0, x) elementwise, any shape, with the slope 0 at x = 0."""
    g = generator(5)
    xs = [torch.tensor([-2.0, -0.5, 0.0, 0.5, 2.0], dtype=D), torch.randn(3, 4, generator=g, dtype=D),
          torch.tensor([[0.0, -0.0, 1e-300], [-1e-300, 0.0, 3.0]], dtype=D)]
    for i, x in enumerate(xs):
        result = check_function("relu_grad", fn, _ref_relu_grad,
                                [{"grad_out": torch.randn(x.shape, generator=g, dtype=D) + 2.0, "x": x}],
                                compare=_compare_relu(x))
        if not result.passed:
            return CheckResult(result.name, False, result.message.replace("on case 1", f"on case {i + 1}"))
    return CheckResult("relu_grad", True, f"matches the reference on all {len(xs)} cases")


# ---------------------------------------------------------------- 6. the MLP block
def _ref_mlp_grads(grad_out, x, w1, b1, w2, b2):
    mlp = MLP(x.shape[-1], w1.shape[0], approximate="tanh").to(D)
    with torch.no_grad():
        for param, value in ((mlp.fc.weight, w1), (mlp.fc.bias, b1), (mlp.proj.weight, w2), (mlp.proj.bias, b2)):
            param.copy_(value)
    _, cache = mlp.forward_with_cache(x)
    g = mlp.backward(grad_out, cache)
    return g["x"], g["fc.weight"], g["fc.bias"], g["proj.weight"], g["proj.bias"]


def _mlp_hint(got, expected):
    if not (isinstance(got, tuple | list) and len(got) == 5 and all(
            isinstance(g, torch.Tensor) and g.shape == e.shape for g, e in zip(got, expected, strict=True))):
        return None  # a wrong count or shape: describe_difference has said it
    if _constant_hint(got, expected):
        return _constant_hint(got, expected)
    ok = [describe_difference(g, e, atol=1e-10, rtol=1e-9) is None for g, e in zip(got, expected, strict=True)]
    if ok[3] and ok[4] and not any(ok[:3]):
        return ("∂L/∂W₂ and ∂L/∂b₂ are right and all three gradients of fc are wrong, so the slip is likely in "
                "∂L/∂h = (G W₂) ⊙ GELU′(h): the tanh form's GELU′, at the pre-activation h = x W₁ᵀ + b₁")
    if ok[3] and ok[4] and any(ok[:3]):
        return ("some gradients of fc are right, so ∂L/∂h is: check fc's backward, ∂L/∂x = G_h W₁, "
                "∂L/∂W₁ = G_hᵀ x, ∂L/∂b₁ = Σ_n G_h (a sum over positions, not a mean), with G_h = ∂L/∂h")
    if ok[4] and not ok[3]:
        return "∂L/∂W₂ = Gᵀ a, with a = GELU_tanh(h) (the tanh form) the activation that enters proj"
    return None


def _mlp_with_slope(slope):
    """The MLP block's gradients with ∂L/∂h = (G W₂) ⊙ slope(h, a) (a typical slip in place of GELU′_tanh(h))."""
    def grads(grad_out, x, w1, b1, w2, b2):
        h = x @ w1.T + b1
        a = backprop.gelu(h, "tanh")
        g_h = (grad_out @ w2) * slope(h, a)
        return g_h @ w1, g_h.T @ x, g_h.sum(0), grad_out.T @ a, grad_out.sum(0)
    return grads


def check_mlp_grads(fn) -> CheckResult:
    """``fn(grad_out (N, C), x (N, C), w1 (H, C), b1 (H,), w2 (C, H), b2 (C,))`` -> ``(∂L/∂x, ∂L/∂W₁, ∂L/∂b₁,
    ∂L/∂W₂, ∂L/∂b₂)`` for y = GELU_tanh(x W₁ᵀ + b₁) W₂ᵀ + b₂."""
    g = generator(6)
    cases = [{"grad_out": torch.randn(n, c, generator=g, dtype=D), "x": torch.randn(n, c, generator=g, dtype=D),
              "w1": torch.randn(h, c, generator=g, dtype=D), "b1": torch.randn(h, generator=g, dtype=D),
              "w2": torch.randn(c, h, generator=g, dtype=D), "b2": torch.randn(c, generator=g, dtype=D)}
             for n, c, h in ((5, 3, 7), (1, 2, 4), (6, 4, 9))]  # H ≠ C ≠ N: a transpose shows as a wrong shape
    slips = _slip_hint(_ref_mlp_grads, cases, [
        (_mlp_with_slope(lambda h, a: backprop.gelu_grad(h, "none")),
         "∂L/∂h uses the exact (erf) GELU′, Φ(h) + h φ(h), but the block's GELU is the tanh form: use the tanh "
         "form's derivative"),
        (_mlp_with_slope(lambda h, a: backprop.gelu_grad(a, "tanh")),
         "GELU′ is evaluated at the activation a = GELU(h); it belongs at the pre-activation h = x W₁ᵀ + b₁")])
    return _check("mlp_grads", fn, _ref_mlp_grads, cases, atol=1e-10, rtol=1e-9, hint=_first_hint(slips, _mlp_hint),
                  near=f"{_GELU_CONSTANTS} (in GELU and GELU′); a finite difference is not exact either")


# ---------------------------------------------------------------- 7. what gradcheck compares with
def _ref_central_difference_grad(f, x, h):
    """(f(x + h eᵢ) − f(x − h eᵢ)) / 2h for every entry i of x: the estimate gradcheck compares a backward pass with."""
    out = torch.empty_like(x)
    for i in range(x.numel()):
        e = torch.zeros_like(x).view(-1)
        e[i] = h
        e = e.view_as(x)
        out.view(-1)[i] = (f(x + e) - f(x - e)) / (2 * h)
    return out


def _difference_slip(*, forward=False, half=False, together=False, unrestored=False, left_up=False, aliased=False):
    def slip(f, x, h):
        if together:  # every entry moved at once: a directional derivative along (1, …, 1)
            return torch.full_like(x, float((f(x + h) - f(x - h)) / (2 * h)))
        out, x = torch.empty_like(x), x.clone()
        for i in range(x.numel()):
            flat = x.view(-1)
            flat[i] += h
            up = f(x)
            flat[i] -= h if forward or aliased else 2 * h  # aliased: x_minus = x, so −h lands back on x
            down = f(x)
            if left_up:  # the minus step was taken on a copy: x keeps + h
                flat[i] += 2 * h
            elif not unrestored:
                flat[i] += 0 if forward or aliased else h
            out.view(-1)[i] = (up - down) / (h if forward or half else 2 * h)
        return out
    return slip


def _exact_grad(f, x, h):
    x = x.detach().clone().requires_grad_()
    return torch.autograd.grad(f(x), x)[0]


_DIFF_SLIPS = [
    (_difference_slip(forward=True), "that is the one-sided difference (f(x + h eᵢ) − f(x))/h, whose error is O(h); "
                                     "gradcheck uses the central one, (f(x + h eᵢ) − f(x − h eᵢ))/2h, error O(h²)"),
    (_difference_slip(half=True), "the two points are 2h apart: divide by 2h, not h"),
    (_difference_slip(together=True), "you moved every entry at once, which gives the derivative along (1, …, 1); "
                                      "move one entry at a time, the others unchanged"),
    (_difference_slip(unrestored=True), "put each entry back after perturbing it: later entries were differenced "
                                        "at a shifted point"),
    (_difference_slip(left_up=True), "put each entry back after perturbing it: x[i] was left at x[i] + h (an x_plus "
                                     "= x is the same tensor, not a copy), so later entries were differenced at a "
                                     "shifted point: perturb a copy, x.clone(), or restore x[i] after both "
                                     "evaluations"),
    (_difference_slip(aliased=True), "x_plus and x_minus are the same tensor as x (x_plus = x does not copy), so the "
                                     "step −h undid the step +h and f was evaluated at x + h eᵢ and x, not x − h eᵢ: "
                                     "perturb copies, x.clone()"),
    (_exact_grad, "this is the exact derivative (autograd's answer); the exercise asks for the finite-difference "
                  "estimate, which differs from it by O(h²): that gap is what gradcheck's tolerance allows"),
]


def check_central_difference_grad(fn) -> CheckResult:
    """``fn(f, x, h) -> tensor shaped like x``: the central difference of the scalar function f at x, entry by entry."""
    g = generator(7)
    cases = [{"f": lambda x: (x.sin() * x).sum(), "x": torch.randn(5, generator=g, dtype=D), "h": 1e-2},
             {"f": lambda x: torch.logsumexp(x, dim=-1).sum(), "x": torch.randn(2, 3, generator=g, dtype=D),
              "h": 1e-3},
             {"f": lambda x: (x**3).sum() + x[0] * x[-1], "x": torch.randn(4, generator=g, dtype=D), "h": 0.1}]
    slips = [(lambda f, x, h, s=s: s(f, x.clone(), h), msg) for s, msg in _DIFF_SLIPS]
    hint = _slip_hint(_ref_central_difference_grad, cases, slips)
    return check_function("central_difference_grad", fn, _ref_central_difference_grad, cases,
                          compare=_compare(1e-10, 1e-8, hint))


# ---------------------------------------------------------------- 8. the flow that gradient descent follows exactly
_A, _ETA = sp.symbols("a eta", positive=True)


def _ref_descent_flow_rate(a, eta):
    """θ₀(1 − ηa)^k = θ₀e^{−r·kη} for every k ⇔ e^{−rη} = 1 − ηa ⇔ r = −log(1 − ηa)/η (0 < ηa < 1)."""
    return -sp.log(1 - eta * a) / eta


def check_descent_flow_rate(fn) -> CheckResult:
    """``fn(a, eta) -> SymPy expression``: the r with θ₀(1 − ηa)^k = θ₀e^{−r kη}: gradient descent on ½aθ² is exactly
    the gradient flow of ½rθ² sampled at t = kη."""
    hints = [(lambda a, eta: a, "that is the flow's own rate: gradient descent follows it only as η → 0; ask which "
                                "rate r makes e^{−rη} equal the per-step factor 1 − ηa"),
             (lambda a, eta: sp.log(1 - eta * a) / eta, "the sign: 1 − ηa < 1, so log(1 − ηa) < 0 and the rate "
                                                        "−log(1 − ηa)/η is positive"),
             (lambda a, eta: -sp.log(1 - eta * a), "that is the decay per step; time advances by η per step, so "
                                                   "divide by η for the rate per unit time"),
             (lambda a, eta: a + eta * a**2 / 2, "those are the first two terms of the series in η; the question "
                                                 "asks for the exact rate"),
             (lambda a, eta: sp.log(1 + eta * a) / eta, "the per-step factor is 1 − ηa (θ − ηaθ), not 1 + ηa"),
             (lambda a, eta: -sp.log(1 - eta * a) / (eta * a), "that is r/a, the ratio to the flow's rate; return "
                                                               "r itself")]
    return check_expression("descent_flow_rate", fn, _ref_descent_flow_rate, [{"a": _A, "eta": _ETA}], hints=hints)


# ---------------------------------------------------------------- 9. the gradient through depth
def _depth_norms(weights, h0, grad_out, residual, *, transpose=False, identity=True, slope_at="z", order=-1,
                 forward=False):
    """‖∂L/∂h_l‖ for l = 0 … D through h_{l+1} = [h_l +] tanh(h_l W_lᵀ), backwards from grad_out = ∂L/∂h_D; the
    keywords make the typical slips: Wᵀ for W, no identity path, tanh′ at the wrong point, forward order, the
    activations' norms."""
    hs, zs = [h0], []
    for w in weights:
        zs.append(hs[-1] @ w.T)
        hs.append(hs[-1] + torch.tanh(zs[-1]) if residual else torch.tanh(zs[-1]))
    if forward:
        return torch.stack([h.norm() for h in hs])
    g, norms = grad_out, [grad_out.norm()]
    for w, z, h_next in zip(reversed(weights), reversed(zs), reversed(hs[1:]), strict=True):
        slope = 1 - torch.tanh(z) ** 2 if slope_at == "z" else 1 - h_next**2  # tanh′(z) = 1 − tanh²(z)
        branch = (g * slope) @ (w.T if transpose else w)  # ∂L/∂h_l through the branch: (g ⊙ tanh′(z)) W
        g = g + branch if residual and identity else branch
        norms.append(g.norm())
    return torch.stack(norms[::order])


def _ref_depth_gradient_norms(weights, h0, grad_out, residual):
    return _depth_norms(weights, h0, grad_out, residual)


def check_depth_gradient_norms(fn) -> CheckResult:
    """``fn(weights (D, C, C), h0 (N, C), grad_out (N, C), residual) -> (D + 1,)``: ‖∂L/∂h_l‖ (Frobenius) for
    l = 0 … D through h_{l+1} = tanh(h_l W_lᵀ), or h_l + tanh(h_l W_lᵀ) when ``residual``."""
    g = generator(8)
    cases = [{"weights": torch.randn(d, c, c, generator=g, dtype=D) * gain / c**0.5,
              "h0": torch.randn(n, c, generator=g, dtype=D), "grad_out": torch.randn(n, c, generator=g, dtype=D),
              "residual": residual}
             for d, c, n, gain, residual in ((4, 5, 3, 1.5, False), (4, 5, 3, 1.5, True), (6, 3, 2, 0.6, False),
                                             (3, 4, 1, 2.5, True), (1, 2, 2, 1.0, True))]
    slips = _slip_hint(_ref_depth_gradient_norms, cases, [
        (lambda **c: _depth_norms(**c, order=1), "the norms are in the wrong order: entry l belongs to h_l, from "
                                                 "the input h_0 to the output h_D"),
        (lambda **c: _depth_norms(**c, transpose=True), "z = h Wᵀ, so ∂L/∂h = (∂L/∂z) W, not (∂L/∂z) Wᵀ"),
        (lambda **c: _depth_norms(**c, identity=False),
         "a residual layer's Jacobian is I + J: the gradient that arrives also passes back unchanged, "
         "g + (g ⊙ tanh′(z)) W"),
        (lambda **c: _depth_norms(**c, slope_at="h"),
         "tanh′(z) = 1 − tanh²(z) at the pre-activation z = h_l W_lᵀ; in a residual layer h_{l+1} = h_l + tanh(z) "
         "is not tanh(z)"),
        (lambda **c: _depth_norms(**c, forward=True), "these are the activations' norms ‖h_l‖; the exercise asks "
                                                      "for the gradient's, ‖∂L/∂h_l‖, computed backwards from "
                                                      "grad_out")])
    return _check("depth_gradient_norms", fn, _ref_depth_gradient_norms, cases, atol=1e-12, rtol=1e-10, hint=slips)


EXERCISES = {"linear_grads": check_linear_grads, "gelu_tanh_grad": check_gelu_tanh_grad,
             "softmax_ce_grad": check_softmax_ce_grad, "layer_norm_grad": check_layer_norm_grad,
             "relu_grad": check_relu_grad, "mlp_grads": check_mlp_grads,
             "central_difference_grad": check_central_difference_grad, "descent_flow_rate": check_descent_flow_rate,
             "depth_gradient_norms": check_depth_gradient_norms}
