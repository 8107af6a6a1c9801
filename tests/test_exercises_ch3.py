"""Chapter-3 exercise checkers: accept the solutions and correct answers in other styles, reject the typical wrong
answers with a message that names the difference (and, for a known mistake, a hint)."""

import math

import numpy as np
import pytest
import sympy as sp
import torch
from conftest import assert_accepted, assert_rejected, right_answers, wrong_answers

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


def dropout(x, p, training, generator):
    if not training:
        return x
    keep = torch.rand(x.shape, generator=generator) >= p  # float32 draws, whatever x's dtype
    return torch.where(keep, x / (1 - p), torch.zeros_like(x))


def _dropout_with(mask_shape=None, *, keep_below=False, scale=lambda p: 1 / (1 - p) if p < 1 else 0.0, in_eval=False,
                  rng="given", pairs=False, dtype=None):
    """A dropout answer with one typical mistake: the mask's shape (or rows drawn in ``pairs``), its direction,
    the scale, dropping in evaluation, where the random numbers come from, or their ``dtype`` ("x": x's)."""
    def answer(x, p, training, generator):
        if not training and not in_eval:
            return x
        g = {"given": generator, "global": None, "fixed": torch.Generator().manual_seed(0)}[rng]
        u = torch.rand(mask_shape(x) if mask_shape else x.shape, generator=g,
                       dtype=x.dtype if dtype == "x" else torch.float32)
        keep = u < p if keep_below else u >= p
        if pairs:  # one row of the mask for two rows of x
            keep = keep.repeat_interleave(2, 0)[:len(x)]
        return x * keep * scale(p)
    return answer


def expected_dropout_loss(w, X, y, p):
    residual = y - X @ w  # the error of the mean prediction, E[(m ⊙ x)·w] = x·w
    variance = p / (1 - p) * (X**2) @ (w**2)  # Var((m ⊙ x)·w) = Σ_j x_j² w_j² Var(m_j)
    return (residual**2 + variance).mean()


def _dropout_loss_by_enumeration(w, X, y, p):
    """Every mask of the d inputs, weighted by its probability: the expectation by its definition."""
    d = len(w)
    total = torch.zeros((), dtype=X.dtype)
    for bits in range(2**d):
        keep = torch.tensor([(bits >> j) & 1 for j in range(d)], dtype=X.dtype)
        prob = torch.prod(torch.where(keep.bool(), torch.tensor(1 - p, dtype=X.dtype), torch.tensor(p, dtype=X.dtype)))
        m = keep / (1 - p)
        total = total + prob * ((y - (X * m) @ w) ** 2).mean()
    return total


def heavy_ball(A, theta0, lr, beta, steps):
    thetas, v = [theta0], torch.zeros_like(theta0)
    for _ in range(steps):
        v = beta * v + A @ thetas[-1]
        thetas.append(thetas[-1] - lr * v)
    return torch.stack(thetas)


# ---------------------------------------------------------------- typical wrong answers
def adam_no_bias_correction(param, grad, exp_avg, exp_avg_sq, step, *, lr, betas, eps, weight_decay):
    b1, b2 = betas
    param = param * (1 - lr * weight_decay)
    m, v = b1 * exp_avg + (1 - b1) * grad, b2 * exp_avg_sq + (1 - b2) * grad**2
    return param - lr * m / (v.sqrt() + eps), m, v


def adam_coupled_decay(param, grad, exp_avg, exp_avg_sq, step, *, lr, betas, eps, weight_decay):  # Adam + L2
    return adam_step(param, grad + weight_decay * param, exp_avg, exp_avg_sq, step, lr=lr, betas=betas, eps=eps,
                     weight_decay=0.0)


def adam_only_param(param, grad, exp_avg, exp_avg_sq, step, *, lr, betas, eps, weight_decay):
    return adam_step(param, grad, exp_avg, exp_avg_sq, step, lr=lr, betas=betas, eps=eps,
                     weight_decay=weight_decay)[0]


def adam_decay_after_update(param, grad, exp_avg, exp_avg_sq, step, *, lr, betas, eps, weight_decay):
    new, m, v = adam_step(param, grad, exp_avg, exp_avg_sq, step, lr=lr, betas=betas, eps=eps, weight_decay=0.0)
    return new * (1 - lr * weight_decay), m, v


