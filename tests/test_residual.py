"""Residual blocks (chapter 7): pre-LN / post-LN equal the same blocks written with torch built-ins, values and
gradients (float64, atol = rtol = 1e-10); depth profiles behave as the chapter says; bad input."""

import pytest
import torch
from torch import nn

from transformer_lab.residual import (
    ARRANGEMENTS,
    PostLNResidual,
    PreLNResidual,
    depth_profile,
    make_block,
    output_sensitivity,
)

TOL64 = {"atol": 1e-10, "rtol": 1e-10}


def _mlp(C):
    return nn.Sequential(nn.Linear(C, 2 * C), nn.GELU(), nn.Linear(2 * C, C)).double()


@pytest.mark.parametrize("cls", [PreLNResidual, PostLNResidual])
def test_block_equals_builtin_composition(cls):
    C = 16
    sub = _mlp(C)
    block = cls(C, sub).double()
    with torch.no_grad():
        block.ln.weight.normal_()
        block.ln.bias.normal_()
    ref_ln = nn.LayerNorm(C).double()
    ref_ln.load_state_dict(block.ln.state_dict())
    x = torch.randn(2, 7, C, dtype=torch.float64, requires_grad=True)
    ours = block(x)
    ref = x + sub(ref_ln(x)) if cls is PreLNResidual else ref_ln(x + sub(x))
    torch.testing.assert_close(ours, ref, **TOL64)
    up = torch.randn_like(ours)
    params = [x, *block.parameters()]
    g_ours = torch.autograd.grad(ours, params, up)
    g_ref = torch.autograd.grad(ref, [x, *sub.parameters(), ref_ln.weight, ref_ln.bias], up)
    # block.parameters() lists ln first, then sublayer; reorder the reference the same way
    g_ref = [g_ref[0], g_ref[-2], g_ref[-1], *g_ref[1:-2]]
    for a, r in zip(g_ours, g_ref, strict=True):
        torch.testing.assert_close(a, r, **TOL64)


def test_pre_ln_identity_path_gradient():
    # with a zero sublayer the pre-LN block is the identity and passes gradients unchanged
    C = 8
    sub = nn.Linear(C, C).double()
    nn.init.zeros_(sub.weight)
    nn.init.zeros_(sub.bias)
    x = torch.randn(3, C, dtype=torch.float64, requires_grad=True)
    y = PreLNResidual(C, sub).double()(x)
    torch.testing.assert_close(y, x, atol=0, rtol=0)
    (g,) = torch.autograd.grad(y.sum(), x)
    torch.testing.assert_close(g, torch.ones_like(x), atol=0, rtol=0)


def test_single_token_sequence():
    C = 4
    x = torch.randn(1, 1, C, dtype=torch.float64)
    for a in ARRANGEMENTS:
        assert make_block(a, C, _mlp(C)).double()(x).shape == (1, 1, C)


def test_depth_profiles():
    L = 24
    prof = {a: depth_profile(a, n_layer=L, d_model=32, n_tokens=128) for a in ARRANGEMENTS}
    for p in prof.values():
        assert p["activation_rms"].shape == (L + 1,)
        assert p["gradient_rms"].shape == (L + 1,)
    # plain residual stream x + F(x) with a variance-preserving F doubles the mean square per block
    growth = prof["residual"]["activation_rms"][L] / prof["residual"]["activation_rms"][0]
    assert growth > 2 ** (L / 2) / 10
    # post-LN: the stream is renormalised after every block
    torch.testing.assert_close(prof["post-ln"]["activation_rms"][1:], torch.ones(L), atol=1e-3, rtol=0)
    # pre-LN: the stream grows, but only about like sqrt(1 + l)
    assert prof["pre-ln"]["activation_rms"][L] < 3 * (1 + L) ** 0.5
    # plain with gain < 1: the signal and the gradient vanish geometrically
    small = depth_profile("plain", n_layer=L, d_model=32, n_tokens=128, gain=0.7)
    assert small["activation_rms"][L] < 1e-2
    assert small["gradient_rms"][0] < 1e-2
    # residual connection with the same small gain: the gradient at the input does not vanish
    assert depth_profile("residual", n_layer=L, d_model=32, n_tokens=128, gain=0.7)["gradient_rms"][0] > 1


