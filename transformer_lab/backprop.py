"""Hand-written backward passes (chapter 4, calculus: backpropagation).

Each ``*_backward`` takes the upstream gradient ``grad_out = ∂L/∂y`` (same shape as the forward output ``y``)
and the forward inputs, and returns ``∂L/∂input`` for every input: the chain rule, one node at a time.
The ``*Fn`` classes wrap forward + our backward as :class:`torch.autograd.Function` so that
``torch.autograd.gradcheck`` can test our backward against finite differences.
"""

from __future__ import annotations

import math

import torch

from transformer_lab.norm import layer_norm  # chapter 7: the forward pass of layer_norm_backward

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_GELU_C = 0.044715  # the cubic coefficient of the tanh approximation
_SATURATED = 10.0  # |x| beyond which the tanh form's 1 − tanh²u (u > 43) is exactly 0 in float16/32/64


def _check_same_shape(grad_out: torch.Tensor, shape, what: str) -> None:
    if tuple(grad_out.shape) != tuple(shape):
        raise ValueError(f"grad_out has shape {tuple(grad_out.shape)} but the output of {what} has shape "
                         f"{tuple(shape)}; they must match")


def _check_approximate(approximate: str) -> None:
    if approximate not in ("none", "tanh"):
        raise ValueError(f"approximate must be 'none' (exact erf form) or 'tanh', got {approximate!r}")


# ---------------------------------------------------------------- activations
def gelu(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """GELU(x) = x Φ(x) (``"none"``) or its tanh approximation (``"tanh"``), elementwise."""
    _check_approximate(approximate)
    if approximate == "none":
        return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))  # x Φ(x), Φ(x) = ½(1 + erf(x/√2))
    u = _SQRT_2_OVER_PI * (x + _GELU_C * x**3)  # u = √(2/π)(x + 0.044715 x³)
    return 0.5 * x * (1.0 + torch.tanh(u))  # ½ x (1 + tanh u)


def gelu_grad(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """GELU′(x) elementwise: Φ(x) + x φ(x), or the derivative of the tanh form.

    float16/bfloat16 inputs are computed in float32 and rounded once at the end (in bfloat16, ½(1 + t) cancels:
    at x = −3 the tanh form would give −0.0187 instead of −0.0116)."""
    _check_approximate(approximate)
    if x.dtype in (torch.float16, torch.bfloat16):
        return gelu_grad(x.float(), approximate).to(x.dtype)
    if approximate == "none":
        cdf = 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0)))  # Φ(x)
        pdf = torch.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)  # φ(x)
        return cdf + x * pdf  # Φ(x) + x φ(x)
    t = torch.tanh(_SQRT_2_OVER_PI * (x + _GELU_C * x**3))
    # beyond |x| = 10, 1 − t² is 0 in every float dtype; clamping keeps x u′ finite there (float16: x² overflows
    # past |x| ≈ 256, and inf · 0 would be NaN); for |x| ≤ 10 nothing changes
    xc = x.clamp(-_SATURATED, _SATURATED)
    du = _SQRT_2_OVER_PI * (1.0 + 3.0 * _GELU_C * xc * xc)  # u′(x)
    return 0.5 * (1.0 + t) + 0.5 * xc * (1.0 - t * t) * du  # ½(1 + t) + ½ x (1 − t²) u′


