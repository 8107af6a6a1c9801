"""``python -m transformer_lab train | sample | bench`` (chapter 8): a tiny run end to end, resume, and the
clear errors for bad text files and bad checkpoints."""

import json

import pytest

from transformer_lab import cli
from transformer_lab.data import shakespeare

TINY = ["--n-layer", "1", "--n-head", "2", "--d-model", "16", "--block-size", "16", "--batch-size", "4",
        "--max-iters", "12", "--warmup", "2", "--eval-interval", "6", "--eval-iters", "2", "--quiet",
        "--no-compile", "--threads", "1"]


@pytest.fixture
def text_file(tmp_path):
    path = tmp_path / "plays.txt"
    path.write_text(shakespeare()[:30_000], encoding="utf-8")
    return path


def test_train_sample_and_resume(tmp_path, text_file, capsys):
    out = tmp_path / "run.json"
    assert cli.main(["train", "--text", str(text_file), "--out", str(out), *TINY]) == 0
    record = json.loads(out.read_text())
    assert record["step"] == 12 and record["corpus_name"] == "plays.txt" and record["val_loss_full"] < 4.2
    assert cli.main(["train", "--text", str(text_file), "--out", str(out), *TINY]) == 2
    assert "exists; pass --resume" in capsys.readouterr().err
    assert cli.main(["train", "--text", str(text_file), "--out", str(out), "--resume", *TINY]) == 0
    assert "resuming" in capsys.readouterr().out
    assert cli.main(["sample", "--checkpoint", str(out), "--tokens", "20", "--prompt", "ROMEO:"]) == 0
    assert capsys.readouterr().out.startswith("ROMEO:")


def test_train_errors_for_bad_text_files(tmp_path, capsys):
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "short.txt").write_text("Alas, poor Yorick!")
    (tmp_path / "binary.bin").write_bytes(bytes(range(256)) * 10)
    for name, words in (("empty.txt", "is empty"), ("short.txt", "too short"), ("binary.bin", "binary"),
                        ("missing.txt", "no such file")):
        assert cli.main(["train", "--text", str(tmp_path / name), "--out", str(tmp_path / "x.json"), *TINY]) == 2
        assert words in capsys.readouterr().err


def test_sample_errors(tmp_path, capsys):
    assert cli.main(["sample", "--checkpoint", str(tmp_path / "none.json")]) == 2
    assert "no checkpoint at" in capsys.readouterr().err
    (tmp_path / "foreign.json").write_text('{"state_dict": "model.pt"}')
    assert cli.main(["sample", "--checkpoint", str(tmp_path / "foreign.json")]) == 2
    assert "not a transformer_lab checkpoint" in capsys.readouterr().err


def test_check_subcommand_is_unchanged():
    args = cli.build_parser().parse_args(["check", "8", "answers.py"])
    assert args.func is cli._check and args.chapter == 8


def test_every_listed_benchmark_is_a_script():
    """``bench`` runs the scripts in benchmarks/ by name: each name it offers must exist there."""
    from conftest import ROOT

    from transformer_lab.cli import BENCHMARKS

    assert {p.stem for p in (ROOT / "benchmarks").glob("*.py")} - {"common"} == set(BENCHMARKS)


def test_sample_streams_each_character_as_it_is_drawn(capsys, monkeypatch):
    """The text is printed while it is generated (a long sample is not silent until the end), and it is the text
    generate returns for the same seed."""
    import torch

    from transformer_lab.gpt import GPT

    model, tok, _ = cli.load_model()
    expected = tok.decode(model.generate(tok.encode("ROMEO:").view(1, -1), 30, temperature=0.8,
                                         generator=torch.Generator().manual_seed(5))[0])
    seen = []
    real = GPT.generate

    def spy(self, *args, on_token=None, **kwargs):
        def watch(token):
            seen.append(capsys.readouterr().out)  # what was on the screen before this token was drawn
            on_token(token)
        return real(self, *args, on_token=watch, **kwargs)

    monkeypatch.setattr(GPT, "generate", spy)
    assert cli.main(["sample", "--tokens", "30", "--prompt", "ROMEO:", "--seed", "5"]) == 0
    assert len(seen) == 30 and seen[0] == "ROMEO:" and all(len(s) == 1 for s in seen[1:])
    assert "".join(seen) + capsys.readouterr().out == expected + "\n"
