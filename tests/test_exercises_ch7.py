"""Chapter 7 exercise checkers: each accepts the reference solution and rejects wrong ones with a message that
names the difference (and the group's hint)."""

import torch
from conftest import assert_rejected

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


# ---------------------------------------------------------------- wrong answers
def test_logsumexp_rejects_naive_formula():
    result = assert_rejected(ch7.check_stable_logsumexp, lambda x: torch.log(torch.exp(x).sum(-1)),
                             "inf", "subtract m = max(x)")
    assert result.message.startswith("huge logits")


def test_logsumexp_rejects_forgetting_to_add_the_max_back():
    def wrong(x):
        m = x.amax(dim=-1, keepdim=True)
        return torch.log(torch.exp(x - m).sum(-1))

    result = assert_rejected(ch7.check_stable_logsumexp, wrong, "differs in")
    assert result.message.startswith("ordinary logits")


def test_logsumexp_rejects_mean_shift_and_keepdim():
    def mean_shift(x):
        m = x.mean(dim=-1, keepdim=True)
        return (m + torch.log(torch.exp(x - m).sum(-1, keepdim=True))).squeeze(-1)

    result = assert_rejected(ch7.check_stable_logsumexp, mean_shift)
    assert result.message.startswith("huge logits")
    assert_rejected(ch7.check_stable_logsumexp, lambda x: torch.logsumexp(x, -1, keepdim=True),
                    "has shape (1,), expected ()")


def test_layer_norm_rejects_unbiased_variance():
    def wrong(x, weight, bias, eps):
        mean = x.mean(-1, keepdim=True)
        return (x - mean) / torch.sqrt(x.var(-1, keepdim=True) + eps) * weight + bias

    result = assert_rejected(ch7.check_layer_norm_rows, wrong, "divide by C, not C - 1", "worst at")
    assert result.message.startswith("unit weight, zero bias")


def test_layer_norm_rejects_eps_outside_the_root_and_missing_bias():
    def eps_outside(x, weight, bias, eps):
        mean = x.mean(-1, keepdim=True)
        return (x - mean) / (x.var(-1, keepdim=True, correction=0).sqrt() + eps) * weight + bias

    result = assert_rejected(ch7.check_layer_norm_rows, eps_outside, "inside the square root")
    assert result.message.startswith("eps > 0")

    def no_bias(x, weight, bias, eps):
        return layer_norm_rows(x, weight, torch.zeros_like(bias), eps)

    result = assert_rejected(ch7.check_layer_norm_rows, no_bias)
    assert result.message.startswith("random weight and bias")


def test_variance_rejects_one_pass_formula_in_float32():
    def one_pass(x):
        return (x**2).mean(-1) - x.mean(-1) ** 2

    result = assert_rejected(ch7.check_two_pass_variance, one_pass, "two passes", "|diff|")
    assert result.message.startswith("float32 with a large mean")


def test_variance_rejects_sample_variance_and_wrong_shape():
    result = assert_rejected(ch7.check_two_pass_variance, lambda x: x.var(-1), "not n - 1")
    assert result.message.startswith("float64 rows")
    assert_rejected(ch7.check_two_pass_variance, lambda x: x.var(-1, correction=0, keepdim=True),
                    "has shape (4, 1), expected (4,)")


def test_wrong_signature_is_reported():
    assert_rejected(ch7.check_layer_norm_rows, lambda x: x, "should take (x, weight, bias, eps)")
