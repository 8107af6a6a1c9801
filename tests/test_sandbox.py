"""The bubblewrap sandbox of grading for marks (issue 27): one folder run of made-up submissions, each an attack a
reviewer made on the unsandboxed grader, plus reading the instructor's files, a fork bomb, a socket, a memory hog and
too much output. Each attack gets a ✗ saying why, the honest students keep their 6 of 6, the CSV is written, the
key is in no message and no environment, and ``check`` exits 1 because some submissions could not be graded."""

import csv
import os
import textwrap
from pathlib import Path

import pytest
from test_grading import NAMES, RIGHT

from transformer_lab import cli, grading

pytestmark = pytest.mark.skipif(not grading.sandbox_available(), reason="bwrap (bubblewrap) is not installed")

KEY = "instructor-secret-7f3a"
ROOT = Path(__file__).resolve().parents[1]


def _attack(name: str, body: str) -> str:
    """The honest answers with ``name`` replaced by a function whose body is ``body``."""
    params = "f, x, y" if name == "superposition_gaps" else "*args, **kwargs"
    return RIGHT + f"\n\ndef {name}({params}):\n" + textwrap.indent(textwrap.dedent(body), "    ")


ATTACKS = {  # student -> (source, exercise, a fragment of its ✗)
    "cmdline": (_attack("attention", """
        import os
        raise ValueError(open(f"/proc/{os.getppid()}/cmdline").read() + str(os.listdir("/proc")))
        """), "attention", "raised ValueError"),
    "environ": (_attack("attention", """
        import os
        raise ValueError(repr(dict(os.environ)))
        """), "attention", None),
    "overwriter": (_attack("attention", """
        written = []
        for path in ["../author.py", "FOLDER/author.py"]:
            try:
                open(path, "w").write("raise SystemExit")
                written.append(path)
            except OSError as exc:
                written.append(type(exc).__name__)
        raise ValueError(str(written))
        """), "attention", "['OSError', 'FileNotFoundError']"),
    "killer": (_attack("attention", """
        import os, signal
        os.kill(os.getppid(), signal.SIGKILL)
        os.kill(1, signal.SIGKILL)
        """), "attention", None),
    "importer": (_attack("attention", """
        import sys
        sys.meta_path[:] = [h for h in sys.meta_path if type(h).__name__ != "_NoBookPackage"]
        from transformer_lab.attention import scaled_dot_product_attention
        return scaled_dot_product_attention(*args, **kwargs)
        """), "attention", "No module named 'transformer_lab'"),
    "reader": (_attack("attention", f"""
        paths = [{str(ROOT / "README.md")!r}, "/etc/passwd", {str(Path.home())!r}]
        for p in paths:
            try:
                open(p).read()
                raise ValueError("read " + p)
            except OSError:
                pass
        raise ValueError("nothing readable")
        """), "attention", "nothing readable"),
    "forker": (_attack("attention", """
        import os, time
        while True:
            if os.fork() == 0:
                time.sleep(30)
                os._exit(0)
        """), "attention", "process limit of"),
    "socket": (_attack("attention", """
        import socket
        socket.create_connection(("1.1.1.1", 80), timeout=2)
        """), "attention", "Network is unreachable"),
    "hog": (_attack("attention", """
        chunks = []
        while True:
            chunks.append(bytearray(2**26))
        """), "attention", "exceeded the memory limit of 2048 MB"),
    "talker": (_attack("attention", """
        while True:
            print("x" * 2**20)
        """), "attention", "exceeded the output limit of 16 MB"),
}


def test_a_folder_of_attacks_in_the_sandbox(tmp_path, capsys):
    folder = tmp_path / "submissions"
    folder.mkdir()
    (folder / "author.py").write_text(RIGHT)
    (folder / "=formula.py").write_text(RIGHT.replace("A, A @ V", "A, A @ V + 1"))
    for student, (source, _, _) in ATTACKS.items():
        (folder / f"{student}.py").write_text(source.replace("FOLDER", str(folder)))
    keyfile = tmp_path / "instructor" / "key.txt"
    keyfile.parent.mkdir()
    keyfile.write_text(KEY + "\n")
    (keyfile.parent / "answers.py").write_text("# the instructor's notes\n")
    os.environ["TL_HIDDEN_KEY"] = KEY  # an exported key does not reach a submission
    try:
        out = tmp_path / "grades.csv"
        code = cli.main(["check", "1", str(folder), "--csv", str(out), "--hidden-file", str(keyfile),
                         "--timeout", "5", "--memory-mb", "2048"])
    finally:
        del os.environ["TL_HIDDEN_KEY"]
    printed = capsys.readouterr().out
    assert code == 1 and "could not grade" in printed, printed  # the killer, the forker, the hog, the talker ...
    with open(out, newline="") as f:
        table = list(csv.DictReader(f))
    assert (folder / "author.py").read_text() == RIGHT
    passed = {s: sum(int(r["passed"]) for r in table if r["student"] == s) for s in {r["student"] for r in table}}
    msg = {(r["student"], r["exercise"]): r["message"] for r in table}
    assert passed.pop("author") == len(NAMES)
    assert passed.pop("'=formula") == len(NAMES) - 1  # the student's name quoted: no formula in a spreadsheet
    for student, (_, exercise, words) in ATTACKS.items():
        assert passed[student] == len(NAMES) - 1, (student, passed[student], msg[student, exercise])
        message = msg[student, exercise]
        assert not message.startswith(("=", "+", "-", "@")) and len(message) <= grading.MESSAGE_CHARS
        if words:
            assert words in message, (student, message)
    assert all(KEY not in r["message"] for r in table)
    assert "instructor" not in msg["cmdline", "attention"] and "check" not in msg["cmdline", "attention"]
    assert "TL_HIDDEN_KEY" not in msg["environ", "attention"]
    assert KEY not in printed
    print("\n".join(f"{s}: {msg[s, e]}" for s, (_, e, _) in ATTACKS.items()))


def test_a_forbidden_builtin_raises_in_the_sandbox_by_any_route(tmp_path):
    """An exercise's forbidden operator (chapter 7's torch.logsumexp) raises where the graded code runs, whatever
    route reaches it; the same answer written by hand passes."""
    routes = {"direct": "torch.logsumexp(x, dim=-1)", "alias": "getattr(torch.special, 'logsum' + 'exp')(x, -1)",
              "distribution": "x[..., 0] - torch.distributions.Categorical(logits=x).logits[..., 0]"}
    by_hand = ("m = x.amax(-1, keepdim=True).nan_to_num(neginf=0.0)\n"
               "    return (m + (x - m).exp().sum(-1, keepdim=True).log()).squeeze(-1)")
    for name, body in {**routes, "by_hand": by_hand}.items():
        body = body if name == "by_hand" else "return " + body
        (tmp_path / f"{name}.py").write_text(f"import torch\n\n\ndef stable_logsumexp(x):\n    {body}\n")
    for name in [*routes, "by_hand"]:
        verdict = next(r for r in grading.grade(7, tmp_path / f"{name}.py") if r.name == "stable_logsumexp")
        if name == "by_hand":
            assert verdict.passed, verdict.message
        else:
            assert not verdict.passed and "ForbiddenCall" in verdict.message and "torch.logsumexp" in verdict.message, (
                name, verdict.message)