def gelu_backward(grad_out: torch.Tensor, x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """∂L/∂x = ∂L/∂y ⊙ GELU′(x)."""
    _check_same_shape(grad_out, x.shape, "gelu")
    return grad_out * gelu_grad(x, approximate)


def relu(x: torch.Tensor) -> torch.Tensor:
    """max(0, x) elementwise."""
    return torch.clamp(x, min=0.0)


def relu_backward(grad_out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """∂L/∂x = ∂L/∂y ⊙ 1[x > 0]: at x = 0 we use the subgradient 0, as PyTorch does."""
    _check_same_shape(grad_out, x.shape, "relu")
    return grad_out * (x > 0).to(grad_out.dtype)


# ---------------------------------------------------------------- linear
def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """y = x Wᵀ + b for x (..., d_in), W (d_out, d_in), b (d_out,); y (..., d_out)."""
    if weight.dim() != 2:
        raise ValueError(f"weight must be 2-D (d_out, d_in), got shape {tuple(weight.shape)}")
    if x.dim() < 1 or x.shape[-1] != weight.shape[1]:
        raise ValueError(f"x has last dim {x.shape[-1] if x.dim() else None}, weight expects d_in={weight.shape[1]}")
    if bias is not None and tuple(bias.shape) != (weight.shape[0],):
        raise ValueError(f"bias must have shape ({weight.shape[0]},), got {tuple(bias.shape)}")
    y = x @ weight.T  # (..., d_out)
    return y if bias is None else y + bias


def linear_backward(grad_out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, *, bias: bool = True):
    """Gradients of y = x Wᵀ + b: returns (∂L/∂x, ∂L/∂W, ∂L/∂b or None).

    ∂L/∂x = G W (..., d_in);  ∂L/∂W = Gᵀ X summed over all leading dims (d_out, d_in);  ∂L/∂b = Σ G (d_out,).
    """
    if weight.dim() != 2 or x.shape[-1] != weight.shape[1]:
        raise ValueError(f"x (..., {x.shape[-1]}) does not fit weight of shape {tuple(weight.shape)}")
    _check_same_shape(grad_out, (*x.shape[:-1], weight.shape[0]), "linear")
    g2 = grad_out.reshape(-1, weight.shape[0])  # (N, d_out), N = product of leading dims
    x2 = x.reshape(-1, weight.shape[1])  # (N, d_in)
    grad_x = grad_out @ weight  # ∂L/∂x = G W
    grad_w = g2.T @ x2  # ∂L/∂W_ij = Σ_n G_ni x_nj
    grad_b = g2.sum(0) if bias else None  # ∂L/∂b_i = Σ_n G_ni
    return grad_x, grad_w, grad_b


# ---------------------------------------------------------------- softmax + cross-entropy
def softmax_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean over positions of −log softmax(z)[y]; logits (..., V), integer targets (...)."""
    _check_ce(logits, targets)
    z = logits - logits.amax(-1, keepdim=True)  # shift: softmax is invariant, exp cannot overflow
    logp = z - torch.log(torch.exp(z).sum(-1, keepdim=True))  # log softmax
    return -logp.gather(-1, targets.unsqueeze(-1)).mean()


def softmax_cross_entropy_backward(logits: torch.Tensor, targets: torch.Tensor,
                                   grad_loss: float | torch.Tensor = 1.0) -> torch.Tensor:
    """∂L/∂z = (softmax(z) − onehot(y)) / N for the mean loss over N positions; shape of ``logits``."""
    _check_ce(logits, targets)
    z = logits - logits.amax(-1, keepdim=True)
    p = torch.exp(z)
    p = p / p.sum(-1, keepdim=True)  # softmax(z)
    p.scatter_add_(-1, targets.unsqueeze(-1), -torch.ones_like(p[..., :1]))  # p − y
    return p * (grad_loss / targets.numel())  # mean over N = targets.numel()


def _check_ce(logits: torch.Tensor, targets: torch.Tensor) -> None:
    if logits.dim() < 1 or tuple(targets.shape) != tuple(logits.shape[:-1]):
        raise ValueError(f"targets must have shape {tuple(logits.shape[:-1])} (logits minus the class dim), "
                         f"got {tuple(targets.shape)}")
    if targets.is_floating_point() or targets.numel() == 0:
        raise ValueError("targets must be a non-empty integer tensor of class indices")
    if targets.min() < 0 or targets.max() >= logits.shape[-1]:
        raise ValueError(f"targets must lie in [0, {logits.shape[-1]}), got range "
                         f"[{int(targets.min())}, {int(targets.max())}]")


# ---------------------------------------------------------------- LayerNorm
# LayerNorm: the forward pass is chapter 7's layer_norm (imported above); here only its gradient
def layer_norm_backward(grad_out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor | None = None,
                        eps: float = 1e-5):
    """Gradients of :func:`layer_norm`: returns (∂L/∂x, ∂L/∂γ, ∂L/∂β) (the last two None without γ).

    With ĝ = ∂L/∂y ⊙ γ and r = 1/√(σ² + ε):  ∂L/∂x = r (ĝ − mean(ĝ) − x̂ ⊙ mean(ĝ ⊙ x̂)).
    float16/bfloat16 inputs are computed in float32 and rounded once at the end (in float16, (x − μ)² overflows
    past |x − μ| ≈ 256 and r would be 0).
    """
    _check_same_shape(grad_out, x.shape, "layer_norm")
    if weight is not None and tuple(weight.shape) != (x.shape[-1],):
        raise ValueError(f"weight must have shape ({x.shape[-1]},), got {tuple(weight.shape)}")
    if x.dtype in (torch.float16, torch.bfloat16):
        grads = layer_norm_backward(grad_out.float(), x.float(), None if weight is None else weight.float(), eps)
        return tuple(None if g is None else g.to(x.dtype) for g in grads)
    mu = x.mean(-1, keepdim=True)
    r = torch.rsqrt(((x - mu) ** 2).mean(-1, keepdim=True) + eps)  # 1/√(σ² + ε)
    xhat = (x - mu) * r  # (..., C)
    gh = grad_out if weight is None else grad_out * weight  # ĝ = ∂L/∂x̂
    grad_x = r * (gh - gh.mean(-1, keepdim=True) - xhat * (gh * xhat).mean(-1, keepdim=True))
    if weight is None:
        return grad_x, None, None
    lead = tuple(range(x.dim() - 1))
    return grad_x, (grad_out * xhat).sum(lead), grad_out.sum(lead)  # ∂L/∂γ = Σ G ⊙ x̂, ∂L/∂β = Σ G


# ---------------------------------------------------------------- a deep stack (the chapter's depth figure)
STACKS = ("plain", "residual", "residual 1/√D", "pre-LN residual")


def stack_gradient_norms(weights, h0: torch.Tensor, grad_out: torch.Tensor, *, stack: str = "plain",
                         gain: float = 1.0, eps: float = 1e-5) -> torch.Tensor:
    """‖∂L/∂h_l‖ (Frobenius) for l = 0..D through D layers of width C, by the backward passes above.

    weights: D tensors (C, C); h0, grad_out = ∂L/∂h_D: (N, C). With f(h) = GELU(h (gain·W_l)ᵀ), layer l is
    ``"plain"``: h_{l+1} = f(h_l);  ``"residual"``: h_l + f(h_l);  ``"residual 1/√D"``: h_l + f(h_l)/√D;
    ``"pre-LN residual"``: h_l + f(LN(h_l)) (LayerNorm without γ, β). Returns a tensor of D + 1 norms.
    """
    if stack not in STACKS:
        raise ValueError(f"stack must be one of {STACKS}, got {stack!r}")
    scale = 1.0 / math.sqrt(len(weights)) if stack == "residual 1/√D" else 1.0
    hs, ins, pre = [h0], [], []
    for w in weights:  # forward, caching what backward needs
        inp = layer_norm(hs[-1], None, None, eps) if stack == "pre-LN residual" else hs[-1]
        z = inp @ (gain * w).T
        ins.append(inp)
        pre.append(z)
        hs.append(gelu(z) if stack == "plain" else hs[-1] + scale * gelu(z))
    g, norms = grad_out, [grad_out.norm()]
    for w, z, inp, h in zip(reversed(weights), reversed(pre), reversed(ins), reversed(hs[:-1]), strict=True):
        g_in = linear_backward(gelu_backward(scale * g, z), inp, gain * w, bias=False)[0]  # through f
        if stack == "pre-LN residual":
            g_in = layer_norm_backward(g_in, h, None, eps)[0]  # through LN
        g = g_in if stack == "plain" else g + g_in  # residual: the identity path adds the upstream gradient
        norms.append(g.norm())
    return torch.stack(norms[::-1])


# ---------------------------------------------------------------- as autograd Functions (for gradcheck)
class LinearFn(torch.autograd.Function):
    """y = x Wᵀ + b whose backward is :func:`linear_backward`."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        return linear(x, weight, bias)

    @staticmethod
    def backward(ctx, grad_out):
        x, weight = ctx.saved_tensors
        return linear_backward(grad_out, x, weight, bias=True)


class GELUFn(torch.autograd.Function):
    """GELU whose backward is :func:`gelu_backward`."""

    @staticmethod
    def forward(ctx, x, approximate="none"):
        ctx.save_for_backward(x)
        ctx.approximate = approximate
        return gelu(x, approximate)

    @staticmethod
    def backward(ctx, grad_out):
        (x,) = ctx.saved_tensors
        return gelu_backward(grad_out, x, ctx.approximate), None


class SoftmaxCrossEntropyFn(torch.autograd.Function):
    """Mean softmax cross-entropy whose backward is :func:`softmax_cross_entropy_backward`."""

    @staticmethod
    def forward(ctx, logits, targets):
        ctx.save_for_backward(logits, targets)
        return softmax_cross_entropy(logits, targets)

    @staticmethod
    def backward(ctx, grad_loss):
        logits, targets = ctx.saved_tensors
        return softmax_cross_entropy_backward(logits, targets, grad_loss), None


class LayerNormFn(torch.autograd.Function):
    """LayerNorm whose backward is :func:`layer_norm_backward`."""

    @staticmethod
    def forward(ctx, x, weight, bias, eps=1e-5):
        ctx.save_for_backward(x, weight)
        ctx.eps = eps
        return layer_norm(x, weight, bias, eps)

    @staticmethod
    def backward(ctx, grad_out):
        x, weight = ctx.saved_tensors
        return (*layer_norm_backward(grad_out, x, weight, ctx.eps), None)