def adam_eps_inside_sqrt(param, grad, exp_avg, exp_avg_sq, step, *, lr, betas, eps, weight_decay):
    b1, b2 = betas
    param = param * (1 - lr * weight_decay)
    m, v = b1 * exp_avg + (1 - b1) * grad, b2 * exp_avg_sq + (1 - b2) * grad**2
    return param - lr * (m / (1 - b1**step)) / (v / (1 - b2**step) + eps).sqrt(), m, v


def adam_step_off_by_one(param, grad, exp_avg, exp_avg_sq, step, *, lr, betas, eps, weight_decay):
    return adam_step(param, grad, exp_avg, exp_avg_sq, step + 1, lr=lr, betas=betas, eps=eps,
                     weight_decay=weight_decay)


def adam_correct_m_only(param, grad, exp_avg, exp_avg_sq, step, *, lr, betas, eps, weight_decay):  # the 31.6η case
    b1, b2 = betas
    param = param * (1 - lr * weight_decay)
    m, v = b1 * exp_avg + (1 - b1) * grad, b2 * exp_avg_sq + (1 - b2) * grad**2
    return param - lr * (m / (1 - b1**step)) / (v.sqrt() + eps), m, v


def adam_float32(param, grad, exp_avg, exp_avg_sq, step, *, lr, betas, eps, weight_decay):
    return tuple(t.float() for t in adam_step(param, grad, exp_avg, exp_avg_sq, step, lr=lr, betas=betas, eps=eps,
                                              weight_decay=weight_decay))


def lr_cosine_floor_added(step, max_lr, min_lr, warmup, total):  # peak max_lr + min_lr: equals the ramp mistake
    if step < warmup:                                             # at step = warmup, but not elsewhere
        return max_lr * (step + 1) / warmup
    if step > total:
        return min_lr
    return 0.5 * max_lr * (1 + math.cos(math.pi * (step - warmup) / (total - warmup))) + min_lr


def lr_float32(step, max_lr, min_lr, warmup, total):
    return np.float32(warmup_cosine_lr(step, max_lr, min_lr, warmup, total))


def lr_zero_at_start(step, max_lr, min_lr, warmup, total):  # ramps from 0: step 0 wasted
    return max_lr * step / warmup if step < warmup else warmup_cosine_lr(step, max_lr, min_lr, warmup, total)


def lr_no_floor(step, max_lr, min_lr, warmup, total):  # decays to 0, ignores min_lr
    return warmup_cosine_lr(step, max_lr, 0.0, warmup, total)


def lr_progress_over_total(step, max_lr, min_lr, warmup, total):
    if step < warmup:
        return max_lr * (step + 1) / warmup
    if step > total:
        return min_lr
    return min_lr + 0.5 * (max_lr - min_lr) * (1 + math.cos(math.pi * (step - warmup) / total))


def lr_plain_cosine(step, max_lr, min_lr, warmup, total):
    if step < warmup:
        return max_lr * (step + 1) / warmup
    return min_lr + (max_lr - min_lr) * math.cos(math.pi * min(1.0, (step - warmup) / (total - warmup)))


def lr_ramp_one_step_too_long(step, max_lr, min_lr, warmup, total):
    if step <= warmup:  # off by one: overshoots the peak at step = warmup (and divides by zero at warmup = 0)
        return max_lr * (step + 1) / warmup
    return warmup_cosine_lr(step, max_lr, min_lr, warmup, total)


def adam_returns_corrected_state(param, grad, exp_avg, exp_avg_sq, step, *, lr, betas, eps, weight_decay):
    b1, b2 = betas
    m_hat = (b1 * exp_avg + (1 - b1) * grad) / (1 - b1**step)
    v_hat = (b2 * exp_avg_sq + (1 - b2) * grad**2) / (1 - b2**step)
    return param * (1 - lr * weight_decay) - lr * m_hat / (v_hat.sqrt() + eps), m_hat, v_hat  # state: m̂, v̂


