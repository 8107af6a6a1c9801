"""Chapter-4 exercise checkers: accept the solution and correct answers in other styles; reject the typical
wrong answers (CATALOGUE) with a message naming the difference and, where one exists, a hint. A fragment written
"!text" in a CATALOGUE entry must NOT appear in the message (a hint that would mislead for that answer)."""

import math

import pytest
import sympy as sp
import torch
import torch.nn.functional as F
from conftest import assert_accepted, assert_rejected, right_answers, wrong_answers

from transformer_lab.exercises import ch4, registry

C = 0.044715
K = math.sqrt(2 / math.pi)
NOT_RIGHT = "!the formula looks right"  # a hint that must not appear for a wrong formula


# ---------------------------------------------------------------- solutions (as in the chapter)
def linear_grads(grad_out, x, weight):
    return grad_out @ weight, grad_out.T @ x, grad_out.sum(0)


def gelu_tanh_grad(x):
    t = torch.tanh(K * (x + C * x**3))
    return 0.5 * (1 + t) + 0.5 * x * (1 - t**2) * K * (1 + 3 * C * x**2)


def softmax_ce_grad(logits, targets):
    z = logits - logits.max(-1, keepdim=True).values
    p = z.exp() / z.exp().sum(-1, keepdim=True)
    p[torch.arange(len(targets)), targets] -= 1
    return p / len(targets)


def layer_norm_grad(grad_out, x, eps):
    r = 1 / torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + eps)
    xhat = (x - x.mean(-1, keepdim=True)) * r
    return r * (grad_out - grad_out.mean(-1, keepdim=True) - xhat * (grad_out * xhat).mean(-1, keepdim=True))


def relu_grad(grad_out, x):
    return grad_out * (x > 0)


def mlp_grads(grad_out, x, w1, b1, w2, b2):
    h = x @ w1.T + b1
    a = 0.5 * h * (1 + torch.tanh(K * (h + C * h**3)))
    g_a = grad_out @ w2
    g_h = g_a * gelu_tanh_grad(h)
    return g_h @ w1, g_h.T @ x, g_h.sum(0), grad_out.T @ a, grad_out.sum(0)


def central_difference_grad(f, x, h):
    grad = torch.empty_like(x)
    for i in range(x.numel()):
        step = torch.zeros(x.numel(), dtype=x.dtype)
        step[i] = h
        step = step.view_as(x)
        grad.view(-1)[i] = (f(x + step) - f(x - step)) / (2 * h)
    return grad


def descent_flow_rate(a, eta):
    r = sp.Symbol("r", positive=True)
    (rate,) = sp.solve(sp.Eq(sp.exp(-r * eta), 1 - eta * a), r)
    return rate


def depth_gradient_norms(weights, h0, grad_out, residual):
    hs, zs = [h0], []
    for w in weights:  # forward, keeping each pre-activation z_l = h_l W_lᵀ
        zs.append(hs[-1] @ w.T)
        hs.append(hs[-1] + torch.tanh(zs[-1]) if residual else torch.tanh(zs[-1]))
    g, norms = grad_out, [grad_out.norm()]
    for w, z in zip(reversed(weights), reversed(zs), strict=True):  # backward: g ← g (I + J)ᵀ or g Jᵀ
        branch = (g * (1 - torch.tanh(z) ** 2)) @ w
        g = g + branch if residual else branch
        norms.append(g.norm())
    return torch.stack(norms[::-1])


def _depth_by_autograd(weights, h0, grad_out, residual):
    hs = [h0.clone().requires_grad_()]
    for w in weights:
        h = hs[-1]
        hs.append(h + torch.tanh(h @ w.T) if residual else torch.tanh(h @ w.T))
    return torch.stack([g.norm() for g in torch.autograd.grad(hs[-1], hs, grad_out)])


