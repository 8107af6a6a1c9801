"""Chapter 7 exercise checkers: each accepts the reference solution and correct answers written in other styles,
and rejects the typical wrong answers of ``CATALOGUE`` with a message that names the difference (and the group's
hint)."""

import functools
import math

import pytest
import sympy as sp
import torch
import torch.nn.functional as F
from conftest import assert_accepted, assert_rejected, right_answers, wrong_answers

from transformer_lab.exercises import ch7, registry


# ---------------------------------------------------------------- solutions (as on the page)
def overflow_point(pattern, dtype):
    log_max = math.log(torch.finfo(dtype).max)
    lo, hi = 0.0, log_max  # LSE(a p) >= a, so the root is below log(max)
    for _ in range(100):
        mid = (lo + hi) / 2
        if torch.logsumexp(mid * pattern, 0) < log_max:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def stable_logsumexp(x):
    m = x.amax(dim=-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))  # a fully masked row: shift by 0
    return (m + torch.log(torch.exp(x - m).sum(dim=-1, keepdim=True))).squeeze(-1)


def layer_norm_rows(x, weight, bias, eps):
    mean = x.mean(dim=-1, keepdim=True)
    var = ((x - mean) ** 2).mean(dim=-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps) * weight + bias


def two_pass_variance(x):
    mean = x.mean(dim=-1, keepdim=True)
    return ((x - mean) ** 2).mean(dim=-1)


# ---------------------------------------------------------------- typical wrong answers
def op_largest_term(pattern, dtype):
    return math.log(torch.finfo(dtype).max)  # where e^a alone overflows


def op_log2(pattern, dtype):
    return math.log2(torch.finfo(dtype).max)  # the base-2 logarithm


def op_float32_max(pattern, dtype):
    return overflow_point(pattern, torch.float32)


def op_all_terms_equal(pattern, dtype):
    return math.log(torch.finfo(dtype).max) - math.log(len(pattern))


def op_max_itself(pattern, dtype):
    return torch.finfo(dtype).max


def op_float32_bisection(pattern, dtype):  # right method, float32 arithmetic: 3.5e-6 short for one logit
    log_max = math.log(torch.finfo(dtype).max)
    lo, hi = 0.0, log_max
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if torch.logsumexp(mid * pattern.float(), 0).item() < log_max else (lo, mid)
    return (lo + hi) / 2


def lse_unmasked_max(x):  # the old page solution: NaN for a fully masked row
    m = x.amax(dim=-1, keepdim=True)
    return (m + torch.log(torch.exp(x - m).sum(dim=-1, keepdim=True))).squeeze(-1)


def lse_naive(x):
    return torch.log(torch.exp(x).sum(-1))


def lse_max_not_added_back(x):
    m = x.amax(dim=-1, keepdim=True)
    return torch.log(torch.exp(x - m).sum(-1))


def lse_mean_shift(x):
    m = x.mean(dim=-1, keepdim=True)
    return (m + torch.log(torch.exp(x - m).sum(-1, keepdim=True))).squeeze(-1)


def lse_float32(x):  # a float32 result for float64 logits
    return lse_max_values(x.float())


def lse_float32_step(x):  # converted back, but computed in float32
    return lse_max_values(x.float()).to(x.dtype)


def lse_keepdim(x):
    m = x.amax(dim=-1, keepdim=True)
    return m + torch.log(torch.exp(x - m).sum(-1, keepdim=True))


def lse_global_max(x):
    m = x.max()  # one shift for the whole tensor, not one per row
    return m + torch.log(torch.exp(x - m).sum(-1))


def ln_unbiased(x, weight, bias, eps):
    mean = x.mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(x.var(-1, keepdim=True) + eps) * weight + bias


def ln_eps_outside(x, weight, bias, eps):
    mean = x.mean(-1, keepdim=True)
    return (x - mean) / (x.var(-1, keepdim=True, correction=0).sqrt() + eps) * weight + bias


def ln_no_eps(x, weight, bias, eps):
    mean = x.mean(-1, keepdim=True)
    return (x - mean) / x.var(-1, keepdim=True, correction=0).sqrt() * weight + bias


def ln_eps_squared(x, weight, bias, eps):
    mean = x.mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(x.var(-1, keepdim=True, correction=0) + eps**2) * weight + bias


