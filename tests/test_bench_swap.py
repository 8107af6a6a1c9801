"""``benchmarks/swap.py`` (chapter 8, README): each swap replaces the component it names, on every module of the
recipe GPT that holds it, with a stand-in that computes the same numbers; a model of another shape is refused."""

import sys

import pytest
import torch
from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import swap

V = 65


@pytest.fixture(scope="module")
def runs():
    torch.manual_seed(0)
    return swap.variants(V, block_size=64)


def test_every_swap_binds_its_stand_in_on_every_module(runs):
    for name, (part, method, fused, count) in swap.SWAPS.items():
        model = runs[f"ours, fused {name}"][0]
        bound = [getattr(m, method) for n, m in model.named_modules() if n.rsplit(".", 1)[-1].startswith(part)]
        assert len(bound) == count and all(getattr(b, "__func__", None) is fused for b in bound), name
        untouched = runs[swap.OURS][0]
        assert all(getattr(getattr(m, method), "__func__", None) is not fused for m in untouched.modules()
                   if hasattr(m, method))
    everything = runs["ours, all five fused"][0]
    assert all(getattr(m, method).__func__ is fused for part, method, fused, _ in swap.SWAPS.values()
               for n, m in everything.named_modules() if n.rsplit(".", 1)[-1].startswith(part))


def test_every_variant_computes_our_loss(runs):
    data = torch.randint(0, V, (5000,), generator=torch.Generator().manual_seed(1))
    swap.check_same_loss(runs, data, block_size=64)


def test_a_swap_that_is_not_like_for_like_is_caught(runs):
    model, loss_of, opt = runs["ours, fused GELU"]
    data = torch.randint(0, V, (5000,), generator=torch.Generator().manual_seed(1))
    wrong = dict(runs)
    wrong["ours, fused GELU"] = (model, lambda x, y: loss_of(x, y) + 1e-3, opt)
    with pytest.raises(AssertionError, match="fused GELU"):
        swap.check_same_loss(wrong, data, block_size=64)


def test_a_model_of_another_shape_is_refused():
    from transformer_lab.gpt import GPT, GPTConfig

    with pytest.raises(AssertionError, match="expected 9 modules named ln"):
        swap.swapped(GPT(GPTConfig(vocab_size=V, n_layer=2)), ["LayerNorm"])