def _depth_by_jacobians(weights, h0, grad_out, residual):
    """One row at a time, the explicit C × C Jacobian of every layer."""
    norms = torch.zeros(len(weights) + 1, dtype=h0.dtype)
    for x, g in zip(h0, grad_out, strict=True):
        hs = [x]
        for w in weights:
            hs.append(hs[-1] + torch.tanh(w @ hs[-1]) if residual else torch.tanh(w @ hs[-1]))
        gs = [g]
        for w, h in zip(reversed(weights), reversed(hs[:-1]), strict=True):
            J = torch.diag(1 - torch.tanh(w @ h) ** 2) @ w
            gs.append(gs[-1] @ ((torch.eye(len(h), dtype=h.dtype) + J) if residual else J))
        norms += torch.stack([v.pow(2).sum() for v in gs[::-1]])
    return norms.sqrt()


SOLUTIONS = {"linear_grads": linear_grads, "gelu_tanh_grad": gelu_tanh_grad, "softmax_ce_grad": softmax_ce_grad,
             "layer_norm_grad": layer_norm_grad, "relu_grad": relu_grad, "mlp_grads": mlp_grads,
             "central_difference_grad": central_difference_grad, "descent_flow_rate": descent_flow_rate,
             "depth_gradient_norms": depth_gradient_norms}


# ---------------------------------------------------------------- typical wrong answers
def _ln(r_of):
    """LayerNorm's backward with r = r_of(biased variance, ε), otherwise right."""
    def fn(grad_out, x, eps):
        r = r_of(x.var(-1, unbiased=False, keepdim=True), eps)
        xhat = (x - x.mean(-1, keepdim=True)) * r
        return r * (grad_out - grad_out.mean(-1, keepdim=True) - xhat * (grad_out * xhat).mean(-1, keepdim=True))
    return fn


def _ln_one_pass(grad_out, x, eps):  # σ² = mean(x²) − μ²: cancels when the mean is far above the spread
    mu = x.mean(-1, keepdim=True)
    r = 1 / torch.sqrt((x * x).mean(-1, keepdim=True) - mu**2 + eps)
    xhat = (x - mu) * r
    return r * (grad_out - grad_out.mean(-1, keepdim=True) - xhat * (grad_out * xhat).mean(-1, keepdim=True))


def _gelu(du_factor=3 * C, scale=K, sech2=lambda t: 1 - t**2):
    """GELU_tanh′ with a typo in u′ = scale·(1 + du_factor·x²) or in sech² u."""
    def fn(x):
        t = torch.tanh(K * (x + C * x**3))
        return 0.5 * (1 + t) + 0.5 * x * sech2(t) * scale * (1 + du_factor * x**2)
    return fn


def _naive_softmax(logits, targets):  # no max-shift: NaN for huge logits
    p = logits.exp() / logits.exp().sum(-1, keepdim=True)
    p[torch.arange(len(targets)), targets] -= 1
    return p / len(targets)


def _ln_stats_constant(grad_out, x, eps):  # forgets that μ and σ depend on x
    return grad_out / torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + eps)


def _ln_unbiased(grad_out, x, eps):
    r = 1 / torch.sqrt(x.var(-1, keepdim=True) + eps)
    xhat = (x - x.mean(-1, keepdim=True)) * r
    return r * (grad_out - grad_out.mean(-1, keepdim=True) - xhat * (grad_out * xhat).mean(-1, keepdim=True))


def _ln_mean_gx(grad_out, x, eps):  # mean(ĝ x) instead of mean(ĝ x̂)
    r = 1 / torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + eps)
    xhat = (x - x.mean(-1, keepdim=True)) * r
    return r * (grad_out - grad_out.mean(-1, keepdim=True) - xhat * (grad_out * x).mean(-1, keepdim=True))


def _softmax_global_shift(logits, targets):  # one shift for the whole tensor, not per row
    z = logits - logits.max()
    p = z.exp() / z.exp().sum(-1, keepdim=True)
    p[torch.arange(len(targets)), targets] -= 1
    return p / len(targets)


def _gelu_float32_constant(x):  # right formula, √(2/π) as a float32 tensor
    k = torch.sqrt(torch.tensor(2 / torch.pi))
    t = torch.tanh(k * (x + C * x**3))
    return 0.5 * (1 + t) + 0.5 * x * (1 - t**2) * k * (1 + 3 * C * x**2)


