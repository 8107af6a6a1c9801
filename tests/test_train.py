"""The trainer and its checkpoints (chapter 8): loss falls, determinism, resume = uninterrupted, NaN guard,
and clear errors for corrupt, mismatched and foreign checkpoints."""

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from transformer_lab import checkpoint as ckpt
from transformer_lab.data import Corpus, shakespeare
from transformer_lab.gpt import GPT, GPTConfig
from transformer_lab.train import TrainConfig, Trainer, TrainingDiverged, evaluate_loss

TEXT = shakespeare()[:60_000]
TC = TrainConfig(max_iters=24, batch_size=4, block_size=16, warmup=4, eval_interval=8, eval_iters=2, seed=7)


def _setup(tc=TC, **kw):
    corpus = Corpus.from_text(TEXT, name="excerpt")
    torch.manual_seed(tc.seed)
    config = GPTConfig(vocab_size=corpus.tokenizer.vocab_size, block_size=16, n_layer=1, n_head=2, d_model=16,
                       **kw)
    return GPT(config), corpus


def test_a_short_run_lowers_the_loss():
    model, corpus = _setup(replace(TC, max_iters=60, eval_interval=60, lr=3e-3))
    before = evaluate_loss(model, corpus.val, block_size=16, max_windows=64)
    trainer = Trainer(model, corpus, replace(TC, max_iters=60, eval_interval=60, lr=3e-3), progress=False)
    history = trainer.run()
    after = evaluate_loss(model, corpus.val, block_size=16, max_windows=64)
    assert before > 3.5 and after < before - 0.6, (before, after)
    assert len(history["loss"]) == 60 and [e["step"] for e in history["eval"]] == [0, 60]


def test_fixed_seeds_give_identical_curves():
    curves = []
    for _ in range(2):
        model, corpus = _setup(dropout=0.1)
        curves.append(Trainer(model, corpus, TC, progress=False).run())
    assert curves[0] == curves[1]


def test_resume_equals_an_uninterrupted_run(tmp_path):
    model, corpus = _setup(dropout=0.1)  # dropout: the global RNG state must be restored too
    full = Trainer(model, corpus, TC, progress=False).run()

    model, corpus = _setup(dropout=0.1)
    killed = Trainer(model, corpus, TC, checkpoint=tmp_path / "run.json", progress=False)
    killed.run(until=13)  # "killed" at step 13; the last checkpoint is from step 8
    assert json.loads((tmp_path / "run.json").read_text())["step"] == 8

    model, corpus = _setup(dropout=0.1)
    torch.manual_seed(12345)  # a fresh process has other RNG states: resume must restore them
    resumed = Trainer(model, corpus, TC, checkpoint=tmp_path / "run.json", progress=False)
    resumed.resume(tmp_path / "run.json")
    assert resumed.step == 8
    assert resumed.run() == full
    assert len(list(tmp_path.glob("run.*.safetensors"))) == 1  # old weight files are cleaned up


def test_nan_guard_names_the_step():
    model, corpus = _setup()

    def poison(trainer):
        if trainer.step == 5:
            with torch.no_grad():
                trainer.model.ln_f.weight.fill_(float("nan"))

    with pytest.raises(TrainingDiverged, match="at step 5: the loss is nan"):
        Trainer(model, corpus, TC, progress=False).run(callback=poison)


def test_infinite_gradient_is_caught():
    model, corpus = _setup()
    trainer = Trainer(model, corpus, replace(TC, grad_clip=0.0), progress=False)
    model.tok_emb.weight.register_hook(lambda g: g * float("inf"))
    with pytest.raises(TrainingDiverged, match="at step 0"):
        trainer.train_step(*next(iter(trainer.eval_batches["train"])))


def _saved(tmp_path):
    model, corpus = _setup()
    trainer = Trainer(model, corpus, TC, checkpoint=tmp_path / "c.json", progress=False)
    trainer.run(until=8)
    return model, corpus, tmp_path / "c.json"


