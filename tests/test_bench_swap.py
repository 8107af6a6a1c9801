"""``benchmarks/swap.py`` (chapter 8, README): each swap runs its built-in stand-in in place of our component on
every module of the recipe GPT that holds it (for LayerNorm and the loss, ours is also seen not to run); the
like-for-like check passes the real stand-ins and rejects wrong ones; unknown names and models of another shape are
refused."""

import collections
import importlib.util
import json

import pytest
import torch
import torch.nn.functional as F
from conftest import ROOT

_spec = importlib.util.spec_from_file_location("bench_swap", ROOT / "benchmarks" / "swap.py")
swap = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(swap)

V, T = 65, 64
DATA = torch.randint(0, V, (5000,), generator=torch.Generator().manual_seed(1))
PER_FORWARD = {"LayerNorm": 9, "GELU": 4, "attention": 4, "token lookup": 1}


def counting(monkeypatch, calls: collections.Counter) -> None:
    """Wrap every stand-in in swap.SWAPS, and our LayerNorm and loss, so that each call is counted."""
    for name, (part, method, fused, count) in swap.SWAPS.items():
        def stand_in(*args, _fused=fused, _name=name, **kwargs):
            calls[_name] += 1
            return _fused(*args, **kwargs)
        monkeypatch.setitem(swap.SWAPS, name, (part, method, stand_in, count))
    import common

    import transformer_lab.fast as fast

    for module, attr, key in ((fast, "fast_layer_norm", "our LayerNorm"), (common, "cross_entropy", "our loss")):
        original = getattr(module, attr)

        def counted(*args, _original=original, _key=key, **kwargs):
            calls[_key] += 1
            return _original(*args, **kwargs)
        monkeypatch.setattr(module, attr, counted)


def test_each_stand_in_runs_in_place_of_ours(monkeypatch):
    calls = collections.Counter()
    counting(monkeypatch, calls)
    runs = swap.variants(V, block_size=T)
    x, y = DATA[:2 * T].view(2, T), DATA[1:2 * T + 1].view(2, T)
    for name, (_, loss_of, _) in runs.items():
        if name == swap.BASE:
            continue
        calls.clear()
        loss_of(x, y).backward()
        if name == swap.OURS:
            swapped = set()
        elif name == swap.ALL:
            swapped = {*swap.SWAPS, swap.LOSS}
        else:
            swapped = {name.removeprefix("ours with PyTorch's ")}
        want = {part: n for part, n in PER_FORWARD.items() if part in swapped}
        want["our LayerNorm"] = 0 if "LayerNorm" in swapped else 9
        want["our loss"] = 0 if swap.LOSS in swapped else 1
        assert {k: calls[k] for k in [*PER_FORWARD, "our LayerNorm", "our loss"]} == {
            **dict.fromkeys(PER_FORWARD, 0), **want}, name


def test_the_like_for_like_check_passes_the_real_stand_ins():
    swap.check_like_for_like(swap.variants(V, block_size=T), DATA, block_size=T)


def _no_affine(ln, x):
    return F.layer_norm(x, (ln.d_model,), None, None, ln.eps)


def _exact_gelu(mlp, x, generator=None):
    return mlp.proj(F.gelu(mlp.fc(x)))


def _frozen_lookup(emb, idx):
    return F.embedding(idx, emb.weight.detach())


def _no_mask(attn, q, k, v, *, need_weights=False):
    out = F.scaled_dot_product_attention(q, k, v)
    B, _, T, _ = out.shape
    return attn.out_proj(out.transpose(1, 2).reshape(B, T, attn.d_model)), None


@pytest.mark.parametrize(("name", "wrong"), [("LayerNorm", _no_affine), ("GELU", _exact_gelu),
                                             ("token lookup", _frozen_lookup), ("attention", _no_mask)])
def test_the_like_for_like_check_rejects_a_wrong_stand_in(monkeypatch, name, wrong):
    part, method, _, count = swap.SWAPS[name]
    monkeypatch.setitem(swap.SWAPS, name, (part, method, wrong, count))
    with pytest.raises(RuntimeError, match=f"swap: ours with PyTorch's {name}: "):
        swap.check_like_for_like(swap.variants(V, block_size=T), DATA, block_size=T)


def test_unknown_names_and_other_shapes_are_refused():
    from transformer_lab.gpt import GPT, GPTConfig

    model = GPT(GPTConfig(vocab_size=V, n_layer=2))
    with pytest.raises(ValueError, match="expected 9 modules named ln"):
        swap.swapped(model, ["LayerNorm"])
    with pytest.raises(ValueError, match="unknown component 'layernorm'"):
        swap.swapped(model, ["layernorm"])


def test_the_script_runs_end_to_end(capsys, tmp_path):
    written = tmp_path / "swap.json"
    out = swap.main(["--threads", "1", "--rounds", "1", "--steps", "1", "--out", str(written)])
    rows = json.loads(written.read_text(encoding="utf-8"))["rows"]
    assert rows[0]["compares"].startswith(swap.ALL) and len(rows) == len(out["runs"][0]["variants"]) - 1
    (run,) = out["runs"]
    assert run["threads"] == 1 and set(run["variants"]) == {
        swap.OURS, *(f"ours with PyTorch's {n}" for n in [*swap.SWAPS, swap.LOSS]), swap.ALL, swap.BASE}
    assert all(v["ms_per_step"] > 0 and v["ratio"] > 0 for v in run["variants"].values())
    assert run["variants"][swap.BASE]["ratio"] == 1.0
    assert "1 thread(s), wall time, median of 1 alternating rounds of 1 steps" in capsys.readouterr().out