def ln_no_bias(x, weight, bias, eps):
    return layer_norm_rows(x, weight, torch.zeros_like(bias), eps)


def ln_one_pass(x, weight, bias, eps):
    mean = x.mean(-1, keepdim=True)
    var = (x**2).mean(-1, keepdim=True) - mean**2  # E[x^2] - E[x]^2
    return (x - mean) / torch.sqrt(var + eps) * weight + bias


def ln_wrong_dim(x, weight, bias, eps):
    mean = x.mean(0, keepdim=True)
    var = ((x - mean) ** 2).mean(0, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps) * weight + bias


def var_one_pass(x):
    return (x**2).mean(-1) - x.mean(-1) ** 2


def var_one_pass_clamped(x):
    return ((x**2).mean(-1) - x.mean(-1) ** 2).clamp(min=0)


def var_sample(x):
    mean = x.mean(-1, keepdim=True)
    return ((x - mean) ** 2).sum(-1) / (x.shape[-1] - 1)


def var_keepdim(x):
    mean = x.mean(-1, keepdim=True)
    return ((x - mean) ** 2).mean(-1, keepdim=True)


def var_std(x):
    return two_pass_variance(x).sqrt()


def var_float64(x):
    return two_pass_variance(x.double())  # accurate, but not in x's dtype


def var_welford(x):
    mean, m2 = torch.zeros_like(x[..., 0]), torch.zeros_like(x[..., 0])
    for k in range(x.shape[-1]):  # one pass: running mean and sum of squared deviations
        delta = x[..., k] - mean
        mean = mean + delta / (k + 1)
        m2 = m2 + delta * (x[..., k] - mean)
    return m2 / x.shape[-1]


# ---------------------------------------------------------------- correct answers in other styles
def op_fixed_point(pattern, dtype):
    log_max = math.log(torch.finfo(dtype).max)
    a = 0.0
    for _ in range(5000):  # a = log(max) - log sum_i e^{a (p_i - 1)}: a contraction, since max p = 1
        a = log_max - math.log(sum(math.exp(a * (v - 1)) for v in pattern.tolist()))
    return a


def op_newton(pattern, dtype):
    log_max = math.log(torch.finfo(dtype).max)
    a = torch.tensor(log_max, dtype=torch.float64)
    for _ in range(50):  # Newton on LSE(a p) - log(max); its derivative is softmax(a p) . p
        a = a - (torch.logsumexp(a * pattern, 0) - log_max) / (torch.softmax(a * pattern, 0) @ pattern)
    return a.item()


def lse_logaddexp(x):
    return functools.reduce(torch.logaddexp, x.unbind(-1))  # log(e^a + e^b), pairwise


def lse_max_values(x):
    m = torch.max(x, dim=-1).values.nan_to_num(neginf=0.0)  # a fully masked row: shift by 0
    return m + torch.log(torch.sum(torch.exp(x - m.unsqueeze(-1)), dim=-1))


def ln_var_mean(x, weight, bias, eps):
    var, mean = torch.var_mean(x, dim=-1, correction=0, keepdim=True)
    return torch.rsqrt(var + eps) * (x - mean) * weight + bias


def ln_einsum(x, weight, bias, eps):
    C = x.shape[-1]
    centred = x - x.sum(-1, keepdim=True) / C
    var = torch.einsum("...i,...i->...", centred, centred).unsqueeze(-1) / C
    return torch.addcmul(bias, centred / (var + eps).sqrt(), weight)


def var_sum_of_squares(x):
    n = x.shape[-1]
    deviations = x - x.sum(-1, keepdim=True) / n  # pass 1, written as a sum
    return torch.einsum("...i,...i->...", deviations, deviations) / n  # pass 2


def var_shifted_data(x):
    y = x - x[..., :1]  # shift by one of the values: the one-pass formula is then harmless
    return (y**2).mean(-1) - y.mean(-1) ** 2


# ---------------------------------------------------------------- Var(q . k) with means
def score_variance(d_k, mu_q, mu_k, sigma_q, sigma_k):
    E_q2, E_k2 = sigma_q**2 + mu_q**2, sigma_k**2 + mu_k**2
    return d_k * sp.expand(E_q2 * E_k2 - (mu_q * mu_k) ** 2)