def adam_decay_without_lr(param, grad, exp_avg, exp_avg_sq, step, *, lr, betas, eps, weight_decay):
    new, m, v = adam_step(param * (1 - weight_decay) / (1 - lr * weight_decay), grad, exp_avg, exp_avg_sq, step,
                          lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
    return new, m, v  # θ(1 − λ) in place of θ(1 − ηλ)


def adam_ignores_weight_decay(param, grad, exp_avg, exp_avg_sq, step, *, lr, betas, eps, weight_decay):
    return adam_step(param, grad, exp_avg, exp_avg_sq, step, lr=lr, betas=betas, eps=eps, weight_decay=0.0)


def adam_kingma_ba_efficient(param, grad, exp_avg, exp_avg_sq, step, *, lr, betas, eps, weight_decay):
    b1, b2 = betas  # Algorithm 1's "efficient" order: ε added to √v, not to √v̂ (differs by about 1e-8 here)
    m, v = b1 * exp_avg + (1 - b1) * grad, b2 * exp_avg_sq + (1 - b2) * grad**2
    step_size = lr * math.sqrt(1 - b2**step) / (1 - b1**step)
    return param * (1 - lr * weight_decay) - step_size * m / (v.sqrt() + eps), m, v


def lr_cosine_past_total(step, max_lr, min_lr, warmup, total):  # no floor after total: the cosine climbs back
    if step < warmup:
        return max_lr * (step + 1) / warmup
    return min_lr + 0.5 * (max_lr - min_lr) * (1 + math.cos(math.pi * (step - warmup) / (total - warmup)))


def gd_ascent(A, theta0, lr, steps):
    return gradient_descent(A, theta0, -lr, steps)


def gd_no_start(A, theta0, lr, steps):
    return gradient_descent(A, theta0, lr, steps)[1:]


def gd_twice_the_gradient(A, theta0, lr, steps):  # ∇(½θᵀAθ) taken as 2Aθ
    return gradient_descent(A, theta0, 2 * lr, steps)


def gd_in_place(A, theta0, lr, steps):  # every row is the same tensor, changed in place
    theta, rows = theta0.clone(), []
    for _ in range(steps + 1):
        rows.append(theta)
        theta -= lr * A @ theta
    return torch.stack(rows)


def gd_append_after_in_place(A, theta0, lr, steps):  # row 0 right, then the same tensor every row
    theta, rows = theta0.clone(), [theta0]
    for _ in range(steps):
        theta -= lr * A @ theta
        rows.append(theta)
    return torch.stack(rows)


def gd_float32_buffer(A, theta0, lr, steps):  # torch.zeros defaults to float32
    out = torch.zeros(steps + 1, theta0.shape[0])
    out[0] = theta0
    for k in range(steps):
        out[k + 1] = out[k] - lr * (A @ out[k].double()).float()
    return out


def hb_in_place(A, theta0, lr, beta, steps):
    theta, v, rows = theta0.clone(), torch.zeros_like(theta0), [theta0]
    for _ in range(steps):
        v = beta * v + A @ theta
        theta -= lr * v
        rows.append(theta)
    return torch.stack(rows)


def gd_list(A, theta0, lr, steps):
    return list(gradient_descent(A, theta0, lr, steps))


def hb_average(A, theta0, lr, beta, steps):  # Adam's m, not heavy ball's sum
    thetas, v = [theta0], torch.zeros_like(theta0)
    for _ in range(steps):
        v = beta * v + (1 - beta) * (A @ thetas[-1])
        thetas.append(thetas[-1] - lr * v)
    return torch.stack(thetas)


def hb_stale_velocity(A, theta0, lr, beta, steps):  # steps with v before updating it
    thetas, v = [theta0], torch.zeros_like(theta0)
    for _ in range(steps):
        thetas.append(thetas[-1] - lr * v)
        v = beta * v + A @ thetas[-2]
    return torch.stack(thetas)


def hb_nesterov(A, theta0, lr, beta, steps):
    thetas, v = [theta0], torch.zeros_like(theta0)
    for _ in range(steps):
        v = beta * v + A @ (thetas[-1] - lr * beta * v)
        thetas.append(thetas[-1] - lr * v)
    return torch.stack(thetas)


def hb_no_momentum(A, theta0, lr, beta, steps):
    return gradient_descent(A, theta0, lr, steps)


def hb_scaled_gradient(A, theta0, lr, beta, steps):  # v ← β(v + g)
    thetas, v = [theta0], torch.zeros_like(theta0)
    for _ in range(steps):
        v = beta * (v + A @ thetas[-1])
        thetas.append(thetas[-1] - lr * v)
    return torch.stack(thetas)


def hb_without_start(A, theta0, lr, beta, steps):
    return heavy_ball(A, theta0, lr, beta, steps)[1:]


# ---------------------------------------------------------------- correct answers in other styles
def adam_pytorch_form(param, grad, exp_avg, exp_avg_sq, step, *, lr, betas, eps, weight_decay):
    b1, b2 = betas
    m = torch.lerp(exp_avg, grad, 1 - b1)
    v = exp_avg_sq * b2 + (1 - b2) * grad * grad
    step_size = lr / (1 - b1**step)
    denom = v.sqrt() / math.sqrt(1 - b2**step) + eps
    return param.mul(1 - lr * weight_decay).addcdiv(m, denom, value=-step_size), m, v


def adam_numpy(param, grad, exp_avg, exp_avg_sq, step, *, lr, betas, eps, weight_decay):
    p, g, m, v = (t.numpy() for t in (param, grad, exp_avg, exp_avg_sq))
    m = betas[0] * m + (1 - betas[0]) * g
    v = betas[1] * v + (1 - betas[1]) * np.square(g)
    p = p * (1 - lr * weight_decay) - lr * (m / (1 - betas[0] ** step)) / (np.sqrt(v / (1 - betas[1] ** step)) + eps)
    return tuple(torch.from_numpy(a) for a in (p, m, v))


def lr_clamped(step, max_lr, min_lr, warmup, total):
    if step < warmup:
        return max_lr * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / (total - warmup))
    return min_lr + (max_lr - min_lr) * (1 + math.cos(math.pi * progress)) / 2