def _gelu_finite_difference(h):
    """GELU_tanh′ by a central difference with step h: close, never exact."""
    def fn(x):
        f = lambda t: 0.5 * t * (1 + torch.tanh(K * (t + C * t**3)))  # noqa: E731
        return (f(x + h) - f(x - h)) / (2 * h)
    return fn


def _gelu_constants(k=K, c=C):
    """GELU_tanh′ with the constants √(2/π) and 0.044715 replaced by k and c."""
    def fn(x):
        t = torch.tanh(k * (x + c * x**3))
        return 0.5 * (1 + t) + 0.5 * x * (1 - t**2) * k * (1 + 3 * c * x**2)
    return fn


def _mlp_one_output(i, scale):
    """The right MLP gradients, except output i multiplied by scale (1/N: a mean instead of a sum)."""
    def fn(grad_out, x, w1, b1, w2, b2):
        grads = list(mlp_grads(grad_out, x, w1, b1, w2, b2))
        grads[i] = grads[i] * (scale if scale else 1 / len(x))
        return tuple(grads)
    return fn


def _mlp_exact_forward(grad_out, x, w1, b1, w2, b2):  # exact GELU forward, tanh GELU′ backward
    h = x @ w1.T + b1
    a = 0.5 * h * (1 + torch.erf(h / math.sqrt(2)))
    g_h = grad_out @ w2 * gelu_tanh_grad(h)
    return g_h @ w1, g_h.T @ x, g_h.sum(0), grad_out.T @ a, grad_out.sum(0)


def _mlp(slip):
    """The MLP backward with one typical slip: "gelu_at_a", "no_gelu_grad", "exact_gelu", "w2_from_h"."""
    def fn(grad_out, x, w1, b1, w2, b2):
        h = x @ w1.T + b1
        a = 0.5 * h * (1 + torch.tanh(K * (h + C * h**3)))
        slope = {"gelu_at_a": gelu_tanh_grad(a), "no_gelu_grad": torch.ones_like(h),
                 "exact_gelu": 0.5 * (1 + torch.erf(h / math.sqrt(2))) + h * torch.exp(-h * h / 2)
                 / math.sqrt(2 * math.pi)}.get(slip, gelu_tanh_grad(h))
        g_h = grad_out @ w2 * slope
        return g_h @ w1, g_h.T @ x, g_h.sum(0), grad_out.T @ (h if slip == "w2_from_h" else a), grad_out.sum(0)
    return fn


# ---------------------------------------------------------------- correct answers in other styles
def _linear_einsum(grad_out, x, weight):
    return torch.einsum("no,oi->ni", grad_out, weight), torch.einsum("no,ni->oi", grad_out, x), grad_out.sum(dim=0)


def _linear_outer_products(grad_out, x, weight):
    grad_w = sum(torch.outer(g, xi) for g, xi in zip(grad_out, x, strict=True))
    return (weight.T @ grad_out.T).T, grad_w, torch.ones(len(x), dtype=x.dtype) @ grad_out


def _gelu_sigmoid(x):  # ½(1 + tanh u) = σ(2u)
    s = torch.sigmoid(2 * K * (x + C * x**3))
    return s + x * s * (1 - s) * 2 * K * (1 + 3 * C * x**2)


def _gelu_cosh(x):
    u = K * (x + C * x**3)
    return 0.5 * (1 + torch.tanh(u)) + 0.5 * x * K * (1 + 3 * C * x**2) / torch.cosh(u) ** 2


def _softmax_one_hot(logits, targets):
    return (torch.softmax(logits, -1) - F.one_hot(targets, logits.shape[-1]).to(logits.dtype)) / len(targets)


def _softmax_logsumexp(logits, targets):
    p = torch.exp(logits - torch.logsumexp(logits, -1, keepdim=True))
    y = torch.zeros_like(p).scatter_(-1, targets[:, None], 1.0)
    return (p - y) / targets.numel()


