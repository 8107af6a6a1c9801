"""Every command fails cleanly (chapter 8, issue 12): ``train``, ``sample``, ``check`` and ``bench`` driven with a
catalogue of bad inputs each exit with status 2 and one line ``error: ...`` saying what was expected, with no
traceback and no file left behind or changed. Run in-process through ``cli.main``."""

import errno
import json
import os
from pathlib import Path

import pytest
import torch

from transformer_lab import checkpoint as ckpt
from transformer_lab import cli
from transformer_lab.data import shakespeare
from transformer_lab.sampling import filter_logits, sample

TINY = ["--n-layer", "1", "--n-head", "2", "--d-model", "16", "--block-size", "16", "--batch-size", "4",
        "--max-iters", "4", "--warmup", "1", "--eval-interval", "2", "--eval-iters", "1", "--quiet",
        "--no-compile", "--threads", "1"]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A folder with a text, a binary, a non-UTF-8 file, a huge (sparse) file, a plain file, and a good
    resumable checkpoint ``good.json`` trained from the text."""
    d = tmp_path_factory.mktemp("world")
    (d / "text.txt").write_text(shakespeare()[:12_000], encoding="utf-8")
    (d / "short.txt").write_text(shakespeare()[:1_200], encoding="utf-8")  # long enough to read, too short to train
    (d / "empty.txt").write_bytes(b"")
    (d / "binary.bin").write_bytes(bytes(range(256)) * 8)
    (d / "latin1.txt").write_bytes("Sc\u00e8ne premi\u00e8re. ".encode("latin-1") * 100)
    with open(d / "huge.txt", "wb") as f:  # sparse: 200 MiB on paper, nothing on disk
        f.truncate(200 * 2**20)
    (d / "plain").write_text("a plain file, not a folder")
    (d / "adir").mkdir()
    assert cli.main(["train", "--text", str(d / "text.txt"), "--out", str(d / "good.json"), *TINY]) == 0
    return d


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): (b"<dir>" if p.is_dir() else p.read_bytes())
            for p in sorted(folder.rglob("*")) if p.name != "huge.txt"}


def _fails_cleanly(argv, folder, capsys, *fragments):
    capsys.readouterr()
    before = _files(folder)
    code = cli.main(argv)
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, (argv, code, out, err)
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in out + err
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    assert _files(folder) == before, "a file was left behind or changed"
    return lines[0]


# ------------------------------------------------------------------ bug 4: a text too short for --block-size
def test_a_text_too_short_for_the_block_size_is_one_error_line(world, capsys):
    _fails_cleanly(["train", "--text", str(world / "short.txt"), "--out", str(world / "new.json"),
                    *TINY, "--block-size", "200"], world, capsys, "too few for block_size 200")


# ------------------------------------------------------------------ train: the catalogue
def _train(world, *extra, text="text.txt", out="new.json"):
    return ["train", "--text", str(world / text), "--out", str(world / out), *TINY, *extra]


TRAIN_BAD = {
    # files
    "missing text": (dict(text="nothing.txt"), (), "no such file"),
    "empty text": (dict(text="empty.txt"), (), "is empty"),
    "binary text": (dict(text="binary.bin"), (), "binary"),
    "non-UTF-8 text": (dict(text="latin1.txt"), (), "not UTF-8"),
    "huge text": (dict(text="huge.txt"), (), "bytes; give a UTF-8 text file of at most"),
    "text is a folder": (dict(text="adir"), (), "is a directory"),
    # numbers
    "NaN lr": ({}, ("--lr", "nan"), "min_lr <= lr"),
    "negative lr": ({}, ("--lr", "-1"), "min_lr <= lr"),
    "zero lr": ({}, ("--lr", "0"), "min_lr <= lr"),
    "absurd lr": ({}, ("--lr", "1e39"), "too large"),
    "infinite lr": ({}, ("--lr", "inf"), "min_lr <= lr"),
    "zero max-iters": ({}, ("--max-iters", "0"), "max_iters must be a positive int"),
    "negative batch": ({}, ("--batch-size", "-3"), "batch_size must be a positive int"),
    "zero block": ({}, ("--block-size", "0"), "block_size must be a positive int"),
    "absurd block": ({}, ("--block-size", "1000000000"), "too few for block_size"),
    "absurd width": ({}, ("--d-model", "10000000", "--n-head", "1"), "GiB of memory"),
    "absurd depth": ({}, ("--n-layer", "100000000"), "GiB of memory"),
    "absurd eval-iters": ({}, ("--eval-iters", "1000000000000"), "GiB of memory"),
    "zero heads": ({}, ("--n-head", "0"), "n_head must be a positive int"),
    "heads do not divide": ({}, ("--n-head", "3"), "divisible"),
    "NaN dropout": ({}, ("--dropout", "nan"), "dropout must lie in"),
    "dropout one": ({}, ("--dropout", "1"), "dropout must lie in"),
    "warmup too long": ({}, ("--warmup", "4"), "warmup must lie in"),
    "negative warmup": ({}, ("--warmup", "-1"), "warmup must lie in"),
    "NaN weight decay": ({}, ("--weight-decay", "nan"), "finite"),
    "absurd weight decay": ({}, ("--weight-decay", "1e300"), "lr * weight_decay < 1"),
    "zero eval-interval": ({}, ("--eval-interval", "0"), "eval_interval must be"),
    "negative seed": ({}, ("--seed", "-1"), "seed must be an int"),
    "huge seed": ({}, ("--seed", str(2**64)), "seed must be an int"),
    "zero threads": ({}, ("--threads", "0"), "--threads must be a positive integer"),
    "absurd threads": ({}, ("--threads", "100000"), "--threads must be at most"),
    "not a number": ({}, ("--lr", "fast"), "invalid float value"),
    "unknown option": ({}, ("--speed", "9"), "unrecognized arguments"),
    "unknown positions": ({}, ("--positions", "alibi"), "invalid choice"),
    # --out
    "out is a folder": (dict(out="adir"), (), "is a directory"),
    "out under a file": (dict(out="plain/x.json"), (), "is a file, not a directory"),
    "out exists": (dict(out="good.json"), (), "exists; pass --resume"),
    "resume of nothing": (dict(out="nothing.json"), ("--resume",), "cannot resume: no checkpoint at"),
}


@pytest.mark.parametrize("out", ["", ".", "/", "adir/.."])
@pytest.mark.parametrize("command", ["train", "ladder"])
def test_an_out_that_names_no_file_is_one_error_line(world, capsys, monkeypatch, command, out):
    monkeypatch.chdir(world)
    argv = _train(world)[:3] + TINY if command == "train" else ["ladder", "--max-iters", "1", "--quiet"]
    _fails_cleanly([*argv, "--out", out], world, capsys, "names a folder, not a file")


@pytest.mark.parametrize("case", list(TRAIN_BAD))
def test_train_bad_input(world, capsys, case):
    kw, extra, words = TRAIN_BAD[case]
    _fails_cleanly(_train(world, *extra, **kw), world, capsys, words)


def _damaged(world, tmp_path, change) -> Path:
    """A copy of the good checkpoint in ``tmp_path`` with its record changed by ``change``."""
    record = json.loads((world / "good.json").read_text())
    (tmp_path / record["weights"]).write_bytes((world / record["weights"]).read_bytes())
    change(record)
    path = tmp_path / "good.json"
    path.write_text(json.dumps(record))
    return path


def _truncate_weights(world, tmp_path):
    def change(record):
        w = tmp_path / record["weights"]
        w.write_bytes(w.read_bytes()[:500])
    return change


DAMAGED = {
    "no rng": (lambda r: r.pop("rng"), "'rng' must be"),
    "truncated rng": (lambda r: r["rng"].update(batches=r["rng"]["batches"][:64]), "'rng.batches'"),
    "no optimizer scalars": (lambda r: r["optimizer"].update(scalars={}), "AdamW needs"),
    "negative step": (lambda r: r.update(step=-2), "'step' must be"),
    "no vocab": (lambda r: r.pop("vocab"), "'vocab' must be"),
    "weights not a string": (lambda r: r.update(weights=7), "'weights' must be"),
    "weights elsewhere": (lambda r: r.update(weights="../../etc/passwd.safetensors"), "'weights' must be"),
    "huge vocab": (lambda r: r["config"].update(vocab_size=2**40), "vocab"),
    "bad config": (lambda r: r["config"].update(n_head="two"), "config"),
    "foreign format": (lambda r: r.update(format="pytorch"), "not a transformer_lab checkpoint"),
    "other version": (lambda r: r.update(version=99), "checkpoint version 99"),
    "weights swapped": (lambda r: r.update(weights_sha256="0" * 64), "truncated or corrupt"),
    "weights missing": (lambda r: r.update(weights="good.0123456789abcdef.safetensors"), "which is missing"),
    "weights-only": (lambda r: r.update(optimizer=None), "no optimizer state"),
}
RESUME_ONLY = {"no rng", "truncated rng", "no optimizer scalars", "negative step", "weights-only"}


@pytest.mark.parametrize("case", list(DAMAGED))
def test_resume_and_sample_refuse_every_damaged_checkpoint(world, tmp_path, capsys, case):
    change, words = DAMAGED[case]
    path = _damaged(world, tmp_path, change)
    resume = ["train", "--text", str(world / "text.txt"), "--out", str(path), *TINY, "--resume"]
    if case != "no vocab":  # train does not read 'vocab'; sample does
        _fails_cleanly(resume, tmp_path, capsys, "cannot resume", words)
    if case not in RESUME_ONLY:
        _fails_cleanly(["sample", "--checkpoint", str(path), "--tokens", "5"], tmp_path, capsys, words)


def test_damaged_json_text_is_refused_by_both(world, tmp_path, capsys):
    for name, raw, words in (("empty.json", b"", "not valid JSON"), ("bin.json", bytes(range(256)), "not valid JSON"),
                             ("nan.json", b'{"format": NaN}', "not valid JSON"),
                             ("deep.json", b"[" * 100_000 + b"]" * 100_000, "not valid JSON"),
                             ("list.json", b"[1, 2]", "its 'format' is not")):
        (tmp_path / name).write_bytes(raw)
        _fails_cleanly(["sample", "--checkpoint", str(tmp_path / name)], tmp_path, capsys, words)
        _fails_cleanly(["train", "--text", str(world / "text.txt"), "--out", str(tmp_path / name), *TINY,
                        "--resume"], tmp_path, capsys, words)
    with open(tmp_path / "huge.json", "wb") as f:
        f.truncate(ckpt.MAX_JSON_BYTES + 1)
    _fails_cleanly(["sample", "--checkpoint", str(tmp_path / "huge.json")], tmp_path, capsys, "more than the")


# ------------------------------------------------------------------ --out on a full disk
def test_a_full_disk_leaves_no_file_and_keeps_a_good_checkpoint(world, tmp_path, capsys, monkeypatch):
    def full(path, write):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ckpt, "_atomic_write", full)
    _fails_cleanly(_train(world, out="sub/dir/new.json"), world, capsys, "No space left on device")
    assert not (world / "sub").exists()  # the folders made for --out are gone again
    path = _damaged(world, tmp_path, lambda r: None)
    before = _files(tmp_path)
    capsys.readouterr()
    code = cli.main(["train", "--text", str(world / "text.txt"), "--out", str(path), *TINY, "--resume",
                     "--max-iters", "4"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("error:") == 1 and "Traceback" not in err
    assert _files(tmp_path) == before  # resumed at step 4 of 4: the final save failed, the checkpoint is intact


# ------------------------------------------------------------------ sample: the catalogue
SAMPLE_BAD = {
    "missing checkpoint": (("--checkpoint", "nothing.json"), "no checkpoint at"),
    "checkpoint is a folder": (("--checkpoint", "adir"), "is a directory"),
    "binary checkpoint": (("--checkpoint", "binary.bin"), "no checkpoint at"),
    "negative tokens": (("--tokens", "-1"), "--tokens must be"),
    "absurd tokens": (("--tokens", "1000000000000"), "--tokens must be"),
    "zero temperature": (("--temperature", "0"), "--temperature must be"),
    "NaN temperature": (("--temperature", "nan"), "--temperature must be"),
    "infinite temperature": (("--temperature", "inf"), "--temperature must be"),
    "negative temperature": (("--temperature", "-1"), "--temperature must be"),
    "zero top-k": (("--top-k", "0"), "--top-k must be"),
    "NaN top-p": (("--top-p", "nan"), "--top-p must be"),
    "top-p above one": (("--top-p", "1.5"), "--top-p must be"),
    "negative seed": (("--seed", "-4"), "--seed must be"),
    "huge seed": (("--seed", str(2**64)), "--seed must be"),
    "empty prompt": (("--prompt", ""), "--prompt must"),
    "unknown characters": (("--prompt", "\u00e9\u00e9"), "unknown character"),
    "not an int": (("--tokens", "many"), "invalid int value"),
}


@pytest.mark.parametrize("case", list(SAMPLE_BAD))
def test_sample_bad_input(world, capsys, case):
    extra, words = SAMPLE_BAD[case]
    flag, value = extra
    checkpoint = str(world / (value if flag == "--checkpoint" else "good.json"))
    argv = ["sample", "--tokens", "5", "--checkpoint", checkpoint] + ([] if flag == "--checkpoint" else [flag, value])
    _fails_cleanly(argv, world, capsys, words)


@pytest.mark.parametrize("checkpoint", ["", ".", "/"])
@pytest.mark.parametrize("command", ["sample", "inspect"])
def test_a_checkpoint_that_names_no_file_is_blamed_on_checkpoint(world, capsys, command, checkpoint):
    _fails_cleanly([command, "--checkpoint", checkpoint], world, capsys, "--checkpoint:", "names a folder")


def test_a_tiny_top_p_samples_the_top_token(world, capsys):
    assert cli.main(["sample", "--checkpoint", str(world / "good.json"), "--tokens", "3", "--top-p", "1e-300"]) == 0
    assert "Traceback" not in capsys.readouterr().err


def test_sample_at_a_tiny_temperature_is_argmax_in_float16(world, capsys):
    """Bug 8: float16 logits divided by T = 1e-4 used to overflow into an all -inf row."""
    logits = torch.tensor([[3.0, 7.5, 7.0, -2.0]], dtype=torch.float16)
    assert torch.isfinite(filter_logits(logits, temperature=1e-4)[0, 1])
    draws = sample(logits.expand(64, 4), temperature=1e-4, generator=torch.Generator().manual_seed(0))
    assert draws.tolist() == [1] * 64
    assert cli.main(["sample", "--checkpoint", str(world / "good.json"), "--tokens", "5", "--temperature",
                     "1e-4"]) == 0
    assert "Traceback" not in capsys.readouterr().err


# ------------------------------------------------------------------ check and bench
def test_check_bad_input(world, tmp_path, capsys):
    (tmp_path / "big.py").write_text("#" * (cli.MAX_ANSWERS_BYTES + 1))
    (tmp_path / "empty.py").write_text("")
    (tmp_path / "answers.txt").write_text("")
    (tmp_path / "nothing-here").mkdir()
    for argv, words in ((["check", "9", str(tmp_path / "empty.py")], "no chapter 9"),
                        (["check", "0", str(tmp_path / "empty.py")], "no chapter 0"),
                        (["check", "x", str(tmp_path / "empty.py")], "invalid int value"),
                        (["check", "1", str(tmp_path / "nothing.py")], "not found"),
                        (["check", "1", str(tmp_path / "nothing-here")], "holds no submissions"),
                        (["check", "1", str(tmp_path / "answers.txt")], "a .py file, a notebook (.ipynb)"),
                        (["check", "1", str(tmp_path / "big.py")], "at most"),
                        (["check", "1", str(tmp_path / "empty.py"), "--timeout", "0"], "a positive number"),
                        (["check", "1", str(tmp_path / "empty.py"), "--timeout", "nan"], "--timeout must be"),
                        (["check", "1", str(tmp_path / "empty.py"), "--memory-mb", "0"], "--memory-mb must be"),
                        (["check", "1", str(tmp_path / "empty.py"), "--hidden", ""], "--hidden needs"),
                        (["check"], "required")):
        _fails_cleanly(argv, tmp_path, capsys, words)


@pytest.mark.parametrize(("source", "words"), [
    ("def f(:\n", "SyntaxError"),
    ("import sys\nsys.exit(3)\n", "called sys.exit(3)"),
    ("x = 1\x00\n", "null bytes"),
    ("import transformer_lab.exercises\n", "cannot be imported by a graded submission"),
])
def test_a_submission_that_does_not_load_is_graded_with_the_reason(tmp_path, capsys, source, words):
    (tmp_path / "answers.py").write_text(source)
    assert cli.main(["check", "8", str(tmp_path / "answers.py")]) == 1  # graded: every exercise ✗, with why
    out = capsys.readouterr().out
    assert "0 of" in out and words in out and "Traceback" not in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["answers.py"]


def test_bench_bad_input(tmp_path, capsys):
    _fails_cleanly(["bench", "nosuch"], tmp_path, capsys, "invalid choice")
    _fails_cleanly(["bench", "kernels", "--threads", "many"], tmp_path, capsys, "bench kernels:",
                   "expected a positive integer, got 'many'")
    _fails_cleanly(["bench", "kernels", "--bogus"], tmp_path, capsys, "unrecognized arguments")


@pytest.mark.parametrize("argv", [["swap", "--rounds", "-1"], ["swap", "--steps", "0"],
                                  ["train_speed", "--threads", "0"], ["components", "--number", "0"],
                                  ["recipe", "--block", "0"],
                                  ["recipe", "--max-iters", "0"], ["generate_speed", "--tokens", "-5"],
                                  ["generate_speed", "--repeat", "0"], ["profile_step", "--top", "0"],
                                  ["allreduce", "--rounds", "0"], ["compile_startup", "--steps", "0"]])
def test_bench_counts_below_one_are_refused_before_any_work(tmp_path, capsys, argv):
    _fails_cleanly(["bench", argv[0], "--", *argv[1:]], tmp_path, capsys, f"bench {argv[0]}:",
                   "expected a positive integer")


def test_no_command_and_unknown_command(tmp_path, capsys):
    _fails_cleanly([], tmp_path, capsys, "required")
    _fails_cleanly(["fly"], tmp_path, capsys, "invalid choice")


def test_the_catalogue_leaves_the_world_as_it_was(world):
    assert sorted(p.name for p in world.iterdir()) == sorted(
        ["text.txt", "short.txt", "empty.txt", "binary.bin", "latin1.txt", "huge.txt", "plain", "adir", "good.json",
         json.loads((world / "good.json").read_text())["weights"]])
    assert not any(name.endswith((".lock", ".tmp")) for name in os.listdir(world))
