"""Devices, mixed precision and gradient accumulation (issue 16), on the CPU.

No GPU is needed to catch a tensor created on the wrong device: with ``torch.device("meta")`` as the default
device, every tensor a component creates *without* following its input lands on ``meta``, and mixing it with the
CPU input fails. The GPU paths run the same code with another device.
"""

import dataclasses

import pytest
import torch

from transformer_lab import checkpoint as ckpt
from transformer_lab import distributed
from transformer_lab.cli import load_model
from transformer_lab.data import Corpus, get_batch, shakespeare
from transformer_lab.gpt import GPT, POSITIONS, GPTConfig, KVCache
from transformer_lab.positional import alibi_bias, apply_rope, causal_mask, sinusoidal_encoding
from transformer_lab.train import TrainConfig, Trainer


def tiny(positions="learned", **kw):
    return GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, d_model=8, positions=positions, **kw)


@pytest.mark.parametrize("positions", POSITIONS)
def test_components_create_tensors_on_their_inputs_device(positions):
    torch.manual_seed(0)
    model = GPT(tiny(positions, dropout=0.1))
    idx, data = torch.randint(11, (2, 6)), torch.arange(50)
    with torch.device("meta"):  # a tensor made without device= would be on meta and fail to mix with the CPU
        logits = model(idx)
        cache = KVCache(1)
        model(idx[:, :4], cache=cache)
        step = model(idx[:, 4:], cache=cache)
        model.generate(idx, 4, generator=torch.Generator().manual_seed(0))
        x, y = get_batch(data, block_size=8, batch_size=3, generator=torch.Generator())
        assert x.device.type == y.device.type == "cpu"
    assert logits.device.type == step.device.type == "cpu"


def test_the_meta_trick_catches_a_tensor_created_without_device():
    """What the GPT's ``positions = torch.arange(start, start + T)`` (no device=) did before issue 16."""
    x = torch.randn(4)
    with torch.device("meta"), pytest.raises(RuntimeError, match="meta"):
        torch.add(x, torch.arange(4))


def test_positions_follow_the_input_dtype_and_device():
    with torch.device("meta"):
        assert sinusoidal_encoding(5, 8, dtype=torch.bfloat16, device="cpu").device.type == "cpu"
        assert causal_mask(3, device="cpu").device.type == "cpu"
        assert alibi_bias(3, n_head=2, device="cpu", dtype=torch.float16).dtype == torch.float16
        x = torch.randn(2, 3, 4, dtype=torch.bfloat16)
        assert apply_rope(x).dtype == torch.bfloat16


@pytest.mark.parametrize("positions", POSITIONS)
def test_float64_model_gives_float64_logits(positions):
    model = GPT(tiny(positions)).double()
    assert model(torch.randint(11, (2, 5))).dtype == torch.float64


def test_checkpoint_is_device_independent_and_loads_onto_a_device(tmp_path):
    torch.manual_seed(0)
    model = GPT(tiny("rope"))
    tok_chars = "".join(chr(97 + i) for i in range(11))
    path = ckpt.save(tmp_path / "m.json", model=model, meta={"config": dataclasses.asdict(model.config),
                                                            "vocab": tok_chars})
    _record, tensors = ckpt.read(path, device="cpu")
    assert all(t.device.type == "cpu" for t in tensors.values())
    loaded, _, _ = load_model(path, device=torch.device("cpu"))
    idx = torch.randint(11, (1, 6))
    torch.testing.assert_close(loaded(idx), model.eval()(idx), rtol=0, atol=0)


def test_device_and_precision_choices_fail_clearly():
    with pytest.raises(ValueError, match="--device must be one of"):
        distributed.pick_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA GPU"):
            distributed.pick_device("cuda")
    assert distributed.pick_device("auto").type in ("cuda", "mps", "cpu")
    with pytest.raises(ValueError, match="--dtype must be one of"):
        distributed.check_precision("float8", torch.device("cpu"))
    assert distributed.check_precision("bfloat16", torch.device("cpu")) == torch.bfloat16


CORPUS = Corpus.from_text(shakespeare()[:30_000], name="excerpt")


def _trainer(precision=torch.float32, dtype=torch.float32, **train):
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=CORPUS.tokenizer.vocab_size, block_size=16, n_layer=2, n_head=2,
                          d_model=32)).to(dtype)
    config = TrainConfig(**{"max_iters": 40, "batch_size": 8, "block_size": 16, "warmup": 4, "eval_interval": 40,
                            "eval_iters": 2, "lr": 3e-3, **train})
    return Trainer(model, CORPUS, config, progress=False, precision=precision)


BF16_TOLERANCE = 0.02  # nats: |bf16-autocast loss - float32 loss| at every step of a 40-step run, stated in chapter 8


def test_bfloat16_autocast_loss_curve_stays_within_tolerance_of_float32():
    ref = _trainer().run()["loss"]
    bf16 = _trainer(torch.bfloat16).run()["loss"]
    gap = max(abs(a - b) for a, b in zip(ref, bf16, strict=True))
    assert gap < BF16_TOLERANCE, gap
    assert ref[-1] < ref[0] - 0.5 and bf16[-1] < bf16[0] - 0.5  # both learn


def test_float16_autocast_trains_with_a_gradient_scaler(tmp_path):
    trainer = _trainer(torch.float16, max_iters=6, eval_interval=3)
    assert trainer.scaler.is_enabled()
    trainer.checkpoint = ckpt.json_path(tmp_path / "h.json")
    loss = trainer.run()["loss"]
    assert len(loss) == 6 and all(map(torch.isfinite, torch.tensor(loss)))
    record, _ = ckpt.read(trainer.checkpoint)
    assert record["grad_scaler"]["scale"] > 0 and record["precision"] == "float16"
    again = _trainer(torch.float16, max_iters=6, eval_interval=3)
    again.resume(trainer.checkpoint)
    assert again.scaler.get_scale() == trainer.scaler.get_scale()


def test_gradient_accumulation_equals_the_larger_batch_in_float64():
    """K micro-batches of B with --grad-accum K and one batch of K·B: the same windows (one seeded stream), the
    same update; in float64 the parameters agree to round-off after a few steps."""
    K, B = 4, 3
    big = _trainer(dtype=torch.float64, batch_size=K * B, max_iters=5, eval_interval=5)
    acc = _trainer(dtype=torch.float64, batch_size=B, grad_accum=K, max_iters=5, eval_interval=5)
    assert acc.global_batch == big.global_batch == K * B
    la, lb = acc.run()["loss"], big.run()["loss"]
    torch.testing.assert_close(torch.tensor(la), torch.tensor(lb), rtol=1e-12, atol=1e-12)
    for (name, p), q in zip(acc.model.named_parameters(), big.model.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-10, atol=1e-12, msg=name)
    moved = sum(float((p - q).abs().max()) for p, q in zip(acc.model.parameters(), _trainer(
        dtype=torch.float64).model.parameters(), strict=True))
    assert moved > 1e-3  # the steps did change the weights


def test_grad_accum_must_be_positive():
    with pytest.raises(ValueError, match="grad_accum"):
        TrainConfig(grad_accum=0)