def sv_stats(d_k, mu_q, mu_k, sigma_q, sigma_k):  # sympy.stats on one term, then d_k of them
    from sympy.stats import E, Normal

    q, k = Normal("q", mu_q, sigma_q), Normal("k", mu_k, sigma_k)
    return d_k * (E(q**2) * E(k**2) - (E(q) * E(k)) ** 2)


def sv_sum(d_k, mu_q, mu_k, sigma_q, sigma_k):  # a Sum over i, done
    i = sp.Symbol("i", integer=True, positive=True)
    term = (sigma_q**2 + mu_q**2) * (sigma_k**2 + mu_k**2) - mu_q**2 * mu_k**2
    return sp.Sum(term, (i, 1, d_k)).doit()


def sv_mean_zero(d_k, mu_q, mu_k, sigma_q, sigma_k):
    return d_k * sigma_q**2 * sigma_k**2


def sv_second_moment(d_k, mu_q, mu_k, sigma_q, sigma_k):
    return d_k * (sigma_q**2 + mu_q**2) * (sigma_k**2 + mu_k**2)


def sv_squared_dk(d_k, mu_q, mu_k, sigma_q, sigma_k):
    return d_k * score_variance(d_k, mu_q, mu_k, sigma_q, sigma_k)


def sv_scaled(d_k, mu_q, mu_k, sigma_q, sigma_k):
    return score_variance(d_k, mu_q, mu_k, sigma_q, sigma_k) / d_k


def sv_sqrt(d_k, mu_q, mu_k, sigma_q, sigma_k):
    return sp.sqrt(d_k) * score_variance(1, mu_q, mu_k, sigma_q, sigma_k)


def sv_squared_sum(d_k, mu_q, mu_k, sigma_q, sigma_k):
    return d_k * (sigma_q * sigma_k + mu_q * sigma_k + sigma_q * mu_k) ** 2


def sv_float(d_k, mu_q, mu_k, sigma_q, sigma_k):
    return 1.0 * score_variance(d_k, mu_q, mu_k, sigma_q, sigma_k)


def sv_string(d_k, mu_q, mu_k, sigma_q, sigma_k):
    return "d_k*(sigma_q**2*sigma_k**2 + mu_q**2*sigma_k**2 + sigma_q**2*mu_k**2)"


def sv_new_symbol(d_k, mu_q, mu_k, sigma_q, sigma_k):  # its own symbol n for the head size
    n = sp.Symbol("n")
    return n * score_variance(1, mu_q, mu_k, sigma_q, sigma_k)


# ---------------------------------------------------------------- signals and gradients through depth
def depth_rms(arrangement, W1, W2, x, w, *, rms=lambda t: t.detach().double().pow(2).mean().sqrt(),
              target=None, order=None):
    def ln(u):
        return F.layer_norm(u, u.shape[-1:], eps=1e-5)

    def block(v, l):
        branch = lambda u: torch.relu(u @ W1[l]) @ W2[l]  # noqa: E731
        return {"plain": lambda: branch(v), "residual": lambda: v + branch(v), "post-ln": lambda: ln(v + branch(v)),
                "pre-ln": lambda: v + branch(ln(v))}[order or arrangement]()

    xs = [x.detach().clone().requires_grad_()]
    for l in range(W1.shape[0]):
        xs.append(block(xs[-1], l))
    grads = torch.autograd.grad((xs[-1] * (w if target is None else target)).sum(), xs)
    return torch.stack([torch.stack([rms(t) for t in xs]), torch.stack([rms(g) for g in grads])])


def dr_hooks(arrangement, W1, W2, x, w):  # retain_grad and .backward(), rms as norm / sqrt(numel)
    x0 = x.clone().requires_grad_()
    xs, v = [x0], x0
    for l in range(W1.shape[0]):
        h = torch.relu((F.layer_norm(v, (v.shape[-1],)) if arrangement == "pre-ln" else v) @ W1[l]) @ W2[l]
        v = {"plain": h, "residual": v + h, "pre-ln": v + h}.get(arrangement)
        if arrangement == "post-ln":
            v = F.layer_norm(xs[-1] + h, (h.shape[-1],))
        v.retain_grad()
        xs.append(v)
    (xs[-1] * w).sum().backward()
    rms = lambda t: t.norm() / t.numel() ** 0.5  # noqa: E731
    return torch.tensor([[rms(t.detach()) for t in xs], [rms(t.grad) for t in xs]], dtype=torch.float64)