def lr_numpy(step, max_lr, min_lr, warmup, total):
    ramp = max_lr * (step + 1) / max(warmup, 1)
    progress = np.clip((step - warmup) / (total - warmup), 0.0, 1.0)
    cosine = min_lr + (max_lr - min_lr) * 0.5 * (1 + np.cos(np.pi * progress))
    return np.float64(ramp if step < warmup else cosine)


def gd_matrix_power(A, theta0, lr, steps):
    M = torch.eye(A.shape[0], dtype=A.dtype) - lr * A  # θ_k = (I − ηA)ᵏ θ₀
    return torch.stack([torch.linalg.matrix_power(M, k) @ theta0 for k in range(steps + 1)])


def gd_preallocated(A, theta0, lr, steps):
    out = torch.empty(steps + 1, theta0.shape[0], dtype=theta0.dtype)
    out[0] = theta0
    for k in range(steps):
        out[k + 1] = out[k] - lr * torch.einsum("ij,j->i", A, out[k])
    return out


def hb_two_step(A, theta0, lr, beta, steps):  # θ_{k+1} = θ_k + β(θ_k − θ_{k−1}) − ηAθ_k, θ_{−1} = θ_0
    prev, thetas = theta0, [theta0]
    for _ in range(steps):
        cur = thetas[-1]
        thetas.append(cur + beta * (cur - prev) - lr * A @ cur)
        prev = cur
    return torch.stack(thetas)


def hb_companion(A, theta0, lr, beta, steps):  # (θ, v) ← linear map of (θ, v)
    d = A.shape[0]
    eye = torch.eye(d, dtype=A.dtype)
    T = torch.cat([torch.cat([eye - lr * A, -lr * beta * eye], 1), torch.cat([A, beta * eye], 1)], 0)
    state, rows = torch.cat([theta0, torch.zeros_like(theta0)]), [theta0]
    for _ in range(steps):
        state = T @ state
        rows.append(state[:d])
    return torch.stack(rows)


# ---------------------------------------------------------------- mini-batch SGD, E[m_t], the noisy descent lemma
def sgd_epoch(X, y, w, lr, batch_size, seed):
    order = torch.randperm(len(X), generator=torch.Generator().manual_seed(seed))
    for batch in order.split(batch_size):
        Xb, yb = X[batch], y[batch]
        w = w - lr * Xb.T @ (Xb @ w - yb) / len(batch)
    return w


def sgd_autograd(X, y, w, lr, batch_size, seed):  # the loss written out, its gradient by autograd
    order = torch.randperm(len(X), generator=torch.Generator().manual_seed(seed)).tolist()
    for start in range(0, len(order), batch_size):
        idx = order[start:start + batch_size]
        w = w.detach().requires_grad_()
        loss = 0.5 * ((X[idx] @ w - y[idx]) ** 2).mean()
        (grad,) = torch.autograd.grad(loss, w)
        w = (w - lr * grad).detach()
    return w


