"""Chapter 7 exercise checkers: each accepts the reference solution and correct answers written in other styles,
and rejects the typical wrong answers of ``CATALOGUE`` with a message that names the difference (and the group's
hint)."""

import functools

import pytest
import torch
from conftest import assert_accepted, assert_rejected, right_answers, wrong_answers

from transformer_lab.exercises import ch7, registry


# ---------------------------------------------------------------- solutions (as on the page)
def stable_logsumexp(x):
    m = x.amax(dim=-1, keepdim=True)
    return (m + torch.log(torch.exp(x - m).sum(dim=-1, keepdim=True))).squeeze(-1)


def layer_norm_rows(x, weight, bias, eps):
    mean = x.mean(dim=-1, keepdim=True)
    var = ((x - mean) ** 2).mean(dim=-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps) * weight + bias


def two_pass_variance(x):
    mean = x.mean(dim=-1, keepdim=True)
    return ((x - mean) ** 2).mean(dim=-1)


# ---------------------------------------------------------------- typical wrong answers
def lse_naive(x):
    return torch.log(torch.exp(x).sum(-1))


def lse_max_not_added_back(x):
    m = x.amax(dim=-1, keepdim=True)
    return torch.log(torch.exp(x - m).sum(-1))


def lse_mean_shift(x):
    m = x.mean(dim=-1, keepdim=True)
    return (m + torch.log(torch.exp(x - m).sum(-1, keepdim=True))).squeeze(-1)


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


# ---------------------------------------------------------------- correct answers in other styles
def lse_logaddexp(x):
    return functools.reduce(torch.logaddexp, x.unbind(-1))  # log(e^a + e^b), pairwise


def lse_max_values(x):
    m = torch.max(x, dim=-1).values
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


CATALOGUE = {
    "stable_logsumexp": {
        "wrong": [
            (lse_naive, ["huge logits", "inf", "subtract m = max(x)"]),
            (lse_max_not_added_back, ["ordinary logits", "differs in"]),
            (lse_mean_shift, ["huge logits"]),
            (lse_keepdim, ["has shape (1,), expected ()", "squeeze(-1)"]),
            (lse_global_max, ["rows of very different sizes", "its own maximum"]),
        ],
        "right": [lse_logaddexp, lse_max_values],
    },
    "layer_norm_rows": {
        "wrong": [
            (ln_unbiased, ["unit weight, zero bias", "divide by C, not C - 1", "worst at"]),
            (ln_eps_outside, ["eps > 0", "inside the square root"]),
            (ln_no_bias, ["random weight and bias"]),
            (ln_one_pass, ["float32 rows with a large mean", "two passes", "|diff|"]),
            (ln_wrong_dim, ["unit weight, zero bias", "differs in"]),
            (lambda x: x, ["should take 4 argument(s), in this order: (x, weight, bias, eps)"]),
        ],
        "right": [ln_var_mean, ln_einsum],
    },
    "two_pass_variance": {
        "wrong": [
            (var_one_pass, ["float32 with a large mean", "two passes", "|diff|"]),
            (var_one_pass_clamped, ["float32 with a large mean", "two passes"]),
            (var_sample, ["float64 rows", "not n - 1"]),
            (var_keepdim, ["has shape (4, 1), expected (4,)", "drop it"]),
            (var_std, ["float64 rows", "differs in"]),
        ],
        "right": [var_sum_of_squares, var_shifted_data],
    },
}


@pytest.mark.parametrize(("name", "wrong", "words"), wrong_answers(CATALOGUE))
def test_typical_wrong_answer_rejected(name, wrong, words):
    result = assert_rejected(ch7.EXERCISES[name], wrong, *words)
    group = next((w for w in words if w in {"huge logits", "ordinary logits", "rows of very different sizes",
                                             "unit weight, zero bias", "eps > 0", "random weight and bias",
                                             "float32 rows with a large mean", "float32 with a large mean",
                                             "float64 rows"}), None)
    if group:  # the failing group is named first, so the student knows what that group tests
        assert result.message.startswith(group), result.message


@pytest.mark.parametrize(("name", "right"), right_answers(CATALOGUE))
def test_correct_alternative_accepted(name, right):
    assert_accepted(ch7.EXERCISES[name], right)


def test_registry_names_the_functions():
    assert set(registry(7)) == {"stable_logsumexp", "layer_norm_rows", "two_pass_variance"}
    assert ch7.EXERCISES["stable_logsumexp"] is ch7.check_stable_logsumexp


def test_solutions_pass():
    for fn, check in [(stable_logsumexp, ch7.check_stable_logsumexp), (layer_norm_rows, ch7.check_layer_norm_rows),
                      (two_pass_variance, ch7.check_two_pass_variance)]:
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