def dr_manual_ln(arrangement, W1, W2, x, r):  # LayerNorm written out, population variance
    def ln(u):
        mean = u.mean(-1, keepdim=True)
        return (u - mean) / torch.sqrt(((u - mean) ** 2).mean(-1, keepdim=True) + 1e-5)

    out = [x.detach().clone().requires_grad_()]
    for l in range(W1.shape[0]):
        v = out[-1]
        inner = ln(v) if arrangement == "pre-ln" else v
        h = torch.relu(inner @ W1[l]) @ W2[l]
        out.append(h if arrangement == "plain" else ln(v + h) if arrangement == "post-ln" else v + h)
    grads = torch.autograd.grad((out[-1] * r).sum(), out)
    return torch.stack([torch.stack([t.detach().pow(2).mean().sqrt() for t in ts]) for ts in (out, grads)])

# ---------------------------------------------------------------- what a weight update does through depth
def update_effect(arrangement, W1, W2, dW1, dW2, x, *, change=None, order=None, swap=False):
    def ln(u):
        return F.layer_norm(u, u.shape[-1:], eps=1e-5)

    def block(v, A, B):
        def branch(u):  # F(u) = relu(u A) B
            return torch.relu(u @ A) @ B

        return {"plain": lambda: branch(v), "residual": lambda: v + branch(v), "post-ln": lambda: ln(v + branch(v)),
                "pre-ln": lambda: v + branch(ln(v))}[order or arrangement]()

    def stream(A, B):  # [x_0, ..., x_{n_layer}] with weights A, B
        xs = [x]
        for l in range(A.shape[0]):
            xs.append(block(xs[-1], A[l], B[l]))
        return xs

    before = stream(W1, W2)
    after = stream(W1 + dW2, W2 + dW1) if swap else stream(W1 + dW1, W2 + dW2)
    rms = lambda t: t.pow(2).mean().sqrt()  # noqa: E731
    change = change or (lambda a, b: rms(b - a) / rms(a))
    return torch.stack([change(a, b) for a, b in zip(before, after, strict=True)])


def ue_only_output(arrangement, W1, W2, dW1, dW2, x):  # the change of the output alone, as output_sensitivity
    return update_effect(arrangement, W1, W2, dW1, dW2, x)[-1]


def ue_no_input(arrangement, W1, W2, dW1, dW2, x):  # starts at x_1: the input's 0 left out
    return update_effect(arrangement, W1, W2, dW1, dW2, x)[1:]


def ue_replaced(arrangement, W1, W2, dW1, dW2, x):  # the changes taken for the new weights
    return update_effect(arrangement, W1, W2, dW1 - W1, dW2 - W2, x)


def ue_norm_ratio(arrangement, W1, W2, dW1, dW2, x):  # norms instead of rms: the same ratio
    return update_effect(arrangement, W1, W2, dW1, dW2, x,
                         change=lambda a, b: torch.linalg.vector_norm(b - a) / torch.linalg.vector_norm(a))


def ue_batched(arrangement, W1, W2, dW1, dW2, x):  # both stacks at once, through the package's blocks
    from transformer_lab.residual import make_block

    Ws = (torch.stack([W1, W1 + dW1], 1), torch.stack([W2, W2 + dW2], 1))  # (n_layer, 2, C, C)
    v = torch.stack([x, x])  # (2, N, C): the unchanged and the changed stream
    out = [torch.zeros((), dtype=torch.float64)]
    with torch.no_grad():
        for l in range(W1.shape[0]):
            v = make_block(arrangement, x.shape[-1], lambda u, l=l: torch.relu(u @ Ws[0][l]) @ Ws[1][l]).double()(v)
            out.append(((v[1] - v[0]) ** 2).sum().sqrt() / (v[0] ** 2).sum().sqrt())
    return torch.stack(out)