def test_post_ln_has_the_smallest_input_gradient_at_gain_1():
    # chapter 7's figure: at initialisation post-LN's profile is the tamest; its trouble is not the size of the
    # gradient reaching the input
    prof = {a: depth_profile(a, n_layer=32, d_model=32, n_tokens=64) for a in ARRANGEMENTS}
    g0 = {a: p["gradient_rms"][0].item() for a, p in prof.items()}
    assert g0["post-ln"] < g0["pre-ln"] < g0["residual"]
    assert 1 < g0["post-ln"] < 3


def test_final_norm_divides_pre_ln_gradients_by_the_stream_size():
    # GPT-2's final LayerNorm before the loss: the gradient entering x_L is r through LN's Jacobian, about
    # r / rms(x_L); post-LN's stream already has rms 1, so its gradients hardly change. The default is unchanged.
    L, kw = 16, dict(n_layer=16, d_model=32, n_tokens=64)
    for a in ("pre-ln", "post-ln"):
        plain, final = depth_profile(a, **kw), depth_profile(a, **kw, final_norm=True)
        torch.testing.assert_close(final["activation_rms"], plain["activation_rms"])  # the forward stream is the same
        top = final["gradient_rms"][L] * plain["activation_rms"][L]
        assert abs(top - 1) < 0.1, (a, top)  # gradient rms at the top ~ 1 / rms(x_L)
        ratio = {k: p["gradient_rms"][0] / p["gradient_rms"][L] for k, p in (("plain", plain), ("final", final))}
        growth = ratio["final"] / ratio["plain"]
        assert abs(growth - 1) < 0.05, (a, growth)  # the shape of the profile is unchanged
    assert depth_profile("pre-ln", **kw, final_norm=True)["gradient_rms"][0] < depth_profile("pre-ln", **kw)[
        "gradient_rms"][0] / 2
    torch.testing.assert_close(depth_profile("pre-ln", **kw), depth_profile("pre-ln", **kw, final_norm=False))


def test_output_sensitivity_amplification():
    # Liu et al. 2020: post-LN's output moves more under a small change of every weight, more so with depth
    sens = {(a, n): output_sensitivity(a, n_layer=n, d_model=32, n_tokens=64) for a in ("post-ln", "pre-ln")
            for n in (1, 64)}
    for a in ("post-ln", "pre-ln"):
        assert 0.5e-2 < sens[(a, 1)] < 2e-2  # one block: about delta
    assert sens[("post-ln", 64)] > 3 * sens[("pre-ln", 64)]
    assert sens[("post-ln", 64)] > 5 * sens[("post-ln", 1)]
    # the change is linear in delta for small delta
    half = output_sensitivity("pre-ln", n_layer=4, d_model=32, n_tokens=64, delta=0.005)
    full = output_sensitivity("pre-ln", n_layer=4, d_model=32, n_tokens=64, delta=0.01)
    assert 1.8 < full / half < 2.2


@pytest.mark.parametrize(("call", "match"), [
    (lambda: PreLNResidual(0, nn.Identity()), "d_model must be a positive int"),
    (lambda: PostLNResidual(4, "not callable"), "sublayer must be callable"),
    (lambda: PreLNResidual(4, nn.Identity())(torch.ones(2, 5)), r"expected x of shape \(\.\.\., 4\), got \(2, 5\)"),
    (lambda: PostLNResidual(4, nn.Identity())(torch.ones(2, 3)), r"expected x of shape \(\.\.\., 4\)"),
    (lambda: PreLNResidual(4, nn.Identity())([1.0] * 4), "got list"),
    (lambda: make_block("sandwich", 4, nn.Identity()), "arrangement must be one of"),
    (lambda: depth_profile("pre-ln", n_layer=0), "n_layer must be a positive int"),
    (lambda: depth_profile("pre-ln", n_layer=2, gain=0.0), "gain must be > 0"),
    (lambda: depth_profile("diagonal", n_layer=2), "arrangement must be one of"),
    (lambda: output_sensitivity("pre-ln", n_layer=2, delta=0.0), "delta must be > 0"),
    (lambda: output_sensitivity("pre-ln", n_layer=True), "n_layer must be a positive int"),
    (lambda: output_sensitivity("sideways", n_layer=2), "arrangement must be one of"),
])
def test_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()
