"""Chapter 4 (calculus) exercises: automatic checks.

* ``linear_grads(grad_out, x, weight)`` — (∂L/∂x, ∂L/∂W, ∂L/∂b) of y = x Wᵀ + b
* ``gelu_tanh_grad(x)`` — the derivative of the tanh-approximate GELU
* ``softmax_ce_grad(logits, targets)`` — ∂L/∂z of the mean softmax cross-entropy
* ``layer_norm_grad(grad_out, x, eps)`` — ∂L/∂x through LayerNorm without affine parameters
"""

from __future__ import annotations

import torch

from transformer_lab import backprop
from transformer_lab.exercises import CheckResult, check_function, generator

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
              "eps": 0.1}]
    return check_function("layer_norm_grad", fn, _ref_layer_norm_grad, cases, atol=1e-9, rtol=1e-8)


EXERCISES = {"linear_grads": check_linear_grads, "gelu_tanh_grad": check_gelu_tanh_grad,
             "softmax_ce_grad": check_softmax_ce_grad, "layer_norm_grad": check_layer_norm_grad}