# ---------------------------------------------------------------- the tricks, sorted
def trick_reason(trick):
    floating_point = {"max-shift", "float32 statistics", "loss scaling", "log_softmax instead of log(softmax)"}
    optimisation = {"1/sqrt(d_k)", "LayerNorm", "residual connections", "pre-LN", "0.02/sqrt(2 n_layer) initialisation",
                    "warm-up", "gradient clipping"}
    return "floating point" if trick in floating_point else "optimisation" if trick in optimisation else "neither"


def tr_seed(trick):  # the seed's own reading: overflow, stability
    if trick in ("1/sqrt(d_k)", "dropout"):
        return "floating point"
    return trick_reason(trick)


def tr_layernorm_fp(trick):
    return "floating point" if trick == "LayerNorm" else trick_reason(trick)


def tr_everything_numerical(trick):  # "every trick has a numerical reason"
    return "floating point"


def tr_loss_scaling_opt(trick):  # loss scaling sounds like the scale of gradients
    return "optimisation" if trick in ("loss scaling", "gradient clipping", "label smoothing") else trick_reason(trick)


def tr_speed_fp(trick):  # speed tricks taken for floating-point ones
    speed = ("skipping masked blocks", "tanh-GELU as x*sigmoid(2u)")
    return "floating point" if trick in speed else trick_reason(trick)


def tr_unknown_word(trick):
    return "numerical stability"


def tr_dict(trick):  # a table, other spellings
    table = {"floating-point": ["max-shift", "float32 statistics", "loss scaling",
                                "log_softmax instead of log(softmax)"],
             "optimization": ["1/sqrt(d_k)", "LayerNorm", "residual connections", "pre-LN", "warm-up",
                              "0.02/sqrt(2 n_layer) initialisation", "gradient clipping"]}
    return next((kind for kind, tricks in table.items() if trick in tricks), "Neither")


def tr_from_module(trick):  # the checker's own table, as a lecturer's key would be
    return {"floating point": "Floating point", "optimisation": "optimisation", "neither": "other"}[ch7.TRICKS[trick]]


_ALIAS_LSE = getattr(torch.special, "logsum" + "exp")  # torch.logsumexp under a name assembled at run time


