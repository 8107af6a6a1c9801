"""The command line's help answers (issue 14): plain text, every sample option with its default, what an answers
file holds and ``check N --template`` that writes a blank one, and a short ``train`` that runs on the default
warm-up."""

import re

import pytest

from transformer_lab import cli
from transformer_lab.data import shakespeare
from transformer_lab.exercises import CHAPTERS, check_file, registry

COMMANDS = ["", "check", "train", "sample", "bench"]


def _help(capsys, command: str) -> str:
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args([*command.split(), "--help"])
    return capsys.readouterr().out


@pytest.mark.parametrize("command", COMMANDS)
def test_help_is_plain_text(capsys, command):
    text = _help(capsys, command)
    assert "``" not in text and not re.search(r":(func|class|data):`", text), text


def test_check_help_says_what_an_answers_file_holds(capsys):
    text = " ".join(_help(capsys, "check").split())
    assert "defines one function per exercise" in text and "check N --template" in text


def test_sample_help_gives_every_default(capsys):
    text = _help(capsys, "sample")
    options = re.findall(r"^  (--[\w-]+)", text, re.M)
    assert set(options) >= {"--checkpoint", "--prompt", "--tokens", "--temperature", "--top-k", "--top-p",
                            "--greedy", "--seed"}
    blocks = re.split(r"^  (?=--)", text, flags=re.M)[1:]
    assert all("default" in b for b in blocks), [b for b in blocks if "default" not in b]


@pytest.mark.parametrize("chapter", sorted(CHAPTERS))
def test_template_holds_a_stub_per_exercise(tmp_path, capsys, chapter):
    path = tmp_path / "answers.py"
    assert cli.main(["check", str(chapter), str(path), "--template"]) == 0
    results = check_file(chapter, path)
    assert [r.name for r in results] == list(registry(chapter))
    assert all(not r.passed and "not written yet" in r.message for r in results), results
    before = path.read_bytes()
    assert cli.main(["check", str(chapter), str(path), "--template"]) == 2  # never overwrites
    assert path.read_bytes() == before
    assert "exists" in capsys.readouterr().err


def test_template_file_after_the_option(tmp_path):
    assert cli.main(["check", "2", "--template", str(tmp_path / "my2.py")]) == 0  # was "unrecognized arguments"
    assert "def " in (tmp_path / "my2.py").read_text()


def test_template_default_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["check", "3", "--template"]) == 0
    assert "def adam_step(" in (tmp_path / "answers-ch3.py").read_text()


def test_check_without_answers_says_how_to_get_a_template(capsys):
    assert cli.main(["check", "2"]) == 2
    assert "check 2 --template" in capsys.readouterr().err


def test_short_train_runs_on_the_default_warmup(tmp_path):
    """``--max-iters 10`` without ``--warmup``: the default warm-up (100) is scaled to a tenth of the run."""
    (tmp_path / "text.txt").write_text(shakespeare()[:12_000], encoding="utf-8")
    argv = ["train", "--text", str(tmp_path / "text.txt"), "--out", str(tmp_path / "m.json"), "--n-layer", "1",
            "--n-head", "2", "--d-model", "16", "--block-size", "16", "--batch-size", "4", "--max-iters", "10",
            "--eval-interval", "5", "--eval-iters", "1", "--quiet", "--no-compile", "--threads", "1"]
    assert cli.main(argv) == 0
    assert (tmp_path / "m.json").is_file()