@pytest.mark.parametrize("fail_on", ["safetensors", "json"])
def test_an_interrupted_save_leaves_the_previous_checkpoint(tmp_path, monkeypatch, fail_on):
    """A crash while writing either file leaves the earlier checkpoint readable and no stray files behind."""
    model, _, path = _saved(tmp_path)
    before = ckpt.read(path)[0]["step"]
    files = sorted(tmp_path.iterdir())
    real = Path.write_bytes if fail_on == "safetensors" else Path.write_text

    def crash(self, data, *args, **kwargs):
        real(self, data[: len(data) // 2], *args, **kwargs)  # half a file, then the machine stops
        raise KeyboardInterrupt

    monkeypatch.setattr(Path, "write_bytes" if fail_on == "safetensors" else "write_text", crash)
    with torch.no_grad():
        model.tok_emb.weight.add_(1.0)
    with pytest.raises(KeyboardInterrupt):
        ckpt.save(path, model=model, meta={"config": json.loads(path.read_text())["config"], "step": 99})
    monkeypatch.undo()
    assert ckpt.read(path)[0]["step"] == before
    assert sorted(tmp_path.iterdir()) == files


def test_checkpoint_round_trip_restores_weights(tmp_path):
    model, _, path = _saved(tmp_path)
    record, tensors = ckpt.read(path)
    other = GPT(GPTConfig(**record["config"]))
    ckpt.load_model_state(other, tensors)
    for (n, a), (_, b) in zip(model.state_dict().items(), other.state_dict().items(), strict=True):
        assert torch.equal(a, b), n
    assert other.head.weight is other.tok_emb.weight  # still tied after loading


def test_truncated_checkpoint_is_refused(tmp_path):
    _, _, path = _saved(tmp_path)
    weights = next(tmp_path.glob("c.*.safetensors"))
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(ckpt.CheckpointError, match="truncated or corrupt"):
        ckpt.read(path)
    weights.unlink()
    with pytest.raises(ckpt.CheckpointError, match="which is missing"):
        ckpt.read(path)


def test_mismatched_checkpoint_is_refused(tmp_path):
    _, corpus, path = _saved(tmp_path)
    _, tensors = ckpt.read(path)
    bigger = GPT(GPTConfig(vocab_size=corpus.tokenizer.vocab_size, block_size=16, n_layer=2, n_head=2, d_model=16))
    with pytest.raises(ckpt.CheckpointError, match=r"missing tensors \['blocks.1"):
        ckpt.load_model_state(bigger, tensors)
    wider = GPT(GPTConfig(vocab_size=corpus.tokenizer.vocab_size, block_size=16, n_layer=1, n_head=2, d_model=32))
    want = r"shape mismatch blocks.0.attn.in_proj.bias: checkpoint \(48,\), model \(96,\)"
    with pytest.raises(ckpt.CheckpointError, match=want):
        ckpt.load_model_state(wider, tensors)
    model, corpus = _setup(dropout=0.1)
    with pytest.raises(ckpt.CheckpointError, match=r"another config; differing fields: \['dropout'\]"):
        Trainer(model, corpus, TC, progress=False).resume(path)
    model, corpus = _setup()
    with pytest.raises(ckpt.CheckpointError, match="another training config; differing: \\['lr'\\]"):
        Trainer(model, corpus, replace(TC, lr=5e-3), progress=False).resume(path)
    model, _ = _setup()
    other_text = Corpus.from_text(TEXT[::-1], name="reversed")
    with pytest.raises(ckpt.CheckpointError, match="different text"):
        Trainer(model, other_text, TC, progress=False).resume(path)


def test_foreign_checkpoints_are_refused_and_never_unpickled(tmp_path):
    pt = tmp_path / "model.pt"
    torch.save({"weights": torch.zeros(2)}, pt)  # a pickle
    with pytest.raises(ckpt.CheckpointError, match="not a transformer_lab checkpoint"):
        ckpt.read(pt.with_suffix(".json").write_bytes(pt.read_bytes()) and pt.with_suffix(".json"))
    (tmp_path / "other.json").write_text(json.dumps({"model": "gpt2", "weights": "x.safetensors"}))
    with pytest.raises(ckpt.CheckpointError, match="its 'format' is not"):
        ckpt.read(tmp_path / "other.json")
    with pytest.raises(ckpt.CheckpointError, match="no checkpoint at"):
        ckpt.read(tmp_path / "nothing.json")
    _, _, path = _saved(tmp_path)
    record = json.loads(path.read_text())
    weights = tmp_path / record["weights"]
    weights.write_bytes(b"\x80\x04" + b"not safetensors" * 10)  # a pickle header where tensors should be
    record["weights_sha256"] = ckpt._file_sha256(weights)
    path.write_text(json.dumps(record))
    with pytest.raises(ckpt.CheckpointError, match="not a readable safetensors file"):
        ckpt.read(path)


def test_weights_only_checkpoint_cannot_be_resumed(tmp_path):
    model, corpus = _setup()
    trainer = Trainer(model, corpus, TC, progress=False)
    trainer.save(tmp_path / "w.json", weights_only=True)
    record, tensors = ckpt.read(tmp_path / "w.json")
    assert record["step"] == 0 and not any(name.startswith("optimizer.") for name in tensors)
    with pytest.raises(ckpt.CheckpointError, match="no optimizer state"):
        ckpt.load_optimizer_state(trainer.optimizer, model, record, tensors)
    with pytest.raises(ckpt.CheckpointError, match="no optimizer state"):
        Trainer(model, corpus, TC, progress=False).resume(tmp_path / "w.json")


def test_train_config_validation():
    with pytest.raises(ValueError, match="max_iters must be a positive int"):
        TrainConfig(max_iters=0)
    with pytest.raises(ValueError, match="warmup must lie in"):
        TrainConfig(max_iters=10, warmup=10)
    with pytest.raises(ValueError, match="min_lr <= lr"):
        TrainConfig(lr=1e-4, min_lr=1e-3)
    model, _ = _setup()
    tiny = Corpus.from_text("abcdefghij" * 3)
    with pytest.raises(ValueError, match="too few for block_size"):
        Trainer(model, tiny, TC, progress=False)
    corpus = Corpus.from_text(TEXT)
    narrow = GPT(GPTConfig(vocab_size=corpus.tokenizer.vocab_size - 1, block_size=16, n_layer=1, n_head=2, d_model=16))
    with pytest.raises(ValueError, match=f"{corpus.tokenizer.vocab_size} distinct characters, more than the model's "
                                         f"vocab_size={corpus.tokenizer.vocab_size - 1}"):
        Trainer(narrow, corpus, TC, progress=False)  # a target id could fall outside the logits
    assert math.isfinite(evaluate_loss(model, Corpus.from_text(TEXT).val, block_size=16, max_windows=4))


def test_compiled_training_equals_eager_up_to_round_off():
    """Trainer(compile=True) fuses the same formulas with torch.compile: the same losses, step for step."""
    tc = replace(TC, max_iters=3, eval_interval=3, warmup=1)
    histories, weights, clips = [], [], []
    for compile_ in (False, True):
        model, corpus = _setup(tc)
        trainer = Trainer(model, corpus, tc, progress=False, compile=compile_)
        if compile_:  # the compiled clipping runs at every step
            kernel = trainer.optimizer._clip
            trainer.optimizer._clip = lambda grads, max_norm, kernel=kernel: clips.append(max_norm) or kernel(
                grads, max_norm)
        histories.append(trainer.run()["loss"])
        weights.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
        assert (trainer.loss_of == trainer._loss_of) is not compile_  # the forward and loss: one compiled function
        assert (trainer.optimizer._kernel is None) is not compile_  # the update compiled with the forward
        assert (trainer.optimizer._clip is None) is not compile_  # and the clipping
    assert clips == [tc.grad_clip] * 3
    assert len(histories[0]) == 3
    assert histories[1] == pytest.approx(histories[0], rel=1e-4)
    assert torch.allclose(weights[1], weights[0], rtol=0, atol=1e-5)  # lr 1e-3 steps: 1e-5 is 1% of one


def test_compiling_the_blocks_alone_trains_as_eagerly_up_to_round_off():
    """Trainer.compile_(blocks=True) compiles each block (one shared code) and the update, and leaves the forward
    with its loss eager: the same losses and weights up to round-off."""
    tc = replace(TC, max_iters=3, eval_interval=3, warmup=1)
    histories, weights = [], []
    for blocks in (None, True):
        model, corpus = _setup(tc)
        trainer = Trainer(model, corpus, tc, progress=False)
        if blocks:
            trainer.compile_(blocks=True)
            assert trainer.loss_of == trainer._loss_of and trainer.optimizer._kernel is not None
            assert all(b._compiled_call_impl is not None for b in model.blocks)
        histories.append(trainer.run()["loss"])
        weights.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    assert histories[1] == pytest.approx(histories[0], rel=1e-4)
    assert torch.allclose(weights[1], weights[0], rtol=0, atol=1e-5)