CATALOGUE = {
    "overflow_point": {
        "wrong": [
            (op_largest_term, ["four equal logits", "the other terms count too"]),
            (op_log2, ["one logit", "natural logarithm", "not math.log2"]),
            (op_float32_max, ["one logit", "torch.finfo(dtype).max, not float32's"]),
            (op_all_terms_equal, ["the figure's pattern", "treats all n terms as equal", "bisection"]),
            (op_max_itself, ["one logit", "differs in", "natural logarithm"]),
            (op_float32_bisection, ["one logit", "close, but not to 1e-6", "compute in float64"]),
        ],
        "right": [op_fixed_point, op_newton],
    },
    "stable_logsumexp": {
        "wrong": [
            (lse_unmasked_max, ["a fully masked row (all -inf)", "NaN", "shift such a row by 0"]),
            (lse_naive, ["huge logits", "inf", "subtract m = max(x)"]),
            (lse_max_not_added_back, ["ordinary logits", "differs in", "add the shift m back"]),
            (lse_float32, ["ordinary logits", "another dtype than x"]),
            (lse_float32_step, ["ordinary logits", "close, but not to 1e-9", "float32 step"]),
            (lse_mean_shift, ["huge logits"]),
            (lse_keepdim, ["has shape (1,), expected ()", "squeeze(-1)"]),
            (lse_global_max, ["rows of very different sizes", "its own maximum"]),
            (lambda x: torch.logsumexp(x, -1), ["ForbiddenCall", "torch.logsumexp", "write yourself"]),
            (lambda x: _ALIAS_LSE(x, -1), ["ForbiddenCall", "torch.logsumexp"]),
            (lambda x: (x - torch.log_softmax(x, -1))[..., 0], ["ForbiddenCall", "log_softmax"]),
        ],
        "right": [lse_logaddexp, lse_max_values],
    },
    "layer_norm_rows": {
        "wrong": [
            (ln_unbiased, ["unit weight, zero bias", "divides by C, not C - 1", "correction=0", "worst at"]),
            (ln_eps_outside, ["eps > 0", "not sqrt(var) + eps"]),
            (ln_no_eps, ["eps > 0", "add eps to the variance, inside the square root"]),
            (ln_eps_squared, ["eps > 0", "add eps to the variance", "not eps^2"]),
            (ln_no_bias, ["random weight and bias"]),
            (ln_one_pass, ["float32 rows with a large mean", "two passes", "near 1e6", "|diff|"]),
            (ln_wrong_dim, ["unit weight, zero bias", "differs in", "dim=-1"]),
            (lambda x: x, ["should take 4 argument(s), in this order: (x, weight, bias, eps)"]),
            (lambda x, w, b, eps: F.layer_norm(x, x.shape[-1:], w, b, eps), ["ForbiddenCall", "F.layer_norm"]),
            (lambda x, w, b, eps, f=torch.nn.functional.layer_norm: f(x, (x.shape[-1],), w, b, eps),
             ["ForbiddenCall", "nn.LayerNorm"]),
            (lambda x, w, b, eps: torch.ops.aten.native_layer_norm(x, [x.shape[-1]], w, b, eps)[0],
             ["ForbiddenCall", "aten.native_layer_norm"]),
        ],
        "right": [ln_var_mean, ln_einsum],
    },
    "two_pass_variance": {
        "wrong": [
            (var_one_pass, ["float32 with a large mean", "two passes", "near 1e8", "|diff|"]),
            (var_one_pass_clamped, ["float32 with a large mean", "two passes"]),
            (var_sample, ["float64 rows", "divides by n, not n - 1"]),
            (var_keepdim, ["has shape (4, 1), expected (4,)", "drop it"]),
            (var_std, ["float64 rows", "differs in", "not its square root"]),
            (var_float64, ["constant rows", "must have x's dtype (float32), got float64", ".to(x.dtype)"]),
            (var_welford, ["float32 with a large mean", "Welford", "grow with mean / spread"]),
            (lambda x: torch.var(x, -1, correction=0), ["ForbiddenCall", "torch.var", "write yourself"]),
            (lambda x: torch.var_mean(x, -1, correction=0)[0], ["ForbiddenCall", "torch.var_mean", "!Hint"]),
            (lambda x: x.std(-1, correction=0) ** 2, ["ForbiddenCall", "torch.std"]),
        ],
        "right": [var_sum_of_squares, var_shifted_data],
    },
    "score_variance": {
        "wrong": [
            (sv_mean_zero, ["simplifies to", "the mean-0 result"]),
            (sv_second_moment, ["subtract each term's squared mean"]),
            (sv_squared_dk, ["variances add", "not d_k^2"]),
            (sv_scaled, ["the unscaled sum"]),
            (sv_sqrt, ["the standard deviation, like sqrt(d_k)"]),
            (sv_squared_sum, ["do not square a sum of standard deviations"]),
            (sv_float, ["floating-point numbers"]), (sv_string, ["not a SymPy expression"]),
            (sv_new_symbol, ["uses n"]),
        ],
        "right": [sv_stats, sv_sum],
    },
    "depth_rms": {
        "wrong": [
            (functools.partial(depth_rms, rms=lambda t: t.detach().double().std()), ["case 1", "standard deviation"]),
            (functools.partial(depth_rms, rms=lambda t: t.detach().double().norm()), ["norm / sqrt(numel)"]),
            (functools.partial(depth_rms, rms=lambda t: t.detach().double().pow(2).mean(-1).sqrt().mean()),
             ["each token's rms"]),
            (lambda a, W1, W2, x, w: depth_rms(a, W1, W2, x, w, target=torch.ones_like(w)), ["not a tensor of ones"]),
            (lambda a, W1, W2, x, w: depth_rms(a, W1, W2, x, w).flip(-1), ["case 1", "differs"]),
            (lambda a, W1, W2, x, w: depth_rms(a, W1, W2, x, w, order={"pre-ln": "post-ln", "post-ln": "pre-ln"}
                                               .get(a, a)), ["case 1", "x_l + F(LN(x_l)), not the post-ln order"]),
            (lambda a, W1, W2, x, w: depth_rms(a, W1, W2, x, w, order="residual" if a == "post-ln" else a),
             ["case 2", "LN(x_l + F(x_l)): the LayerNorm is missing"]),
            (lambda a, W1, W2, x, w: depth_rms(a, W1, W2, x, w)[:, 1:], ["has shape (2, 4), expected (2, 5)", "x_0"]),
            (lambda a, W1, W2, x, w: depth_rms(a, W1, W2, x, w).T, ["row 0 the activations"]),
        ],
        "right": [dr_hooks, dr_manual_ln],
    },
    "update_effect": {
        "wrong": [
            (functools.partial(update_effect, change=lambda a, b: (b.pow(2).mean().sqrt() / a.pow(2).mean().sqrt()
                                                                    - 1).abs()),
             ["case 1", "the rms of the difference, not the difference of the two rms's", "post-LN keeps it at 1"]),
            (functools.partial(update_effect,
                               change=lambda a, b: (b - a).pow(2).mean().sqrt() / b.pow(2).mean().sqrt()),
             ["case 1", "unchanged stream, x_l(W), not of the changed one"]),
            (functools.partial(update_effect, change=lambda a, b: (b - a).pow(2).mean().sqrt()),
             ["case 1", "a relative change"]),
            (functools.partial(update_effect, change=lambda a, b: ((b - a).pow(2).mean(-1) / a.pow(2).mean(-1)).sqrt()
                               .mean()), ["case 1", "not the mean of each token's ratio"]),
            (lambda a, W1, W2, dW1, dW2, x: update_effect(a, W1, W2, dW1, torch.zeros_like(dW2), x),
             ["case 1", "W2 + dW2 as well as W1 + dW1"]),
            (lambda a, W1, W2, dW1, dW2, x: update_effect(a, W1, W2, torch.zeros_like(dW1), dW2, x),
             ["case 1", "W1 + dW1 as well as W2 + dW2"]),
            (functools.partial(update_effect, swap=True), ["case 1", "dW1 is the change of W1"]),
            (ue_replaced, ["case 1", "not dW1 and dW2"]),
            (lambda a, W1, W2, dW1, dW2, x: update_effect(a, W1, W2, dW1, dW2, x,
                                                          order={"pre-ln": "post-ln", "post-ln": "pre-ln"}.get(a, a)),
             ["case 1", "x_l + F(LN(x_l)), not the post-ln order"]),
            (lambda a, W1, W2, dW1, dW2, x: update_effect(a, W1, W2, dW1, dW2, x,
                                                          order="residual" if a == "post-ln" else a),
             ["case 2", "LN(x_l + F(x_l)): the LayerNorm is missing"]),
            (ue_only_output, ["case 1", "a single number", "at every x_l"]),
            (ue_no_input, ["has shape (4,), expected (5,)", "x_0 (the input, whose change is 0)"]),
            (lambda a, W1, W2, dW1, dW2, x: update_effect(a, W1, W2, dW1, dW2, x).flip(0),
             ["case 1", "entry 0 is the input x_0"]),
        ],
        "right": [ue_norm_ratio, ue_batched],
    },
    "trick_reason": {
        "wrong": [
            (tr_seed, ["2 of 16", "'1/sqrt(d_k)' is not 'floating point'", "saturation", "regulariser"]),
            (tr_layernorm_fp, ["1 of 16", "'LayerNorm' is not 'floating point'"]),
            (tr_everything_numerical, ["12 of 16"]),
            (tr_loss_scaling_opt, ["2 of 16", "'loss scaling' is not 'optimisation'", "2^-25"]),
            (tr_speed_fp, ["2 of 16", "speed"]),
            (tr_unknown_word, ["must be one of", "'numerical stability'"]),
            (lambda trick: None, ["must be one of", "None"]),
        ],
        "right": [tr_dict, tr_from_module],
    },
}