def sgd_numpy(X, y, w, lr, batch_size, seed):
    order = torch.randperm(len(X), generator=torch.Generator().manual_seed(seed)).numpy()
    Xn, yn, wn = X.numpy(), y.numpy(), w.numpy().copy()
    for batch in np.array_split(order, range(batch_size, len(order), batch_size)):
        wn -= lr * Xn[batch].T @ (Xn[batch] @ wn - yn[batch]) / len(batch)
    return torch.from_numpy(wn)


def sgd_in_order(X, y, w, lr, batch_size, seed):
    for batch in torch.arange(len(X)).split(batch_size):
        w = w - lr * X[batch].T @ (X[batch] @ w - y[batch]) / len(batch)
    return w


def sgd_drop_last(X, y, w, lr, batch_size, seed):
    order = torch.randperm(len(X), generator=torch.Generator().manual_seed(seed))
    for batch in order.split(batch_size):
        if len(batch) == batch_size:
            w = w - lr * X[batch].T @ (X[batch] @ w - y[batch]) / batch_size
    return w


def sgd_sum(X, y, w, lr, batch_size, seed):
    order = torch.randperm(len(X), generator=torch.Generator().manual_seed(seed))
    for batch in order.split(batch_size):
        w = w - lr * X[batch].T @ (X[batch] @ w - y[batch])
    return w


def sgd_by_batch_size(X, y, w, lr, batch_size, seed):
    order = torch.randperm(len(X), generator=torch.Generator().manual_seed(seed))
    for batch in order.split(batch_size):
        w = w - lr * X[batch].T @ (X[batch] @ w - y[batch]) / batch_size
    return w


def sgd_stale(X, y, w, lr, batch_size, seed):
    order, w0 = torch.randperm(len(X), generator=torch.Generator().manual_seed(seed)), w
    for batch in order.split(batch_size):
        w = w - lr * X[batch].T @ (X[batch] @ w0 - y[batch]) / len(batch)
    return w


def sgd_full_batch(X, y, w, lr, batch_size, seed):
    return w - lr * X.T @ (X @ w - y) / len(X)


def first_moment_sum(beta1, t, g, m0):  # SymPy sums the series itself
    k = sp.Symbol("k", integer=True, positive=True)
    return beta1**t * m0 + sp.summation((1 - beta1) * beta1 ** (t - k) * g, (k, 1, t))


def first_moment_rsolve(beta1, t, g, m0):  # the recursion solved as a difference equation, plain symbols
    m, k = sp.Function("m"), sp.Symbol("k", integer=True)
    b = sp.Symbol("beta_1")
    return sp.rsolve(m(k + 1) - b * m(k) - (1 - b) * g, m(k), {m(0): m0}).subs(k, t)


def first_moment_closed(beta1, t, g, m0):
    return g + beta1**t * (m0 - g)


def step_limit_solve(L, G, sigma2):
    eta = sp.Symbol("eta", positive=True)
    return sp.solve(sp.Eq(-eta * G + L / 2 * eta**2 * (G + sigma2), 0), eta)[0]