def _ln_jacobian(grad_out, x, eps):  # Jᵀĝ with J = r(I − 11ᵀ/C − x̂x̂ᵀ/C) built explicitly, row by row
    n = x.shape[-1]
    var, mu = torch.var_mean(x, -1, unbiased=False, keepdim=True)
    r = torch.rsqrt(var + eps)
    xhat = (x - mu) * r
    eye = torch.eye(n, dtype=x.dtype)
    jac = r[..., None] * (eye - 1 / n - xhat[:, :, None] * xhat[:, None, :] / n)  # (N, C, C)
    return torch.einsum("nij,ni->nj", jac, grad_out)


def _ln_centered(grad_out, x, eps):
    xc = x - x.mean(-1, keepdim=True)
    std = (xc.pow(2).mean(-1, keepdim=True) + eps).sqrt()
    gc = grad_out - grad_out.mean(-1, keepdim=True)
    return gc / std - xc * (grad_out * xc).mean(-1, keepdim=True) / std**3


def _mlp_autograd_free_einsum(grad_out, x, w1, b1, w2, b2):  # einsum, with the sigmoid form of GELU_tanh
    h = torch.einsum("nc,hc->nh", x, w1) + b1
    s2 = torch.sigmoid(2 * K * (h + C * h**3))
    g_h = torch.einsum("nc,ch->nh", grad_out, w2) * (s2 + h * s2 * (1 - s2) * 2 * K * (1 + 3 * C * h**2))
    return (torch.einsum("nh,hc->nc", g_h, w1), torch.einsum("nh,nc->hc", g_h, x), g_h.sum(0),
            torch.einsum("nc,nh->ch", grad_out, h * s2), grad_out.sum(0))


def _mlp_with_package(grad_out, x, w1, b1, w2, b2):  # composing the package's layer backward passes
    from transformer_lab.backprop import gelu, gelu_backward, linear_backward
    h = x @ w1.T + b1
    g_a, g_w2, g_b2 = linear_backward(grad_out, gelu(h, "tanh"), w2)
    g_x, g_w1, g_b1 = linear_backward(gelu_backward(g_a, h, "tanh"), x, w1)
    return g_x, g_w1, g_b1, g_w2, g_b2


# ---------------------------------------------------------------- finite differences and the exact flow rate
def cd_in_place(f, x, h):  # perturb, evaluate, put back: the loop gradcheck itself runs
    x, grad = x.clone(), torch.empty_like(x)
    flat = x.view(-1)
    for i in range(flat.numel()):
        old = flat[i].item()
        flat[i] = old + h
        up = f(x)
        flat[i] = old - h
        down = f(x)
        flat[i] = old
        grad.view(-1)[i] = (up - down) / (2 * h)
    return grad


def cd_eye(f, x, h):  # all the steps at once, as rows of h·I
    steps = torch.eye(x.numel(), dtype=x.dtype) * h
    return torch.stack([(f(x + s.view_as(x)) - f(x - s.view_as(x))) / (2 * h) for s in steps]).view_as(x)


def cd_forward(f, x, h):
    return torch.stack([(f(x + s.view_as(x)) - f(x)) / h for s in torch.eye(x.numel(), dtype=x.dtype) * h]
                       ).view_as(x)


def cd_by_h(f, x, h):
    return cd_eye(f, x, h) * 2


def cd_together(f, x, h):
    return torch.full_like(x, ((f(x + h) - f(x - h)) / (2 * h)).item())


def cd_unrestored(f, x, h):
    x, grad = x.clone(), torch.empty_like(x)
    flat = x.view(-1)
    for i in range(flat.numel()):
        flat[i] += h
        up = f(x)
        flat[i] -= 2 * h
        grad.view(-1)[i] = (up - f(x)) / (2 * h)  # entry i left at x_i − h
    return grad


def cd_autograd(f, x, h):
    x = x.clone().requires_grad_()
    return torch.autograd.grad(f(x), x)[0]



def cd_plus_left(f, x, h):  # the minus point on a copy, the plus step left in x: x[i] stays at x[i] + h
    g = torch.zeros_like(x)
    for i in range(x.numel()):
        x.view(-1)[i] += h
        up = f(x)
        x_minus = x.clone()
        x_minus.view(-1)[i] -= 2 * h
        g.view(-1)[i] = (up - f(x_minus)) / (2 * h)
    return g


