"""Checkpoints under faults (chapter 8, issue 12): saving never loses another checkpoint or a good one, a damaged
record is refused before anything is touched, and random damage to the JSON or the weights raises
``CheckpointError`` and nothing else (Hypothesis), without ever unpickling."""

import base64
import contextlib
import json
import math
import pickle
import shutil
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from transformer_lab import checkpoint as ckpt
from transformer_lab.cli import load_model
from transformer_lab.data import Corpus, shakespeare
from transformer_lab.gpt import GPT, GPTConfig
from transformer_lab.train import TrainConfig, Trainer, TrainingDiverged

TEXT = shakespeare()[:20_000]
TC = TrainConfig(max_iters=6, batch_size=4, block_size=16, warmup=1, eval_interval=3, eval_iters=1, seed=3)


def _setup(tc=TC):
    corpus = Corpus.from_text(TEXT, name="excerpt")
    torch.manual_seed(tc.seed)
    return GPT(GPTConfig(vocab_size=corpus.tokenizer.vocab_size, block_size=16, n_layer=1, n_head=2,
                         d_model=16)), corpus


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A resumable checkpoint at step 3: (its folder, the JSON text, the weights bytes)."""
    folder = tmp_path_factory.mktemp("ckpt")
    model, corpus = _setup()
    Trainer(model, corpus, TC, checkpoint=folder / "c.json", progress=False).run(until=4)
    record = json.loads((folder / "c.json").read_text())
    assert record["step"] == 3
    return folder, (folder / "c.json").read_text(), (folder / record["weights"]).read_bytes()


def _copy(saved, dest: Path) -> Path:
    _, text, weights = saved
    (dest / "c.json").write_text(text)
    (dest / json.loads(text)["weights"]).write_bytes(weights)
    return dest / "c.json"


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


# ------------------------------------------------------------------ bug 1: a save deletes only its own files
def test_saving_one_checkpoint_keeps_another_whose_name_starts_alike(tmp_path):
    model, _ = _setup()
    ckpt.save(tmp_path / "model.best.json", model=model, meta={"config": {}})
    with torch.no_grad():
        model.tok_emb.weight.add_(1.0)  # other weights: another tensor file name
    ckpt.save(tmp_path / "model.json", model=model, meta={"config": {}})
    ckpt.save(tmp_path / "model.json", model=model, meta={"config": {}, "again": 1})
    ckpt.read(tmp_path / "model.best.json")  # used to fail: its weights file was gone
    ckpt.read(tmp_path / "model.json")
    assert len(list(tmp_path.glob("*.safetensors"))) == 2


def test_a_save_removes_its_own_earlier_tensor_files(tmp_path):
    model, _ = _setup()
    for k in range(3):
        with torch.no_grad():
            model.tok_emb.weight.add_(1.0)
        ckpt.save(tmp_path / "m.json", model=model, meta={"config": {}, "k": k})
    assert [p.name for p in tmp_path.glob("m.*.safetensors")] == [json.loads((tmp_path / "m.json").read_text())[
        "weights"]]


def test_a_copy_of_the_json_keeps_its_weights_when_the_original_is_saved_again(tmp_path):
    model, _ = _setup()
    ckpt.save(tmp_path / "a.json", model=model, meta={"config": {}})
    shutil.copy(tmp_path / "a.json", tmp_path / "backup.json")  # cp a.json backup.json
    for k in range(2):  # the next saves of a.json (a resumed run, or --force)
        with torch.no_grad():
            model.tok_emb.weight.add_(1.0)
        ckpt.save(tmp_path / "a.json", model=model, meta={"config": {}, "k": k})
    ckpt.read(tmp_path / "backup.json")  # used to fail: a.json's save deleted the weights the copy names
    assert len(list(tmp_path.glob("a.*.safetensors"))) == 2  # the copy's and the latest; the one between is gone


# ------------------------------------------------------------------ bug 2: divergence never overwrites a good save
def test_a_diverged_run_keeps_the_last_good_checkpoint(tmp_path):
    tc = replace(TC, max_iters=10, warmup=0, eval_interval=1, lr=1e10, min_lr=1e10, weight_decay=0.0)
    model, corpus = _setup(tc)
    with pytest.raises(TrainingDiverged) as info:
        Trainer(model, corpus, tc, checkpoint=tmp_path / "d.json", progress=False).run()
    text = (tmp_path / "d.json").read_text()
    record = json.loads(text, parse_constant=lambda name: pytest.fail(f"bare {name} in the JSON"))
    assert record["step"] == 0 and all(math.isfinite(e["val"]) for e in record["history"]["eval"])
    ckpt.read(tmp_path / "d.json")
    assert "last good checkpoint" in str(info.value)


def test_save_refuses_non_finite_weights_and_numbers(tmp_path):
    model, _ = _setup()
    ckpt.save(tmp_path / "g.json", model=model, meta={"config": {}})
    before = _snapshot(tmp_path)
    with pytest.raises(ckpt.CheckpointError, match="non-finite"):
        ckpt.save(tmp_path / "g.json", model=model, meta={"config": {}, "history": {"loss": [float("nan")]}})
    with torch.no_grad():
        model.ln_f.weight[0] = float("inf")
    with pytest.raises(ckpt.CheckpointError, match="NaN or inf"):
        ckpt.save(tmp_path / "g.json", model=model, meta={"config": {}})
    assert _snapshot(tmp_path) == before


# ------------------------------------------------------------------ bug 3: an absurd learning rate
def test_an_absurd_learning_rate_is_refused_or_reported_as_divergence():
    with pytest.raises(ValueError, match="lr=1e\\+39 is too large"):
        replace(TC, lr=1e39)
    model, corpus = _setup()
    trainer = Trainer(model, corpus, TC, progress=False)

    def absurd(optimizer, step):  # past the config's check: the optimizer's own float32 overflow
        for g in optimizer.param_groups:
            g["lr"] = 1e39
        return 1e39

    trainer.schedule = SimpleNamespace(apply=absurd)
    with pytest.raises(TrainingDiverged, match="at step 0"):
        trainer.train_step(*trainer.eval_batches["train"][0])


@pytest.mark.parametrize("field", ["weight_decay", "grad_clip"])
def test_nan_weight_decay_and_clip_are_refused(field):
    with pytest.raises(ValueError, match="finite"):
        replace(TC, **{field: float("nan")})


# ------------------------------------------------------------------ bug 5: sample on a checkpoint without vocab
@pytest.mark.parametrize(("change", "words"), [
    (lambda r: r.pop("vocab"), "'vocab' must be"),
    (lambda r: r.update(vocab=123), "'vocab' must be"),
    (lambda r: r.update(vocab="ba"), "'vocab' must be"),
    (lambda r: r.update(weights=["x.safetensors"]), "'weights' must be"),
    (lambda r: r.update(weights=None), "'weights' must be"),
    (lambda r: r.update(weights_sha256=5), "'weights_sha256' must be"),
    (lambda r: r.update(config=[1, 2]), "'config' must be"),
    (lambda r: r["config"].update(bias="no"), "bias must be true or false"),
    (lambda r: r.update(version=1.0), "checkpoint version 1.0"),
    (lambda r: r.update(version=True), "checkpoint version True"),
])
def test_load_model_refuses_a_damaged_record_with_checkpoint_error(saved, tmp_path, change, words):
    path = _copy(saved, tmp_path)
    record = json.loads(path.read_text())
    change(record)
    path.write_text(json.dumps(record))
    with pytest.raises(ckpt.CheckpointError, match=words):
        load_model(path)


@pytest.mark.parametrize("dtype", [torch.int32, torch.float16, torch.bfloat16, torch.float64])
def test_weights_of_another_dtype_are_refused(saved, tmp_path, dtype):
    _, tensors = ckpt.read(_copy(saved, tmp_path))
    name = next(iter(tensors))
    tensors[name] = tensors[name].to(dtype)
    with pytest.raises(ckpt.CheckpointError, match=f"is {dtype}; a checkpoint holds float32 weights"):
        ckpt.check_model_state({k.removeprefix("model."): tuple(v.shape) for k, v in tensors.items()
                                if k.startswith("model.")}, tensors)


# ------------------------------------------------------------------ bug 6: resume checks the whole record first
def _rng_cut(r):
    r["rng"]["batches"] = r["rng"]["batches"][:100]


DAMAGE = {
    "no rng": (lambda r: r.pop("rng"), "'rng' must be"),
    "truncated rng": (_rng_cut, "'rng.batches' is not a saved generator state"),
    "rng not base64": (lambda r: r["rng"].update(torch="!!!"), "'rng.torch'"),
    "no optimizer scalars": (lambda r: r["optimizer"].update(scalars={}), "AdamW needs"),
    "negative step": (lambda r: r.update(step=-1), "'step' must be"),
    "step past max_iters": (lambda r: r.update(step=10**6), "'step' must be"),
    "step as text": (lambda r: r.update(step="3"), "'step' must be"),
    "history too short": (lambda r: r["history"]["loss"].pop(), "'history.loss' must hold 3"),
    "no history": (lambda r: r.pop("history"), "'history' must be"),
    "optimizer step count": (lambda r: r["optimizer"]["scalars"]["ln_f.weight"]["step"].update(value=99),
                             "step count"),
    "optimizer group": (lambda r: r["optimizer"]["param_groups"][0].update(lr="fast"), "setting 'lr'"),
    "negative eps": (lambda r: r["optimizer"]["param_groups"][0].update(eps=-1), "setting 'eps' is -1"),
    "betas above one": (lambda r: r["optimizer"]["param_groups"][0].update(betas=[5, 7]), "setting 'betas'"),
    "absurd weight decay": (lambda r: r["optimizer"]["param_groups"][0].update(weight_decay=1e300),
                            "setting 'weight_decay'"),
    "another precision": (lambda r: r.update(precision="bfloat16"), "resume with --dtype bfloat16"),
    "optimizer not an object": (lambda r: r.update(optimizer=[]), "'optimizer' entry"),
}


@pytest.mark.parametrize("name", list(DAMAGE))
def test_resume_refuses_damage_before_touching_anything(saved, tmp_path, name):
    change, words = DAMAGE[name]
    path = _copy(saved, tmp_path)
    record = json.loads(path.read_text())
    change(record)
    path.write_text(json.dumps(record))
    model, corpus = _setup()
    trainer = Trainer(model, corpus, TC, progress=False)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    rng = trainer.generator.get_state()
    with pytest.raises(ckpt.CheckpointError, match=words):
        trainer.resume(path)
    assert all(torch.equal(weights[k], v) for k, v in model.state_dict().items()), "weights were changed"
    assert not trainer.optimizer.state and trainer.step == 0 and torch.equal(trainer.generator.get_state(), rng)


# ------------------------------------------------------------------ bug 7: shapes before building
def test_a_huge_vocab_in_the_config_is_refused_before_any_allocation(saved, tmp_path):
    path = _copy(saved, tmp_path)
    record = json.loads(path.read_text())
    vocab_size = record["config"]["vocab_size"]
    record["config"]["vocab_size"] = 2**40  # 2**40 x 16 float32 = 64 TiB if it were built
    path.write_text(json.dumps(record))
    with pytest.raises(ckpt.CheckpointError, match=r"shape mismatch|'vocab' must be"):
        load_model(path)
    record["config"]["vocab_size"] = vocab_size
    record["config"]["n_layer"] = 10**7  # a million blocks would take minutes to build
    path.write_text(json.dumps(record))
    with pytest.raises(ckpt.CheckpointError, match="layers but it holds only"):
        load_model(path)


def test_the_shape_check_itself_runs_on_the_meta_device(saved, tmp_path):
    path = _copy(saved, tmp_path)
    record, tensors = ckpt.read(path)
    config = GPTConfig(**{**record["config"], "vocab_size": 2**40})
    with torch.device("meta"):
        want = ckpt.expected_shapes(GPT(config))
    with pytest.raises(ckpt.CheckpointError, match=r"tok_emb.weight: checkpoint \(\d+, 16\), model \(1099511627776"):
        ckpt.check_model_state(want, tensors)


# ------------------------------------------------------------------ property tests (Hypothesis)
@pytest.fixture
def no_unpickling(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("something tried to unpickle")

    for mod, name in ((pickle, "loads"), (pickle, "load"), (pickle, "Unpickler"), (torch, "load")):
        monkeypatch.setattr(mod, name, refuse)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6)


def _paths(obj, prefix=()):
    """Every (key path) in a JSON value, the root included."""
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj[:4]):  # a few list items are enough
            yield from _paths(v, (*prefix, i))


def _try_everything(path: Path) -> None:
    """The three ways a checkpoint is read: read(), load_model (sample), Trainer.resume (train --resume)."""
    ckpt.read(path)
    load_model(path)
    model, corpus = _setup()
    Trainer(model, corpus, TC, progress=False).resume(path)


SETTINGS = settings(max_examples=60, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@SETTINGS
@given(data=st.data())
def test_random_damage_to_the_json_raises_checkpoint_error_only(saved, tmp_path, no_unpickling, data):
    path = _copy(saved, tmp_path)
    record = json.loads(path.read_text())
    kind = data.draw(st.sampled_from(["replace", "delete", "truncate", "flip byte"]))
    if kind in ("replace", "delete"):
        where = data.draw(st.sampled_from(list(_paths(record))[1:]))
        parent = record
        for k in where[:-1]:
            parent = parent[k]
        if kind == "delete":
            del parent[where[-1]]
        else:
            parent[where[-1]] = data.draw(json_values)
        path.write_text(json.dumps(record))
    else:
        raw = path.read_bytes()
        i = data.draw(st.integers(0, len(raw) - 1))
        path.write_bytes(raw[:i] if kind == "truncate" else
                         raw[:i] + bytes([raw[i] ^ data.draw(st.integers(1, 255))]) + raw[i + 1:])
    with contextlib.suppress(ckpt.CheckpointError):
        _try_everything(path)


@SETTINGS
@given(data=st.data())
def test_random_damage_to_the_weights_raises_checkpoint_error_only(saved, tmp_path, no_unpickling, data):
    path = _copy(saved, tmp_path)
    record = json.loads(path.read_text())
    wpath = tmp_path / record["weights"]
    raw = bytearray(wpath.read_bytes())
    header = int.from_bytes(raw[:8], "little") + 8
    kind = data.draw(st.sampled_from(["flip", "truncate", "append", "flip header"]))
    if kind == "truncate":
        raw = raw[:data.draw(st.integers(0, len(raw) - 1))]
    elif kind == "append":
        raw += data.draw(st.binary(min_size=1, max_size=64))
    else:
        i = data.draw(st.integers(0, header - 1) if kind == "flip header" else st.integers(0, len(raw) - 1))
        raw[i] ^= data.draw(st.integers(1, 255))
    wpath.write_bytes(bytes(raw))
    if data.draw(st.booleans()):  # the damage reaches the safetensors parser, past the hash check
        record["weights_sha256"] = ckpt._file_sha256(wpath)
        path.write_text(json.dumps(record))
    with contextlib.suppress(ckpt.CheckpointError):
        _try_everything(path)


def test_a_pickle_in_place_of_the_weights_is_never_unpickled(saved, tmp_path, no_unpickling):
    path = _copy(saved, tmp_path)
    record = json.loads(path.read_text())
    wpath = tmp_path / record["weights"]
    wpath.write_bytes(pickle.dumps({"w": [1.0, 2.0]}))
    record["weights_sha256"] = ckpt._file_sha256(wpath)
    path.write_text(json.dumps(record))
    with pytest.raises(ckpt.CheckpointError, match="not a readable safetensors file"):
        load_model(path)


def test_rng_text_round_trips_and_garbage_is_a_value_error():
    state = torch.Generator().manual_seed(5).get_state()
    assert torch.equal(ckpt.decode_rng(ckpt.encode_rng(state)), state)
    for garbage in ("", "@@@", base64.b64encode(b"x").decode()[:-1]):
        with pytest.raises(ValueError):  # noqa: PT011 (binascii.Error and ours: both ValueError)
            ckpt.decode_rng(garbage)