CATALOGUE = {
    "sgd_epoch": {
        "wrong": [(sgd_in_order, ["differs", "seeded permutation"]),
                  (sgd_drop_last, ["differs", "N mod b", "keep it"]),
                  (sgd_sum, ["differs", "mean over the batch", "not an unbiased"]),
                  (sgd_by_batch_size, ["differs", "case 2", "its own size"]),
                  (sgd_stale, ["differs", "starting w"]),
                  (sgd_full_batch, ["differs", "full-batch"]),
                  (lambda X, y, w, lr, batch_size, seed: (w, w), ["should be a Tensor, got tuple"]),
                  (lambda X, y, w, lr, batch_size, seed: sgd_epoch(X.float(), y.float(), w.float(), lr, batch_size,
                                                                   seed), ["differs", "single precision"])],
        "right": [sgd_autograd, sgd_numpy],
    },
    "expected_first_moment": {
        "wrong": [(lambda b, t, g, m0: (1 - b**t) * g, ["simplifies to g*(1 - beta_1**t)", "β₁ᵗm₀"]),
                  (lambda b, t, g, m0: b**t * m0 + g, ["expected", "sum to 1 − β₁ᵗ"]),
                  (lambda b, t, g, m0: b ** (t + 1) * m0 + (1 - b ** (t + 1)) * g, ["not t + 1"]),
                  (lambda b, t, g, m0: b**t * m0 + (1 - b**t) * g / (1 - b), ["not β₁^{t−k}"]),
                  (lambda b, t, g, m0: b**t * m0 + (1 - b) * g, ["newest gradient"]),
                  (lambda b, t, g, m0: "beta_1**t*m_0 + (1 - beta_1**t)*g", ["the string", "not a SymPy expression"]),
                  (lambda b, t, g, m0: 0.9**t * m0 + (1 - 0.9**t) * g, ["floating-point"]),
                  (lambda b, t, g, m0: sp.Symbol("beta_2") ** t * m0 + (1 - b**t) * g, ["uses beta_2"])],
        "right": [first_moment_sum, first_moment_rsolve, first_moment_closed],
    },
    "sgd_step_limit": {
        "wrong": [(lambda L, G, sigma2: 2 / L, ["simplifies to 2/L", "E‖g_B‖² = G + σ²"]),
                  (lambda L, G, sigma2: G / (L * (G + sigma2)), ["vertex of the parabola"]),
                  (lambda L, G, sigma2: 2 * G / (L * sigma2), ["the squared mean G stays"]),
                  (lambda L, G, sigma2: 2 / (L * (G + sigma2)), ["in the numerator too"]),
                  (lambda L, G, sigma2: 2 * (G + sigma2) / (L * G), ["upside down"]),
                  (lambda L, G, sigma2: 2 * G / (L * (G + sigma2**2)), ["expected 2*G/(L*(G + sigma2))", "!Hint"])],
        "right": [step_limit_solve, lambda L, G, sigma2: 2 / (L * (1 + sigma2 / G))],
    },
    "adam_step": {
        "wrong": [(adam_no_bias_correction, ["output[0] differs", "case 1", "Hint: divide m by (1 − β₁ᵗ)"]),
                  (adam_coupled_decay, ["differs", "worst at", "L2 penalty"]),
                  (adam_only_param, ["should be a tuple of 3 items"]),
                  (adam_decay_after_update, ["differs", "before the Adam update"]),
                  (adam_eps_inside_sqrt, ["differs", "√v̂ + ε"]),
                  (adam_step_off_by_one, ["differs", "case 1", "not step + 1"]),
                  (adam_correct_m_only, ["differs", "correct v too", "31.6η"]),
                  (adam_float32, ["differs", "single precision"]),
                  (adam_returns_corrected_state, ["output[1] differs", "not the bias-corrected m̂, v̂"]),
                  (adam_decay_without_lr, ["output[0] differs", "θ(1 − ηλ)", "not θ(1 − λ)"]),
                  (adam_ignores_weight_decay, ["output[0] differs", "weight_decay is ignored"]),
                  (adam_kingma_ba_efficient, ["output[0] differs", "Kingma and Ba", "adds ε to √v, not to √v̂"])],
        "right": [adam_pytorch_form, adam_numpy],
    },
    "warmup_cosine_lr": {
        "wrong": [(lr_zero_at_start, ["learning rate 0, expected 0.0001", "step=0", "(step + 1)/warmup"]),
                  (lr_no_floor, ["expected", "step=35", "not to 0"]),
                  (lambda step, max_lr, min_lr, warmup, total: "fast", ["should return a number"]),
                  (lr_progress_over_total, ["expected", "(step − warmup)/(total − warmup)"]),
                  (lr_plain_cosine, ["expected", "½(1 + cos(π·progress))"]),
                  (lr_ramp_one_step_too_long, ["learning rate 0.0011, expected 0.001", "step=10", "step < warmup"]),
                  (lr_cosine_floor_added, ["learning rate 0.0011, expected 0.001", "step=10",
                                           "the cosine spans max_lr − min_lr"]),
                  (lr_float32, ["expected", "single precision"]),
                  (lr_cosine_past_total, ["expected 0.0001", "step=500", "stay at min_lr after step total"])],
        "right": [lr_clamped, lr_numpy],
    },
    "gradient_descent": {
        "wrong": [(gd_ascent, ["differs", "worst at", "θ − η∇L"]),
                  (gd_no_start, ["has shape (20, 2), expected (21, 2)"]),
                  (gd_twice_the_gradient, ["differs", "not 2Aθ"]),
                  (gd_in_place, ["differs", "case 1", "changed it in place"]),
                  (gd_append_after_in_place, ["differs", "changed it in place"]),
                  (gd_float32_buffer, ["differs", "single precision"]),
                  (gd_list, ["should be a Tensor, got list"])],
        "right": [gd_matrix_power, gd_preallocated],
    },
    "heavy_ball": {
        "wrong": [(hb_average, ["differs", "an average (Adam's m)"]),
                  (hb_stale_velocity, ["differs", "update v first"]),
                  (hb_nesterov, ["differs", "Nesterov"]),
                  (hb_no_momentum, ["differs", "plain gradient descent"]),
                  (hb_without_start, ["has shape (30, 2), expected (31, 2)"]),
                  (hb_in_place, ["differs", "changed it in place"]),
                  (hb_scaled_gradient, ["differs", "not β(v + g)"])],
        "right": [hb_two_step, hb_companion],
    },
    "inverted_dropout": {
        "wrong": [(lambda x, keep, p: x * keep, ["differs", "expected", "1/(1 − p)"]),  # forgot 1/(1 − p)
                  (lambda x, keep, p: x * keep / p, ["differs", "not by p"]),
                  (lambda x, keep, p: x * ~keep / (1 - p), ["differs", "survive"]),
                  (lambda x, keep, p: x * keep * (1 - p), ["differs", "worst at", "scaling at test time"]),
                  (lambda x, keep, p: keep.to(x.dtype) / (1 - p), ["differs"])],
        "right": [lambda x, keep, p: x * keep.to(x.dtype) / (1 - p),
                  lambda x, keep, p: x.masked_fill(~keep, 0.0) / (1 - p)],
    },
    "dropout": {
        "wrong": [(_dropout_with(keep_below=True), ["30%", "drop with probability 1 − p"]),
                  (_dropout_with(lambda x: x.shape[-1:]), ["every row", "not one mask for the whole batch"]),
                  (_dropout_with(lambda x: (*x.shape[:-1], 1)), ["every column", "not one for each row"]),
                  (_dropout_with(in_eval=True), ["training=False", "x unchanged"]),
                  (lambda x, p, training, generator: x * (1 - p) if not training
                   else _dropout_with(scale=lambda p: 1.0)(x, p, training, generator), ["training=False"]),
                  (_dropout_with(scale=lambda p: 1.0), ["1.429 x", "scale the kept entries by 1/(1 − p)"]),
                  (_dropout_with(scale=lambda p: 1 / p), ["divide by the probability of keeping"]),
                  (_dropout_with(rng="global"), ["same seed", "global generator"]),
                  (lambda x, p, training, generator: torch.nn.functional.dropout(x, p, training),
                   ["same seed", "F.dropout"]),
                  (_dropout_with(rng="fixed"), ["another seed gave the same mask"]),
                  (_dropout_with(dtype="x"), ["bfloat16", "keeps nothing"]),
                  (_dropout_with(scale=lambda p: 1 / (1 - p) if p < 1 else math.inf), ["at p = 1", "NaN"]),
                  (lambda x, p, training, generator: x.mul_(torch.rand(x.shape, generator=generator) >= p)
                   .div_(1 - p) if training and p < 1 else x.zero_() if training else x, ["in place"]),
                  (lambda x, p, training, generator: dropout(x, p, training, generator).flatten(), ["shape of x"]),
                  # one mask for every pair of rows: not independent, yet no row repeats the whole batch's
                  (_dropout_with(lambda x: (-(-len(x) // 2), *x.shape[1:]), pairs=True),
                   ["independent from row to row"])],
        "right": [lambda x, p, training, generator: x if not training or p == 0 else torch.zeros_like(x) if p == 1
                  else x * torch.bernoulli(torch.full_like(x, 1 - p), generator=generator) / (1 - p),
                  # keep with probability 1 − p by comparing from the other side
                  lambda x, p, training, generator: (x * (torch.rand(x.shape, generator=generator) < 1 - p)
                                                     / max(1 - p, 1e-300) if training else x.clone())],
    },
    "expected_dropout_loss": {
        "wrong": [(lambda w, X, y, p: ((y - X @ w) ** 2).mean(), ["differs", "loss without dropout"]),
                  (lambda w, X, y, p: ((y - X @ w) ** 2 + p * (X**2) @ (w**2)).mean(), ["differs", "not p"]),
                  (lambda w, X, y, p: ((y - X @ w) ** 2 + p * (1 - p) * (X**2) @ (w**2)).mean(),
                   ["differs", "variance of the keep indicator"]),
                  (lambda w, X, y, p: ((y - X @ w) ** 2 + p / (1 - p) * (w**2).sum()).mean(),
                   ["differs", "weighted by the square of its input"]),
                  (lambda w, X, y, p: ((y - X @ w) ** 2 + p / (1 - p) * (X @ w) ** 2).mean(),
                   ["differs", "independent", "not Var(m)(x·w)²"]),
                  (lambda w, X, y, p: ((y - X @ w) ** 2 + p / (1 - p) * (X**2) @ (w**2)).sum(),
                   ["differs", "average over the N rows"]),
                  (lambda w, X, y, p: ((y - X @ w) ** 2 + (1 - p) / p * (X**2) @ (w**2)).mean(),
                   ["differs", "upside down"]),
                  (lambda w, X, y, p: ((y - (X * (1 - p)) @ w) ** 2).mean(), ["differs"]),  # test-time scaling
                  (lambda w, X, y, p: ((y - X @ w) ** 2 + p / (1 - p) * X.pow(2).mean(1) * w.pow(2).sum()).mean(),
                   ["differs"])],  # the input's mean square, not weight by weight
        "right": [lambda w, X, y, p: torch.mean((y - X @ w) ** 2) + p / (1 - p) * torch.einsum("nj,j->", X**2, w**2)
                  / len(X),
                  # E[ŷ²] − E[ŷ]² computed from the second moments of the mask
                  lambda w, X, y, p: (y**2 - 2 * y * (X @ w) + (X @ w) ** 2 + ((X * w) ** 2).sum(1) * (1 / (1 - p) - 1)
                                      ).mean(),
                  _dropout_loss_by_enumeration],
    },
}


def test_registry():
    assert registry(3) == ch3.EXERCISES
    assert set(ch3.EXERCISES) == {"adam_step", "warmup_cosine_lr", "gradient_descent", "heavy_ball",
                                  "inverted_dropout", "dropout", "expected_dropout_loss", "sgd_epoch",
                                  "expected_first_moment",
                                  "sgd_step_limit"}
    assert set(CATALOGUE) == set(ch3.EXERCISES)


def test_solutions_pass():
    for name, sol in [("adam_step", adam_step), ("warmup_cosine_lr", warmup_cosine_lr),
                      ("gradient_descent", gradient_descent), ("heavy_ball", heavy_ball),
                      ("inverted_dropout", inverted_dropout), ("dropout", dropout),
                      ("expected_dropout_loss", expected_dropout_loss),
                      ("sgd_epoch", sgd_epoch),
                      ("expected_first_moment", first_moment_sum), ("sgd_step_limit", step_limit_solve)]:
        r = ch3.EXERCISES[name](sol)
        assert r.passed, r.message


def test_stub_says_not_written():
    def adam_step(param, grad, exp_avg, exp_avg_sq, step, *, lr, betas, eps, weight_decay):
        raise NotImplementedError

    assert_rejected(ch3.check_adam_step, adam_step, "not written yet")


@pytest.mark.parametrize(("name", "wrong", "words"), wrong_answers(CATALOGUE))
def test_typical_wrong_answer_rejected(name, wrong, words):
    assert_rejected(ch3.EXERCISES[name], wrong, *words)


@pytest.mark.parametrize(("name", "right"), right_answers(CATALOGUE))
def test_correct_alternative_accepted(name, right):
    assert_accepted(ch3.EXERCISES[name], right)


def test_a_coincidence_on_the_failing_case_gives_no_wrong_hint():
    """lr_cosine_floor_added gives 0.0011 at step = warmup like the 'ramp one step too long' mistake, but differs
    from it elsewhere: its message must not carry that mistake's hint (it did when hints were matched on the
    cases up to the failing one only)."""
    result = ch3.check_warmup_cosine_lr(lr_cosine_floor_added)
    assert "step < warmup" not in result.message and "spans max_lr − min_lr" in result.message, result.message
