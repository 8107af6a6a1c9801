"""The mini-GPT (chapter 8): equal logits with the built-in reference, cache = no cache, bad input."""

import pytest
import torch

from transformer_lab import fast
from transformer_lab.gpt import GPT, GPTConfig, KVCache
from transformer_lab.reference import ReferenceGPT

SMALL = dict(vocab_size=23, block_size=16, n_layer=2, n_head=2, d_model=16)


def _pair(positions, dtype=torch.float64, **kw):
    config = GPTConfig(**{**SMALL, "positions": positions, **kw})
    ours = GPT(config).to(dtype)
    with torch.no_grad():  # non-trivial LayerNorm parameters and biases, so nothing hides behind 1s and 0s
        for name, p in ours.named_parameters():
            if p.dim() == 1:
                p.normal_(0.5 if name.endswith("weight") else 0.0, 0.3)
    ref = ReferenceGPT(config).to(dtype)
    ref.load_state_dict(ours.state_dict())
    return ours.eval(), ref.eval()


@pytest.mark.parametrize("positions", ["learned", "sinusoidal", "rope"])
def test_same_weights_give_the_same_logits_as_the_reference(positions):
    # float64: both compute the same real numbers; 1e-10 leaves room only for rounding in a different order
    ours, ref = _pair(positions)
    idx = torch.randint(SMALL["vocab_size"], (3, SMALL["block_size"]))
    torch.testing.assert_close(ours(idx), ref(idx), atol=1e-10, rtol=1e-10)
    short = idx[:, :5]  # a shorter context, and a single token
    torch.testing.assert_close(ours(short), ref(short), atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(ours(idx[:, :1]), ref(idx[:, :1]), atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("T", [12, 64])  # 64 >= fast._CAUSAL_SPLIT_MIN: the split causal path of training
def test_same_gradients_as_the_reference(T):
    ours, ref = _pair("learned", block_size=max(T, SMALL["block_size"]))
    idx = torch.randint(SMALL["vocab_size"], (2, T))
    assert (T >= fast._CAUSAL_SPLIT_MIN) == (T == 64)
    ours(idx).square().mean().backward()
    ref(idx).square().mean().backward()
    g_ref = dict(ref.named_parameters())
    for name, p in ours.named_parameters():
        torch.testing.assert_close(p.grad, g_ref[name].grad, atol=1e-10, rtol=1e-9, msg=name)


def test_float32_agreement_with_the_reference():
    ours, ref = _pair("learned", dtype=torch.float32)
    idx = torch.randint(SMALL["vocab_size"], (2, 16))
    torch.testing.assert_close(ours(idx), ref(idx), atol=2e-5, rtol=1e-4)


def test_head_is_tied_and_parameters_counted_once():
    model = GPT(GPTConfig(**SMALL))
    assert model.head.weight is model.tok_emb.weight
    c = SMALL["d_model"]
    per_block = 2 * 2 * c + (3 * c * c + 3 * c) + (c * c + c) + (4 * c * c + 4 * c) + (4 * c * c + c)
    expected = SMALL["vocab_size"] * c + SMALL["block_size"] * c + SMALL["n_layer"] * per_block + 2 * c
    assert model.num_params() == expected
    assert not any("MultiheadAttention" in type(m).__name__ or type(m) is torch.nn.LayerNorm
                   for m in model.modules())


@pytest.mark.parametrize("positions", ["learned", "sinusoidal", "rope"])
def test_cached_forward_equals_full_forward(positions):
    ours, _ = _pair(positions)
    idx = torch.randint(SMALL["vocab_size"], (2, 10))
    full = ours(idx)
    cache = KVCache(SMALL["n_layer"])
    parts = [ours(idx[:, :4], cache=cache)] + [ours(idx[:, t:t + 1], cache=cache) for t in range(4, 10)]
    assert len(cache) == 10
    torch.testing.assert_close(torch.cat(parts, dim=1), full, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("positions", ["learned", "rope"])
def test_greedy_generation_with_cache_gives_the_tokens_without(positions):
    ours, _ = _pair(positions, dtype=torch.float32)
    prompt = torch.randint(SMALL["vocab_size"], (2, 3))
    n = 3 * SMALL["block_size"]  # runs past the context window several times
    with_cache = ours.generate(prompt, n, greedy=True, use_cache=True)
    without = ours.generate(prompt, n, greedy=True, use_cache=False)
    assert with_cache.shape == (2, 3 + n)
    assert torch.equal(with_cache, without)
    assert torch.equal(with_cache[:, :3], prompt)


@pytest.mark.parametrize("positions", ["learned", "rope"])
def test_cropped_window_is_nanogpts_and_the_cache_agrees(positions):
    """window="crop" feeds the last block_size tokens, as nanoGPT's generate does; cache or not, same tokens."""
    ours, _ = _pair(positions, dtype=torch.float32)
    prompt = torch.randint(SMALL["vocab_size"], (2, 3))
    n = 2 * SMALL["block_size"]
    idx = prompt
    with torch.no_grad():
        for _ in range(n):  # nanoGPT: idx_cond = idx[:, -block_size:]
            idx = torch.cat((idx, ours(idx[:, -SMALL["block_size"]:])[:, -1].argmax(-1, keepdim=True)), dim=1)
    assert torch.equal(ours.generate(prompt, n, greedy=True, use_cache=False, window="crop"), idx)
    assert torch.equal(ours.generate(prompt, n, greedy=True, use_cache=True, window="crop"), idx)
    with pytest.raises(ValueError, match="window"):
        ours.generate(prompt, 1, window="full")


def test_dropout_also_acts_on_the_attention_output():
    """As in nanoGPT, x + drop(MHA(LN(x))): with the MLP zeroed, single entries of the attention branch are 0."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(**{**SMALL, "dropout": 0.5})).double().train()
    block = model.blocks[0]
    with torch.no_grad():
        block.mlp.proj.weight.zero_()
        block.mlp.proj.bias.zero_()
    x = torch.randn(2, 8, SMALL["d_model"], dtype=torch.float64)
    branch = block(x, positions=torch.arange(8)) - x  # drop(MHA(LN(x))), exactly
    rows_alive = branch.abs().sum(-1) > 0  # a row is all 0 only if every attention weight of it was dropped
    zero_share = (branch[rows_alive] == 0).double().mean()
    assert 0.3 < zero_share < 0.7  # about p of the entries of live rows
    assert torch.equal(block.eval()(x, positions=torch.arange(8)), block(x, positions=torch.arange(8)))


def test_sampling_is_reproducible_with_a_generator_and_respects_top_k():
    ours, _ = _pair("learned", dtype=torch.float32)
    prompt = torch.zeros(1, 1, dtype=torch.long)
    a = ours.generate(prompt, 30, temperature=0.8, top_k=3, generator=torch.Generator().manual_seed(1))
    b = ours.generate(prompt, 30, temperature=0.8, top_k=3, generator=torch.Generator().manual_seed(1))
    assert torch.equal(a, b)
    one = ours.generate(prompt, 10, top_k=1, generator=torch.Generator().manual_seed(2))
    assert torch.equal(one, ours.generate(prompt, 10, greedy=True))  # top-1 sampling is greedy


def test_attention_weights_are_causal_distributions():
    ours, _ = _pair("learned")
    _, weights = ours(torch.randint(SMALL["vocab_size"], (1, 8)), need_weights=True)
    assert len(weights) == SMALL["n_layer"] and weights[0].shape == (1, SMALL["n_head"], 8, 8)
    torch.testing.assert_close(weights[1].sum(-1), torch.ones(1, SMALL["n_head"], 8, dtype=torch.float64))
    assert (weights[0].triu(1) == 0).all()


def test_bad_input_and_bad_config():
    model = GPT(GPTConfig(**SMALL))
    with pytest.raises(ValueError, match="block_size=16"):
        model(torch.zeros(1, 17, dtype=torch.long))
    with pytest.raises(ValueError, match=r"shape \(B, T\)"):
        model(torch.zeros(17, dtype=torch.long))
    with pytest.raises(ValueError, match="integer tensor"):
        model(torch.zeros(1, 4))
    with pytest.raises(ValueError, match="token ids must lie"):
        model(torch.full((1, 4), 99))
    with pytest.raises(ValueError, match="divisible by n_head"):
        GPTConfig(d_model=10, n_head=4)
    with pytest.raises(ValueError, match="positions must be one of"):
        GPTConfig(positions="alibi")
    with pytest.raises(ValueError, match="d_k = d_model / n_head = 3 must be even"):
        GPTConfig(d_model=12, n_head=4, positions="rope")
    with pytest.raises(ValueError, match="dropout"):
        GPTConfig(dropout=1.0)
    with pytest.raises(ValueError, match="max_new_tokens"):
        model.generate(torch.zeros(1, 1, dtype=torch.long), -1)
    with pytest.raises(ValueError, match="temperature"):
        model.generate(torch.zeros(1, 1, dtype=torch.long), 2, temperature=0.0)


def test_training_uses_the_causal_shortcut_and_generation_records_no_graph():
    """The speed paths stay in use: training attention is _CausalAttention (T >= 32), and a forward under
    inference_mode builds no autograd graph yet gives the training path's logits."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=11, block_size=40, n_layer=2, n_head=2, d_model=16)).double()
    idx = torch.randint(0, 11, (2, 40))
    logits = model(idx)
    seen, todo, names = set(), [logits.grad_fn], set()
    while todo:
        f = todo.pop()
        if f is None or f in seen:
            continue
        seen.add(f)
        names.add(type(f).__name__)
        todo.extend(g for g, _ in f.next_functions)
    assert "_CausalAttentionBackward" in names and "_AttentionBackward" not in names
    assert {"_LayerNormFunctionBackward", "_TanhGELUBackward"} <= names
    with torch.inference_mode():
        fast = model(idx)
    assert fast.grad_fn is None
    torch.testing.assert_close(fast, logits.detach(), atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("window", ["half", "crop"])
@pytest.mark.parametrize("positions", ["learned", "rope"])
def test_cache_gives_the_same_logits_across_window_moves(positions, window):
    """float64, 40 greedy tokens from a 3-token prompt: the 16-token window moves (once per 8 tokens with "half",
    every step once full with "crop"); the last position's logits at every step agree to 1e-12, cache or not."""
    ours, _ = _pair(positions)
    prompt = torch.randint(SMALL["vocab_size"], (2, 3))
    logits = {}
    for use_cache in (True, False):
        steps = logits[use_cache] = []
        hook = ours.register_forward_hook(lambda m, args, out, steps=steps: steps.append(out[:, -1]))
        tokens = ours.generate(prompt, 40, greedy=True, use_cache=use_cache, window=window)
        hook.remove()
        logits[use_cache, "tokens"] = tokens
    assert len(logits[True]) == len(logits[False]) == 40
    assert torch.equal(logits[True, "tokens"], logits[False, "tokens"])
    torch.testing.assert_close(torch.stack(logits[True]), torch.stack(logits[False]), atol=1e-12, rtol=1e-12)
