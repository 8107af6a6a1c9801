"""Chapter-4 exercise checkers: accept the solution, reject wrong ones with a message naming the difference."""

import math

import torch
from conftest import assert_rejected

from transformer_lab.exercises import ch4, registry


# ---------------------------------------------------------------- solutions (as in the chapter)
def linear_grads(grad_out, x, weight):
    return grad_out @ weight, grad_out.T @ x, grad_out.sum(0)


def gelu_tanh_grad(x):
    c = math.sqrt(2 / math.pi)
    t = torch.tanh(c * (x + 0.044715 * x**3))
    return 0.5 * (1 + t) + 0.5 * x * (1 - t**2) * c * (1 + 3 * 0.044715 * x**2)


def softmax_ce_grad(logits, targets):
    p = torch.softmax(logits, dim=-1)
    p[torch.arange(len(targets)), targets] -= 1
    return p / len(targets)


def layer_norm_grad(grad_out, x, eps):
    xhat = (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + eps)
    r = 1 / torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + eps)
    return r * (grad_out - grad_out.mean(-1, keepdim=True) - xhat * (grad_out * xhat).mean(-1, keepdim=True))


def test_registry():
    assert registry(4) == ch4.EXERCISES
    assert set(ch4.EXERCISES) == {"linear_grads", "gelu_tanh_grad", "softmax_ce_grad", "layer_norm_grad"}


def test_solutions_pass():
    for name, sol in [("linear_grads", linear_grads), ("gelu_tanh_grad", gelu_tanh_grad),
                      ("softmax_ce_grad", softmax_ce_grad), ("layer_norm_grad", layer_norm_grad)]:
        r = ch4.EXERCISES[name](sol)
        assert r.passed, r.message


def test_linear_rejects():
    assert_rejected(ch4.check_linear_grads,
                    lambda grad_out, x, weight: (grad_out @ weight, x.T @ grad_out, grad_out.sum(0)),
                    "output[1] has shape (3, 5), expected (5, 3)")
    assert_rejected(ch4.check_linear_grads, lambda grad_out, x, weight: (grad_out @ weight, grad_out.T @ x,
                                                                  grad_out.mean(0)), "output[2] differs")
    assert_rejected(ch4.check_linear_grads, lambda grad_out, x, weight: (grad_out @ weight, grad_out.T @ x),
             "should have 3 items")


def test_gelu_rejects():
    def no_product_rule(x):  # forgot the x · d tanh / dx term
        c = math.sqrt(2 / math.pi)
        return 0.5 * (1 + torch.tanh(c * (x + 0.044715 * x**3)))

    def exact_instead(x):  # the erf form's derivative: close but not the tanh form's
        return 0.5 * (1 + torch.erf(x / math.sqrt(2))) + x * torch.exp(-x * x / 2) / math.sqrt(2 * math.pi)

    assert_rejected(ch4.check_gelu_tanh_grad, no_product_rule, "differs", "worst at")
    assert_rejected(ch4.check_gelu_tanh_grad, exact_instead, "differs")


def test_softmax_ce_rejects():
    def sum_not_mean(logits, targets):
        return softmax_ce_grad(logits, targets) * len(targets)

    def naive_exp(logits, targets):  # no max-shift: NaN for huge logits
        p = logits.exp() / logits.exp().sum(-1, keepdim=True)
        p[torch.arange(len(targets)), targets] -= 1
        return p / len(targets)

    assert_rejected(ch4.check_softmax_ce_grad, sum_not_mean, "differs", "case 1")
    assert_rejected(ch4.check_softmax_ce_grad, naive_exp, "NaN", "case 3")


def test_layer_norm_rejects():
    def treats_stats_as_constant(grad_out, x, eps):  # forgets that μ and σ depend on x
        return grad_out / torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + eps)

    def unbiased(grad_out, x, eps):
        r = 1 / torch.sqrt(x.var(-1, keepdim=True) + eps)
        xhat = (x - x.mean(-1, keepdim=True)) * r
        return r * (grad_out - grad_out.mean(-1, keepdim=True) - xhat * (grad_out * xhat).mean(-1, keepdim=True))

    assert_rejected(ch4.check_layer_norm_grad, treats_stats_as_constant, "differs")
    assert_rejected(ch4.check_layer_norm_grad, unbiased, "differs")