@pytest.mark.parametrize(("name", "wrong", "words"), wrong_answers(CATALOGUE))
def test_typical_wrong_answer_rejected(name, wrong, words):
    result = assert_rejected(ch7.EXERCISES[name], wrong, *words)
    group = next((w for w in words if w in {"huge logits", "ordinary logits", "rows of very different sizes",
                                             "unit weight, zero bias", "eps > 0", "random weight and bias",
                                             "float32 rows with a large mean", "float32 with a large mean",
                                             "float64 rows", "constant rows", "one logit", "four equal logits",
                                             "the figure's pattern", "a fully masked row (all -inf)"}), None)
    if group:  # the failing group is named first, so the student knows what that group tests
        assert result.message.startswith(group), result.message


@pytest.mark.parametrize(("name", "right"), right_answers(CATALOGUE))
def test_correct_alternative_accepted(name, right):
    assert_accepted(ch7.EXERCISES[name], right)


def test_registry_names_the_functions():
    assert set(registry(7)) == {"overflow_point", "stable_logsumexp", "layer_norm_rows", "two_pass_variance",
                                "score_variance", "depth_rms", "update_effect", "trick_reason"}
    assert ch7.EXERCISES["stable_logsumexp"] is ch7.check_stable_logsumexp


def test_solutions_pass():
    for fn, check in [(overflow_point, ch7.check_overflow_point),
                      (stable_logsumexp, ch7.check_stable_logsumexp), (layer_norm_rows, ch7.check_layer_norm_rows),
                      (two_pass_variance, ch7.check_two_pass_variance),
                      (score_variance, ch7.check_score_variance), (depth_rms, ch7.check_depth_rms),
                      (update_effect, ch7.check_update_effect),
                      (trick_reason, ch7.check_trick_reason)]:
        result = check(fn)
        assert result.passed, result.message
        assert "matches the reference" in result.message