def cd_aliased(f, x, h):  # x_plus = x and x_minus = x: one tensor, so the −h step undoes the +h step
    g = torch.zeros_like(x)
    for i in range(x.numel()):
        x_plus = x
        x_plus.view(-1)[i] += h
        up = f(x_plus)
        x_minus = x
        x_minus.view(-1)[i] -= h
        g.view(-1)[i] = (up - f(x_minus)) / (2 * h)
    return g


def _softmax_then_log(logits, targets, nll=False):  # autograd through log(softmax(z)): two steps, NaN at p = 0
    z = logits.clone().requires_grad_()
    log_p = torch.log(torch.softmax(z, -1))
    loss = F.nll_loss(log_p, targets) if nll else -log_p.gather(-1, targets[:, None]).mean()
    return torch.autograd.grad(loss, z)[0]

CATALOGUE = {
    "linear_grads": {
        "wrong": [
            (lambda grad_out, x, weight: (grad_out @ weight, x.T @ grad_out, grad_out.sum(0)),
             ["output[1] has shape (3, 5), expected (5, 3)"]),  # ∂L/∂W transposed
            (lambda grad_out, x, weight: (grad_out @ weight, grad_out.T @ x, grad_out.mean(0)),
             ["output[2] differs"]),  # mean instead of sum over positions
            (lambda grad_out, x, weight: (grad_out @ weight, grad_out.T @ x), ["should have 3 items"]),
            (lambda grad_out, x, weight: (grad_out @ weight.T, grad_out.T @ x, grad_out.sum(0)), ["raised"]),
            (lambda grad_out, x, weight: (grad_out @ weight, grad_out.T @ x / len(x), grad_out.sum(0)),
             ["output[1] differs", "worst at"]),  # averaged ∂L/∂W
            (lambda grad_out, x, weight: tuple(t.float() for t in linear_grads(grad_out, x, weight)),
             ["output[0] differs", "your result is torch.float32", "the formula looks right", "compute in float64",
              "!constant"]),
            (lambda grad_out, x, weight: tuple(t.float() for t in (grad_out @ weight, grad_out.T @ x,
                                                                   grad_out.mean(0))),
             ["output[2] differs", "your result is torch.float32", NOT_RIGHT]),
        ],
        "right": [_linear_einsum, _linear_outer_products],
    },
    "gelu_tanh_grad": {
        "wrong": [
            (lambda x: 0.5 * (1 + torch.tanh(K * (x + C * x**3))), ["differs", "worst at"]),  # no product rule
            (lambda x: 0.5 * (1 + torch.erf(x / math.sqrt(2))) + x * torch.exp(-x * x / 2) / math.sqrt(2 * math.pi),
             ["differs", "this is the exact (erf) GELU′", "asks for the derivative of the tanh form"]),  # exact form
            (_gelu(du_factor=C), ["differs"]),  # d/dx x³ = x² forgotten the 3
            (_gelu(scale=1.0), ["differs"]),  # √(2/π) dropped from u′
            (_gelu(sech2=lambda t: 1 + t**2), ["differs"]),  # sign of tanh′ = 1 − tanh²
            (_gelu_float32_constant, ["differs", "a constant may be truncated", "torch.tensor(2 / torch.pi)",
                                      NOT_RIGHT, "!your result is"]),  # a float32 constant, float64 result
            (lambda x: gelu_tanh_grad(x.float()), ["your result is torch.float32", "the formula looks right",
                                                   "compute in float64", "!constant"]),
            (lambda x: gelu_tanh_grad(x) * (1 + 1e-4), ["differs", NOT_RIGHT, "!constant"]),  # error 1e-4
            (_gelu_constants(c=0.0447), ["differs", "close (relative error 8.2e-06)", "a constant may be truncated",
                                         "0.044715", NOT_RIGHT, "!compute in float64"]),
            (_gelu_constants(k=0.79788456), ["differs", "a constant may be truncated", "math.sqrt(2 / math.pi)",
                                             NOT_RIGHT, "!compute in float64"]),  # truncated literal, in float64
            (_gelu_finite_difference(1e-5), ["differs", "not exact", "a finite difference", NOT_RIGHT]),
            (_gelu_finite_difference(1e-3), ["differs", "not exact", "a finite difference", NOT_RIGHT]),
            (lambda x: _gelu(du_factor=C)(x.float()), ["differs", "your result is torch.float32", NOT_RIGHT]),
        ],
        "right": [_gelu_sigmoid, _gelu_cosh],
    },
    "softmax_ce_grad": {
        "wrong": [
            (lambda logits, targets: softmax_ce_grad(logits, targets) * len(targets),
             ["differs", "case 1", "the mean over the N rows", "!sign"]),  # sum
            (_naive_softmax, ["NaN", "case 3", "its own largest logit"]),
            (_softmax_global_shift, ["NaN", "case 4", "each row by its own largest logit"]),
            (lambda logits, targets: torch.softmax(logits, -1) / len(targets), ["differs", "!sign"]),  # forgot − y
            (lambda logits, targets: -softmax_ce_grad(logits, targets),
             ["differs", "the sign is flipped", "p − y", "!mean over"]),  # y − p
            (lambda logits, targets: (torch.log_softmax(logits, -1) - F.one_hot(targets, logits.shape[-1]))
             / len(targets), ["differs"]),  # log p instead of p
            (_softmax_then_log, ["NaN", "case 3", "log(softmax(z))", "one-step log_softmax",
                                 "!each row by its own largest logit"]),  # the two-step route, through autograd
            (lambda logits, targets: _softmax_then_log(logits, targets, nll=True),
             ["NaN", "case 3", "log(0) = -inf", "!one shift for the whole tensor"]),
        ],
        "right": [_softmax_one_hot, _softmax_logsumexp],
    },
    "layer_norm_grad": {
        "wrong": [
            (_ln_stats_constant, ["differs", "treats μ and σ as constants"]),
            (_ln_unbiased, ["differs", "unbiased variance", "unbiased=False", "!ε is"]),
            (_ln(lambda v, e: 1 / (v.sqrt() + e)), ["differs", "case 1", NOT_RIGHT, "ε is outside the root",
                                                    "!unbiased"]),
            (_ln(lambda v, e: 1 / v.sqrt()), ["differs", "case 1", NOT_RIGHT, "ε is left out"]),  # ε forgotten
            (_ln_mean_gx, ["differs", "!unbiased", "!ε is"]),
            (lambda grad_out, x, eps: layer_norm_grad(grad_out.float(), x.float(), eps),
             ["your result is torch.float32", "compute in float64", "!constant", "!one-pass"]),  # wrong on case 5
            (lambda grad_out, x, eps: layer_norm_grad(grad_out, x, eps) * torch.sqrt(
                x.var(-1, unbiased=False, keepdim=True) + eps), ["differs"]),  # forgot the factor r
            (_ln_one_pass, ["case 5", "mean 10⁶ and spread 1", "one-pass variance", "two passes", "!float32"]),
        ],
        "right": [_ln_jacobian, _ln_centered],
    },
    "relu_grad": {
        "wrong": [
            (lambda grad_out, x: grad_out * (x >= 0), ["only the entries where x = 0 differ", "x > 0, not x >= 0"]),
            (lambda grad_out, x: (x > 0).double(), ["ReLU′(x) itself", "upstream grad_out"]),
            (lambda grad_out, x: grad_out * torch.heaviside(x, torch.tensor(0.5, dtype=x.dtype)),
             ["only the entries where x = 0 differ", "subdifferential is [0, 1]"]),  # SymPy's Heaviside(0) = ½
            (lambda grad_out, x: torch.relu(x), ["the forward value"]),
            (lambda grad_out, x: grad_out * torch.sign(x), ["differs"]),
        ],
        "right": [lambda grad_out, x: torch.where(x > 0, grad_out, torch.zeros_like(grad_out)),
                  lambda grad_out, x: grad_out.masked_fill(x <= 0, 0.0)],
    },
    "central_difference_grad": {
        "wrong": [(cd_forward, ["differs", "one-sided difference", "O(h)"]),
                  (cd_by_h, ["differs", "divide by 2h, not h"]),
                  (cd_together, ["differs", "one entry at a time"]),
                  (cd_unrestored, ["differs", "case 2", "put each entry back", "!divide by", "!one-sided"]),
                  (cd_plus_left, ["differs", "case 2", "left at x[i] + h", "x.clone()", "!one-sided"]),
                  (cd_aliased, ["differs", "case 1", "the same tensor as x", "not x − h eᵢ", "!divide by 2h",
                                "!one-sided"]),
                  (cd_autograd, ["differs", "exact derivative", "O(h²)"]),
                  (lambda f, x, h: cd_eye(f, x, h).flatten(), ["shape (6,), expected (2, 3)"]),
                  (lambda f, x, h: cd_eye(f, x.float(), h), ["differs", "float32"])],
        "right": [cd_in_place, cd_eye],
    },
    "descent_flow_rate": {
        "wrong": [(lambda a, eta: a, ["simplifies to a", "only as η → 0"]),
                  (lambda a, eta: sp.log(1 - eta * a) / eta, ["the sign"]),
                  (lambda a, eta: -sp.log(1 - eta * a), ["divide by η"]),
                  (lambda a, eta: a + eta * a**2 / 2, ["first two terms of the series"]),
                  (lambda a, eta: sp.log(1 + eta * a) / eta, ["not 1 + ηa"]),
                  (lambda a, eta: -sp.log(1 - eta * a) / (eta * a), ["r/a"]),
                  (lambda a, eta: -math.log(0.5) / eta, ["floating-point"])],
        "right": [lambda a, eta: sp.log(1 / (1 - eta * a)) / eta,
                  lambda a, eta: -sp.log(1 - sp.Symbol("a") * sp.Symbol("eta")) / sp.Symbol("eta"),
                  lambda a, eta: sp.log(a / (a - eta * a**2)) / eta],
    },
    "mlp_grads": {
        "wrong": [
            (_mlp("gelu_at_a"), ["output[0] differs", "evaluated at the activation a", "pre-activation h",
                                 "!erf"]),
            (_mlp_one_output(0, 2.0), ["output[0] differs", "check fc's backward", "∂L/∂x = G_h W₁",
                                       "!GELU′ (tanh form) at the pre-activation"]),  # only ∂L/∂x doubled
            (_mlp_one_output(2, None), ["output[2] differs", "∂L/∂b₁ = Σ_n G_h", "not a mean",
                                        "!GELU′ (tanh form) at the pre-activation"]),  # ∂L/∂b₁ averaged
            (_mlp_exact_forward, ["output[3] differs", "∂L/∂W₂ = Gᵀ a", "tanh form"]),
            (lambda grad_out, x, w1, b1, w2, b2: tuple(t.float() for t in mlp_grads(grad_out, x, w1, b1, w2, b2)),
             ["your result is torch.float32", "the formula looks right", "!constant"]),
            (_mlp("no_gelu_grad"), ["output[0] differs", "∂L/∂W₂ and ∂L/∂b₂ are right", "⊙ GELU′(h)",
                                    "the tanh form's GELU′", "!erf"]),
            (_mlp("exact_gelu"), ["output[0] differs", "uses the exact (erf) GELU′", "tanh form",
                                  "!at the activation"]),
            (_mlp_one_output(1, -1.0), ["output[1] differs", "check fc's backward", "!erf", "!at the activation"]),
            (_mlp("w2_from_h"), ["output[3] differs", "∂L/∂W₂ = Gᵀ a"]),
            (lambda grad_out, x, w1, b1, w2, b2: mlp_grads(grad_out, x, w1, b1, w2, b2)[:3],
             ["should have 5 items"]),
            (lambda grad_out, x, w1, b1, w2, b2: (lambda g: (g[0], g[1].T, *g[2:]))(
                mlp_grads(grad_out, x, w1, b1, w2, b2)), ["output[1] has shape (3, 7), expected (7, 3)"]),
        ],
        "right": [_mlp_autograd_free_einsum, _mlp_with_package],
    },
    "depth_gradient_norms": {
        "wrong": [
            (lambda weights, h0, grad_out, residual: depth_gradient_norms(weights, h0, grad_out, residual).flip(0),
             ["differs", "wrong order"]),
            (lambda weights, h0, grad_out, residual: depth_gradient_norms(weights.transpose(1, 2), h0, grad_out,
                                                                          residual), ["differs"]),  # forward too
            (lambda weights, h0, grad_out, residual: _depth_slip(weights, h0, grad_out, residual, transpose=True),
             ["differs", "not (∂L/∂z) Wᵀ"]),
            (lambda weights, h0, grad_out, residual: _depth_slip(weights, h0, grad_out, residual, identity=False),
             ["differs", "I + J"]),
            (lambda weights, h0, grad_out, residual: _depth_slip(weights, h0, grad_out, residual, slope_at="h"),
             ["differs", "pre-activation"]),
            (lambda weights, h0, grad_out, residual: _depth_slip(weights, h0, grad_out, residual, forward=True),
             ["differs", "activations' norms"]),
            (lambda weights, h0, grad_out, residual: depth_gradient_norms(weights, h0, grad_out, residual)[1:],
             ["has shape"]),  # h_0 left out
            (lambda weights, h0, grad_out, residual: _depth_slip(weights, h0, grad_out, residual, no_slope=True),
             ["differs"]),  # tanh′ forgotten
        ],
        "right": [_depth_by_autograd, _depth_by_jacobians],
    },
}


