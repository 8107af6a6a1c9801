"""Chapter-3 exercise checkers: accept the solution, reject wrong ones with a message naming the difference."""

import math

import torch
from conftest import assert_rejected

from transformer_lab.exercises import ch3, registry


# ---------------------------------------------------------------- solutions (as in the chapter)
def adam_step(param, grad, exp_avg, exp_avg_sq, step, *, lr, betas, eps, weight_decay):
    b1, b2 = betas
    param = param * (1 - lr * weight_decay)
    m = b1 * exp_avg + (1 - b1) * grad
    v = b2 * exp_avg_sq + (1 - b2) * grad**2
    m_hat, v_hat = m / (1 - b1**step), v / (1 - b2**step)
    return param - lr * m_hat / (v_hat.sqrt() + eps), m, v


def warmup_cosine_lr(step, max_lr, min_lr, warmup, total):
    if step < warmup:
        return max_lr * (step + 1) / warmup
    if step > total:
        return min_lr
    return min_lr + 0.5 * (max_lr - min_lr) * (1 + math.cos(math.pi * (step - warmup) / (total - warmup)))


def gradient_descent(A, theta0, lr, steps):
    thetas = [theta0]
    for _ in range(steps):
        thetas.append(thetas[-1] - lr * A @ thetas[-1])
    return torch.stack(thetas)


def inverted_dropout(x, keep, p):
    return torch.where(keep, x / (1 - p), torch.zeros_like(x))


def test_registry():
    assert registry(3) == ch3.EXERCISES
    assert set(ch3.EXERCISES) == {"adam_step", "warmup_cosine_lr", "gradient_descent", "inverted_dropout"}


def test_solutions_pass():
    for name, sol in [("adam_step", adam_step), ("warmup_cosine_lr", warmup_cosine_lr),
                      ("gradient_descent", gradient_descent), ("inverted_dropout", inverted_dropout)]:
        r = ch3.EXERCISES[name](sol)
        assert r.passed, r.message


def test_stub_says_not_written():
    def adam_step(param, grad, exp_avg, exp_avg_sq, step, *, lr, betas, eps, weight_decay):
        raise NotImplementedError

    assert_rejected(ch3.check_adam_step, adam_step, "not written yet")


def test_adam_step_rejects():
    def no_bias_correction(param, grad, exp_avg, exp_avg_sq, step, *, lr, betas, eps, weight_decay):
        b1, b2 = betas
        param = param * (1 - lr * weight_decay)
        m, v = b1 * exp_avg + (1 - b1) * grad, b2 * exp_avg_sq + (1 - b2) * grad**2
        return param - lr * m / (v.sqrt() + eps), m, v

    def coupled_decay(param, grad, exp_avg, exp_avg_sq, step, *, lr, betas, eps, weight_decay):  # Adam + L2
        return adam_step(param, grad + weight_decay * param, exp_avg, exp_avg_sq, step, lr=lr, betas=betas, eps=eps,
                         weight_decay=0.0)

    def only_param(param, grad, exp_avg, exp_avg_sq, step, *, lr, betas, eps, weight_decay):
        return adam_step(param, grad, exp_avg, exp_avg_sq, step, lr=lr, betas=betas, eps=eps,
                         weight_decay=weight_decay)[0]

    assert_rejected(ch3.check_adam_step, no_bias_correction, "output[0] differs", "case 1")
    assert_rejected(ch3.check_adam_step, coupled_decay, "differs", "worst at")
    assert_rejected(ch3.check_adam_step, only_param, "should be a tuple of 3 items")


def test_schedule_rejects():
    def zero_at_start(step, max_lr, min_lr, warmup, total):  # ramps from 0: step 0 wasted
        return max_lr * step / warmup if step < warmup else warmup_cosine_lr(step, max_lr, min_lr, warmup, total)

    def no_floor(step, max_lr, min_lr, warmup, total):  # decays to 0, ignores min_lr
        return warmup_cosine_lr(step, max_lr, 0.0, warmup, total)

    assert_rejected(ch3.check_warmup_cosine_lr, zero_at_start, "learning rate 0, expected 0.0001", "step=0")
    assert_rejected(ch3.check_warmup_cosine_lr, no_floor, "expected", "step=35")
    assert_rejected(ch3.check_warmup_cosine_lr, lambda step, max_lr, min_lr, warmup, total: "fast",
             "should return a number")


def test_gradient_descent_rejects():
    def ascent(A, theta0, lr, steps):
        return gradient_descent(A, theta0, -lr, steps)

    def no_start(A, theta0, lr, steps):
        return gradient_descent(A, theta0, lr, steps)[1:]

    assert_rejected(ch3.check_gradient_descent, ascent, "differs", "worst at")
    assert_rejected(ch3.check_gradient_descent, no_start, "has shape (20, 2), expected (21, 2)")


def test_inverted_dropout_rejects():
    assert_rejected(ch3.check_inverted_dropout, lambda x, keep, p: x * keep, "differs", "expected")  # forgot 1/(1−p)
    assert_rejected(ch3.check_inverted_dropout, lambda x, keep, p: x * keep / p, "differs")  # divided by p
