"""The inspector (chapter 8): residual stream, attention per head and the logit lens, read from a GPT."""

import math

import pytest
import torch

from transformer_lab import cli
from transformer_lab.data import CharTokenizer
from transformer_lab.gpt import GPT, GPTConfig
from transformer_lab.lens import format_reading, read
from transformer_lab.positional import apply_rope, causal_mask

TOK = CharTokenizer.from_text("abcdefghij ,.:\n")


@pytest.fixture(params=["learned", "sinusoidal", "rope"])
def model(request):
    torch.manual_seed(0)
    m = GPT(GPTConfig(vocab_size=TOK.vocab_size, block_size=12, n_layer=3, n_head=2, d_model=16,
                      positions=request.param))
    with torch.no_grad():  # move the LayerNorms and biases off 1 and 0 so that nothing hides
        for p in m.parameters():
            if p.dim() == 1:
                p.add_(0.3 * torch.randn_like(p))
    return m.eval()


def test_shapes(model):
    r = read(model, TOK, "abc, def")
    L, h, T, C, V = 3, 2, 8, 16, TOK.vocab_size
    assert r.residual.shape == (L + 1, T, C) and r.attention.shape == (L, h, T, T)
    assert r.lens_logits.shape == (L + 1, T, V) and r.logits.shape == (T, V)
    assert r.residual_norm.shape == r.entropy.shape == (L + 1, T)


def test_the_logit_lens_at_the_last_layer_is_the_models_output(model):
    r = read(model, TOK, "abc, def")
    with torch.no_grad():
        logits = model(TOK.encode("abc, def").view(1, -1))[0]
    torch.testing.assert_close(r.lens_logits[-1], logits, rtol=0, atol=1e-6)
    torch.testing.assert_close(r.logits, logits, rtol=0, atol=0)


def test_the_residual_stream_and_the_attention_are_the_models(model):
    """x_0 is the embedding plus positions; each x_l is block l's output; each head's weights are
    softmax(Q Kᵀ / √d_k) under the causal mask, recomputed here from x_{l-1} by the formula."""
    text = "bad, chief"
    idx = TOK.encode(text).view(1, -1)
    r = read(model, TOK, text)
    T = len(text)
    positions = torch.arange(T)
    with torch.no_grad():
        x = model.tok_emb(idx)
        if model.config.positions == "learned":
            x = x + model.pos_emb(positions)
        elif model.config.positions == "sinusoidal":
            from transformer_lab.positional import sinusoidal_encoding
            x = x + sinusoidal_encoding(T, model.config.d_model)
        torch.testing.assert_close(r.residual[0], x[0])
        for l, block in enumerate(model.blocks):
            q, k, _ = block.attn.split_qkv(block.ln1(r.residual[l][None]))  # (1, h, T, d_k)
            if model.config.positions == "rope":
                q, k = apply_rope(q, positions), apply_rope(k, positions)
            s = (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).masked_fill(~causal_mask(T), -math.inf)
            torch.testing.assert_close(r.attention[l], torch.softmax(s, -1)[0], rtol=0, atol=1e-6)
            torch.testing.assert_close(r.residual[l + 1], block(r.residual[l][None], positions=positions)[0])


def test_entropy_and_top(model):
    r = read(model, TOK, "abc")
    p = r.probs
    torch.testing.assert_close(p.sum(-1), torch.ones(4, 3))
    torch.testing.assert_close(r.entropy, -(p * p.log()).sum(-1))
    top = r.top(2, 1, k=3)
    assert len(top) == 3 and top[0][1] >= top[1][1] >= top[2][1]
    assert top[0][0] == TOK.chars[int(p[2, 1].argmax())]


def test_read_leaves_the_model_as_it_was(model):
    model.train()
    read(model, TOK, "ab")
    assert model.training and not any(b._forward_hooks or b._forward_pre_hooks for b in model.blocks)


@pytest.mark.parametrize(("prompt", "words"), [("", "at least one character"), ("abcΩ", "unknown character"),
                                           ("a" * 13, "at most block_size = 12"), (None, "at least one")])
def test_bad_prompts(model, prompt, words):
    with pytest.raises(ValueError, match=words):
        read(model, TOK, prompt)


def test_format_reading(model):
    text = format_reading(read(model, TOK, "abc, d"), position=2, top=2)
    assert "position 2 ('c')" in text and text.count("block 1 head") == 2 and "x_3" in text


def test_cli_inspect_prints_every_layer(capsys):
    assert cli.main(["inspect", "--prompt", "ROMEO:\nWhat", "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert "predicting the next character" in out and "block 4 head 4" in out and "x_4" in out


@pytest.mark.parametrize(("argv", "words"), [
    (["--prompt", "Hamlet Ω"], "unknown character(s) 'Ω'"),
    (["--prompt", "a" * 300], "at most block_size = 256"),
    (["--prompt", ""], "at least one character"),
    (["--prompt", "abc", "--position", "3"], "--position must lie in -3..2"),
    (["--top", "0"], "--top must be an integer >= 1"),
    (["--checkpoint", "/no/such/model.json"], "no checkpoint"),
])
def test_cli_inspect_bad_input(argv, words, capsys):
    assert cli.main(["inspect", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and words in err and "Traceback" not in err