def _depth_slip(weights, h0, grad_out, residual, *, no_slope=False, **slip):
    if no_slope:
        hs = [h0]
        for w in weights:
            hs.append(hs[-1] + torch.tanh(hs[-1] @ w.T) if residual else torch.tanh(hs[-1] @ w.T))
        g, norms = grad_out, [grad_out.norm()]
        for w in reversed(weights):
            g = g + g @ w if residual else g @ w
            norms.append(g.norm())
        return torch.stack(norms[::-1])
    return ch4._depth_norms(weights, h0, grad_out, residual, **slip)


def test_registry():
    assert registry(4) == ch4.EXERCISES
    assert set(ch4.EXERCISES) == set(SOLUTIONS) == set(CATALOGUE)


@pytest.mark.parametrize("name", sorted(SOLUTIONS))
def test_solution_passes(name):
    r = ch4.EXERCISES[name](SOLUTIONS[name])
    assert r.passed, r.message


@pytest.mark.parametrize(("name", "wrong", "words"), wrong_answers(CATALOGUE))
def test_typical_wrong_answer_rejected(name, wrong, words):
    assert_rejected(ch4.EXERCISES[name], wrong, *words)


def test_a_forbidden_fragment_fails_the_assertion():
    """The "!fragment" convention bites: a hint that must not appear, appearing, fails the test."""
    with pytest.raises(AssertionError):
        assert_rejected(ch4.check_gelu_tanh_grad, lambda x: gelu_tanh_grad(x.float()), NOT_RIGHT)


@pytest.mark.parametrize(("name", "right"), right_answers(CATALOGUE))
def test_correct_alternative_accepted(name, right):
    assert_accepted(ch4.EXERCISES[name], right)


def test_layer_norm_checker_has_a_case_where_eps_placement_matters():
    """Where ε sits must change the answer by far more than the tolerance, not by a hair: a case with σ² < ε."""
    gen = torch.Generator().manual_seed(0)
    x, g = torch.randn(3, 6, generator=gen, dtype=torch.float64) * 1e-3, torch.randn(3, 6, dtype=torch.float64)
    for wrong in (_ln(lambda v, e: 1 / (v.sqrt() + e)), _ln(lambda v, e: 1 / v.sqrt())):
        assert (wrong(g, x, 1e-5) - layer_norm_grad(g, x, 1e-5)).abs().max() > 1.0
    result = ch4.check_layer_norm_grad(_ln(lambda v, e: 1 / v.sqrt()))
    assert not result.passed
