"""Chapter 7 exercise checkers: each accepts the reference solution and rejects wrong ones with a message that
names the difference (and the group's hint)."""

import torch

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

    result = ch7.check_stable_logsumexp(stable_logsumexp)
    assert not result.passed
    assert "not written yet" in result.message


# ---------------------------------------------------------------- wrong answers
def test_logsumexp_rejects_naive_formula():
    result = ch7.check_stable_logsumexp(lambda x: torch.log(torch.exp(x).sum(-1)))
    assert not result.passed
    assert result.message.startswith("huge logits")
    assert "inf" in result.message
    assert "subtract m = max(x)" in result.message


def test_logsumexp_rejects_forgetting_to_add_the_max_back():
    def wrong(x):
        m = x.amax(dim=-1, keepdim=True)
        return torch.log(torch.exp(x - m).sum(-1))

    result = ch7.check_stable_logsumexp(wrong)
    assert not result.passed
    assert result.message.startswith("ordinary logits")
    assert "differs in" in result.message


def test_logsumexp_rejects_mean_shift_and_keepdim():
    def mean_shift(x):
        m = x.mean(dim=-1, keepdim=True)
        return (m + torch.log(torch.exp(x - m).sum(-1, keepdim=True))).squeeze(-1)

    result = ch7.check_stable_logsumexp(mean_shift)
    assert not result.passed
    assert result.message.startswith("huge logits")
    result = ch7.check_stable_logsumexp(lambda x: torch.logsumexp(x, -1, keepdim=True))
    assert not result.passed
    assert "has shape (1,), expected ()" in result.message


def test_layer_norm_rejects_unbiased_variance():
    def wrong(x, weight, bias, eps):
        mean = x.mean(-1, keepdim=True)
        return (x - mean) / torch.sqrt(x.var(-1, keepdim=True) + eps) * weight + bias

    result = ch7.check_layer_norm_rows(wrong)
    assert not result.passed
    assert result.message.startswith("unit weight, zero bias")
    assert "divide by C, not C - 1" in result.message
    assert "worst at" in result.message


def test_layer_norm_rejects_eps_outside_the_root_and_missing_bias():
    def eps_outside(x, weight, bias, eps):
        mean = x.mean(-1, keepdim=True)
        return (x - mean) / (x.var(-1, keepdim=True, correction=0).sqrt() + eps) * weight + bias

    result = ch7.check_layer_norm_rows(eps_outside)
    assert not result.passed
    assert result.message.startswith("eps > 0")
    assert "inside the square root" in result.message

    def no_bias(x, weight, bias, eps):
        return layer_norm_rows(x, weight, torch.zeros_like(bias), eps)

    result = ch7.check_layer_norm_rows(no_bias)
    assert not result.passed
    assert result.message.startswith("random weight and bias")


def test_variance_rejects_one_pass_formula_in_float32():
    def one_pass(x):
        return (x**2).mean(-1) - x.mean(-1) ** 2

    result = ch7.check_two_pass_variance(one_pass)
    assert not result.passed
    assert result.message.startswith("float32 with a large mean")
    assert "two passes" in result.message
    assert "|diff|" in result.message


def test_variance_rejects_sample_variance_and_wrong_shape():
    result = ch7.check_two_pass_variance(lambda x: x.var(-1))
    assert not result.passed
    assert result.message.startswith("float64 rows")
    assert "not n - 1" in result.message
    result = ch7.check_two_pass_variance(lambda x: x.var(-1, correction=0, keepdim=True))
    assert not result.passed
    assert "has shape (4, 1), expected (4,)" in result.message


def test_wrong_signature_is_reported():
    result = ch7.check_layer_norm_rows(lambda x: x)
    assert not result.passed
    assert "should take (x, weight, bias, eps)" in result.message