def test_the_package_passes_its_own_checks():
    from transformer_lab.norm import layer_norm
    from transformer_lab.numerics import logsumexp

    assert ch7.check_stable_logsumexp(logsumexp).passed
    assert ch7.check_layer_norm_rows(layer_norm).passed


def test_stub_says_not_written_yet():
    def stable_logsumexp(x):
        raise NotImplementedError

    assert_rejected(ch7.check_stable_logsumexp, stable_logsumexp, "not written yet")


def test_one_logit_near_miss_is_not_told_that_other_terms_count():
    """For one logit log(max) is the answer, so a float32 near miss must not get the log(max) hint."""
    message = ch7.check_overflow_point(op_float32_bisection).message
    assert "the other terms count too" not in message and "compute in float64" in message


def test_score_variance_reference_is_derived_by_sympy_stats():
    """The checker's closed form, per term, equals Var(q_1 k_1) that sympy.stats integrates over two independent
    normals with symbolic means (independent terms are uncorrelated, so d_k of them add)."""
    from sympy.stats import Normal, variance

    _, mu_q, mu_k, sq, sk = ch7._score_symbols()
    term = variance(Normal("q1", mu_q, sq) * Normal("k1", mu_k, sk))
    assert sp.simplify(term - ch7._ref_score_variance(1, mu_q, mu_k, sq, sk)) == 0


def test_trick_reasons_agree_with_the_chapters_table(root):
    """The checker's answers for the thirteen tricks of the table are the table's: a bold "yes" in the
    floating-point column, else a bold "yes" in the scale column (optimisation), else neither."""
    text = (root / "chapters" / "07-numerical-analysis.md").read_text()
    section = text.split("(claim-34)=")[1].split("```")[0]
    rows = [[cell.strip() for cell in line.split("|")[1:4]]
            for line in section.splitlines() if line.startswith("| ")]
    table = {name: ch7.FP if fp.startswith("**yes") else ch7.OPT if opt.startswith("**yes") else ch7.NEITHER
             for name, fp, opt in rows[1:]}
    labels = {"max-shift": "max-shift in softmax / log-sum-exp", "1/sqrt(d_k)": "$1/\\sqrt{d_k}$",
              "LayerNorm": "LayerNorm", "residual connections": "residual connections", "pre-LN": "pre-LN vs post-LN",
              "0.02/sqrt(2 n_layer) initialisation": "$0.02/\\sqrt{2 n_\\text{layer}}$ initialisation",
              "warm-up": "learning-rate warm-up (chapter 3)",
              "float32 statistics": "float32 statistics in mixed precision",
              "loss scaling": "loss scaling in mixed precision", "dropout": "dropout",
              "weight tying": "weight tying (chapter 1)",
              "skipping masked blocks": "skipping the causally masked blocks of scores ({doc}`../book/fast`)",
              "tanh-GELU as x*sigmoid(2u)": "tanh-GELU written with one sigmoid ({doc}`../book/fast`)"}
    assert len(table) == 13 and set(table) == set(labels.values())
    for key, label in labels.items():
        assert ch7.TRICKS[key] == table[label], key
