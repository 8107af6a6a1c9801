"""Chapter 4 (calculus) exercises: automatic checks.

* ``linear_grads(grad_out, x, weight)`` — (∂L/∂x, ∂L/∂W, ∂L/∂b) of y = x Wᵀ + b
* ``gelu_tanh_grad(x)`` — the derivative of the tanh-approximate GELU
* ``softmax_ce_grad(logits, targets)`` — ∂L/∂z of the mean softmax cross-entropy
* ``layer_norm_grad(grad_out, x, eps)`` — ∂L/∂x through LayerNorm without affine parameters
* ``relu_grad(grad_out, x)`` — ∂L/∂x through ReLU, with PyTorch's slope 0 at x = 0

Each checker compares with :mod:`transformer_lab.backprop` on fixed float64 cases. It cannot tell whether the
answer called ``torch.autograd``; the exercises ask for the formula, and autograd is the way to check it.
"""

from __future__ import annotations

import torch

from transformer_lab import backprop
from transformer_lab.exercises import CheckResult, check_function, describe_difference, generator

D = torch.float64


# ---------------------------------------------------------------- 1. linear
def _ref_linear_grads(grad_out, x, weight):
    return backprop.linear_backward(grad_out, x, weight, bias=True)


def check_linear_grads(fn) -> CheckResult:
    """``fn(grad_out (N, d_out), x (N, d_in), weight (d_out, d_in)) -> (grad_x, grad_weight, grad_bias)``."""
    g = generator(1)
    cases = [{"grad_out": torch.randn(n, o, generator=g, dtype=D), "x": torch.randn(n, i, generator=g, dtype=D),
              "weight": torch.randn(o, i, generator=g, dtype=D)} for n, i, o in ((4, 3, 5), (1, 2, 2), (7, 6, 3))]
    return check_function("linear_grads", fn, _ref_linear_grads, cases, atol=1e-10, rtol=1e-9)


# ---------------------------------------------------------------- 2. GELU′ (tanh form)
def _ref_gelu_tanh_grad(x):
    return backprop.gelu_grad(x, "tanh")


def check_gelu_tanh_grad(fn) -> CheckResult:
    """``fn(x) -> GELU′(x)`` elementwise, for GELU(x) = ½ x (1 + tanh(√(2/π)(x + 0.044715 x³)))."""
    g = generator(2)
    cases = [{"x": torch.linspace(-6, 6, 49, dtype=D)}, {"x": torch.randn(3, 4, generator=g, dtype=D) * 2},
             {"x": torch.tensor([0.0, -20.0, 20.0], dtype=D)}]
    return check_function("gelu_tanh_grad", fn, _ref_gelu_tanh_grad, cases, atol=1e-10, rtol=1e-9)


# ---------------------------------------------------------------- 3. softmax + cross-entropy
def _ref_softmax_ce_grad(logits, targets):
    return backprop.softmax_cross_entropy_backward(logits, targets)


def check_softmax_ce_grad(fn) -> CheckResult:
    """``fn(logits (N, V), targets (N,)) -> (N, V)``: the gradient of the *mean* loss over the N rows."""
    g = generator(3)
    cases = [{"logits": torch.randn(4, 5, generator=g, dtype=D), "targets": torch.randint(0, 5, (4,), generator=g)},
             {"logits": torch.randn(1, 3, generator=g, dtype=D), "targets": torch.tensor([1])},
             {"logits": torch.tensor([[1000.0, 0.0, -1000.0], [5.0, 800.0, 1.0]], dtype=D),
              "targets": torch.tensor([1, 1])}]  # huge logits: shift by the max
    return check_function("softmax_ce_grad", fn, _ref_softmax_ce_grad, cases, atol=1e-10, rtol=1e-9)


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
              "eps": 1e-5}]  # σ² ~ 1e-6 < ε: where ε sits (inside the root or not) changes the answer by O(1)
    return check_function("layer_norm_grad", fn, _ref_layer_norm_grad, cases, atol=1e-9, rtol=1e-8)


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


EXERCISES = {"linear_grads": check_linear_grads, "gelu_tanh_grad": check_gelu_tanh_grad,
             "softmax_ce_grad": check_softmax_ce_grad, "layer_norm_grad": check_layer_norm_grad,
             "relu_grad": check_relu_grad}
