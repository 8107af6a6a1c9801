"""The grader's handling of its inputs (issue 28, item 5): each test is one fault an adversarial tester found, with
the submission that showed it written inline. The grader reads a submission as editors save it, keeps one row per
file, refuses a bad --csv before grading, names its own limits as its own, bounds the time a slow crashing
submission costs, decodes replies within limits of size and work, cannot have its report forged, and judges the
one-hot exercise by the gradient autograd computes rather than by the names of its nodes."""

import csv
import io
import os
import textwrap
import time

import pytest
import sympy
import torch
from test_grading import NAMES, RIGHT

from transformer_lab import _wire, cli, grading
from transformer_lab.exercises import CheckResult

UNSAFE = not grading.sandbox_available()  # without bwrap, these run the child unsandboxed (the grader's own checks)
needs_sandbox = pytest.mark.skipif(UNSAFE, reason="bwrap (bubblewrap) is not installed")


def _grade(path, **limits) -> dict[str, CheckResult]:
    return {r.name: r for r in grading.grade(1, path, unsafe=UNSAFE, **limits)}


def _with(name: str, body: str, params: str = "*args, **kwargs") -> str:
    """The honest answers with ``name`` replaced by a function whose body is ``body``."""
    return RIGHT + f"\n\ndef {name}({params}):\n" + textwrap.indent(textwrap.dedent(body), "    ")


def _fake_grading(monkeypatch) -> list:
    """``grading.grade`` replaced by one that records its calls and passes everything."""
    calls = []
    monkeypatch.setattr(grading, "grade", lambda *a, **k: calls.append(a) or [CheckResult(n, True, "") for n in NAMES])
    return calls


# 1 ------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("encoding", "newline"), [("utf-8-sig", "\r\n"), ("utf-16", "\r\n"), ("utf-8", "\r")])
def test_a_py_saved_with_a_bom_or_crlf_grades_as_written(tmp_path, encoding, newline):
    """Notepad's UTF-8 with a BOM and CRLF, its "Unicode" (UTF-16 with a BOM), and old Mac CR line endings."""
    path = tmp_path / "alice.py"
    path.write_bytes(RIGHT.replace("\n", newline).encode(encoding))
    cells = grading.submission_cells(path)
    assert cells == [RIGHT], "the text read differs from the text written (a BOM or a line ending left in)"
    failed = {n: r.message for n, r in _grade(path).items() if not r.passed}
    assert not failed, f"a correct answer saved as {encoding} with {newline!r} lost points: {failed}"


# 2 ------------------------------------------------------------------------------------------------------------
def test_two_files_of_one_name_are_two_students(tmp_path, monkeypatch):
    """alice.py and alice.md are two rows each, never one student; a name that would still collide (alice.md.py
    against alice.md) gets its own name too."""
    folder = tmp_path / "submissions"
    folder.mkdir()
    for name in ("alice.py", "alice.md.py", "bob.py"):
        (folder / name).write_text(RIGHT)
    (folder / "alice.md").write_text("```{code-cell} ipython3\n" + RIGHT + "```\n")
    _fake_grading(monkeypatch)
    rows = grading.grade_folder(1, folder, tmp_path / "g.csv")
    students = [r["student"] for r in rows]
    assert len(set(students)) == 4, f"expected 4 students (one per file), got {sorted(set(students))}"
    assert all(students.count(s) == len(NAMES) for s in students), "a student has another's rows"
    assert {"alice.py", "alice.md", "bob"} <= set(students)
    assert [line.endswith(f"{len(NAMES)} of {len(NAMES)} pass") for line in grading.summary(rows).splitlines()] == \
        [True] * 4


# 3 ------------------------------------------------------------------------------------------------------------
def test_a_bad_csv_is_refused_before_grading_and_leaves_no_temp_file(tmp_path, monkeypatch, capsys):
    folder = tmp_path / "submissions"
    folder.mkdir()
    (folder / "alice.py").write_text(RIGHT)
    (tmp_path / "adir").mkdir()
    os.mkfifo(tmp_path / "pipe")
    calls = _fake_grading(monkeypatch)
    bad = [tmp_path / "adir", tmp_path / "missing" / "g.csv", tmp_path / "pipe"]
    for csv_path in bad:
        with pytest.raises(ValueError, match=r"--csv: cannot write .* nothing was graded"):
            grading.grade_folder(1, folder, csv_path)
        assert cli.main(["check", "1", str(folder), "--csv", str(csv_path)]) == 2
        assert "nothing was graded" in capsys.readouterr().err
    assert not calls, f"graded {len(calls)} submission(s) before refusing the --csv"
    # a failure while writing (a full disk, say) leaves neither the CSV nor a temporary file
    monkeypatch.setattr(csv.DictWriter, "writerows", lambda self, rows: (_ for _ in ()).throw(OSError(28, "full")))
    with pytest.raises(OSError, match="full"):
        grading.grade_folder(1, folder, tmp_path / "g.csv")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adir", "pipe", "submissions"], "a stray file was left"


# 4 ------------------------------------------------------------------------------------------------------------
def test_too_small_a_memory_limit_is_the_graders_not_the_submissions(tmp_path, capsys):
    """300 MB cannot hold the grader's own process (Python and torch): it says so with the number, and grades
    nothing, instead of a ✗ that says the submission ran out of memory or crashed."""
    path = tmp_path / "alice.py"
    path.write_text(RIGHT)
    with pytest.raises(grading.GraderLimit, match=r"--memory-mb 300 is too small for the grader itself") as info:
        grading.grade(1, path, memory_mb=300, unsafe=UNSAFE)
    assert "give at least" in str(info.value) and "submission ran out" not in str(info.value)
    args = ["check", "1", str(path), "--memory-mb", "300"] + (["--unsafe"] if UNSAFE else [])
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert "too small for the grader itself" in err and "300" in err, err


# 5 ------------------------------------------------------------------------------------------------------------
def test_a_slow_loading_submission_that_crashes_costs_a_bounded_time(tmp_path):
    """Loading takes 4 s and every call ends the process: with --timeout 0.5 the reloads get 6 × 0.5 = 3 s in all,
    so it is loaded once (not 7 times, 28 s), the first exercise says why it failed and the rest why they were not
    graded."""
    path = tmp_path / "slow.py"
    crash = "\n".join(f"def {n}(*args):\n    os._exit(1)\n" for n in NAMES)
    path.write_text(f"import os\nimport time\ntime.sleep(4)\n\n{crash}")
    start = time.monotonic()
    results = _grade(path, timeout=0.5)
    elapsed = time.monotonic() - start
    assert elapsed < 15, f"grading took {elapsed:.0f} s: the slow submission was loaded again for every exercise"
    assert not any(r.passed for r in results.values())
    assert "ended (exit code 1)" in results[NAMES[0]].message
    for name in NAMES[1:]:
        assert "was not loaded again" in results[name].message and "3.0 s left" in results[name].message, (
            name, results[name].message)


def test_a_fast_submission_that_crashes_is_still_restarted_for_each_exercise(tmp_path):
    """The bound does not cost a quick submission its other exercises: one crash, the rest graded."""
    path = tmp_path / "crash.py"
    path.write_text(_with("attention", "import os\nos._exit(1)"))
    results = _grade(path, timeout=5.0)
    assert not results["attention"].passed
    assert all(results[n].passed for n in NAMES if n != "attention"), [r.message for r in results.values()]


# 6 ------------------------------------------------------------------------------------------------------------
RAW = """
import io, os, struct, sys, time, zipfile
import torch
buf = io.BytesIO()
torch.save(("ok", VALUE), buf)
data = buf.getvalue()
if COMPRESS:  # the same archive, its entries deflated
    src, out = zipfile.ZipFile(buf), io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for info in src.infolist():
            z.writestr(info.filename, src.read(info.filename))
    data = out.getvalue()
os.write(int(sys.argv[2]), struct.pack("<Q", len(data)) + data)  # the grader's pipe, as the reply
time.sleep(30)
"""


def _raw(value: str, compress: bool = False) -> str:
    """A function body that writes ``("ok", value)`` to the grader's pipe itself, past the child's encoding."""
    return "x = [0.0]\nfor _ in range(40):\n    x = [x, x]\n" + RAW.replace("VALUE", value).replace(
        "COMPRESS", str(compress))


REPLIES = {  # what attention returns -> a fragment of its ✗
    "power": ("import sympy\nreturn sympy.Pow(3, 10**9, evaluate=False)", "power with exponent 1000000000"),
    "factorial": ("import sympy\nreturn sympy.factorial(10**9, evaluate=False)", "factorial to the integer"),
    "compressed": (_raw('"x" * 2**26', compress=True), "a compressed message"),  # 64 MB in 64 KB
    "shared": (_raw("x"), "more than 1,000,000 values"),  # 2**40 leaves in 40 lists, each one twice
    "expanded": (_raw('("\\x00tl:tensor", torch.zeros(1).expand(10**6, 10**6), False)'), "not dense, contiguous"),
}


@pytest.mark.parametrize("reply", list(REPLIES))
def test_a_reply_over_the_decoding_limits_fails_its_exercise(tmp_path, reply):
    body, words = REPLIES[reply]
    path = tmp_path / f"{reply}.py"
    path.write_text(_with("attention", body))
    start = time.monotonic()
    results = _grade(path, timeout=5.0)
    elapsed = time.monotonic() - start
    assert elapsed < 30, f"decoding the {reply} reply took {elapsed:.0f} s, past any time limit"
    assert not results["attention"].passed and words in results["attention"].message, results["attention"].message
    assert all(results[n].passed for n in NAMES if n != "attention"), "a refused reply cost other exercises"


def test_decoding_limits_let_ordinary_replies_through():
    x = sympy.Symbol("x", positive=True)
    for value in [sympy.exp(-x**2 / 2) / sympy.sqrt(2 * sympy.pi), sympy.Piecewise((x, x > 2000), (0, True)),
                  sympy.ImmutableMatrix([[1, x], [3, 4]]), sympy.Sum(x**2, (x, 1, 10)), sympy.factorial(20),
                  sympy.Integer(3)**100, sympy.Rational(3, 7) * x**3]:
        assert _wire.decode(_wire.encode(value)) == value, value
    message = _wire.encode(("ok", [torch.arange(6.0).reshape(2, 3), {"k": (1, "s", None)}]))
    buf = io.BytesIO()
    torch.save(message, buf)
    assert _wire.decode(torch.load(io.BytesIO(buf.getvalue()), weights_only=True))[1][1] == {"k": (1, "s", None)}


def test_a_generator_travels_as_its_state_and_the_senders_does_not_advance():
    sent = torch.Generator().manual_seed(7)
    buf = io.BytesIO()
    torch.save(_wire.encode(("call", sent)), buf)
    got = _wire.decode(torch.load(io.BytesIO(buf.getvalue()), weights_only=True))[1]
    assert isinstance(got, torch.Generator) and got is not sent
    assert torch.equal(torch.rand(5, generator=got), torch.rand(5, generator=torch.Generator().manual_seed(7)))
    assert torch.equal(torch.rand(5, generator=sent), torch.rand(5, generator=torch.Generator().manual_seed(7)))
    with pytest.raises(ValueError, match="generator state"):
        _wire.decode((_wire._TAG + "generator", torch.zeros(3)))


# 7 ------------------------------------------------------------------------------------------------------------
FORGE = """
import glob, os
LINES = b"alice: 6 of 6 pass\\nmallory: 6 of 6 pass\\nFORGED\\n"
for path in [f"/proc/{os.getppid()}/fd/1", f"/proc/{os.getppid()}/fd/2", "/proc/1/fd/1", "/proc/1/fd/2",
             *glob.glob("/proc/[0-9]*/fd/[12]"), "/dev/tty"]:
    try:
        with open(path, "wb") as f:
            f.write(LINES)
    except OSError:
        pass
os.write(1, LINES)
os.write(2, LINES)
"""


@needs_sandbox
def test_a_submission_cannot_forge_the_report(tmp_path, capfd):
    """Writing to /proc/<ppid>/fd/1 (and every other /proc/N/fd/1 it can see) reaches the child's own log, not the
    grader's report; nor can a file name add a line to it."""
    folder = tmp_path / "submissions"
    folder.mkdir()
    (folder / "mallory.py").write_text(FORGE + "\n\ndef attention(*args):\n" + textwrap.indent(FORGE, "    "))
    (folder / "eve\nalice: 6 of 6 pass.py").write_text("")
    code = cli.main(["check", "1", str(folder), "--csv", str(tmp_path / "g.csv"), "--timeout", "5"])
    out, err = capfd.readouterr()
    assert code == 0, out + err
    lines = (out + err).splitlines()
    assert not any(line.startswith(("alice:", "mallory: 6", "FORGED")) for line in lines), f"forged:\n{out}{err}"
    assert "mallory: 0 of 6 pass" in out
    assert "eve\\nalice: 6 of 6 pass: 0 of 6 pass" in out, out  # the file name's newline shown, not obeyed


# 8 ------------------------------------------------------------------------------------------------------------
FORGED_NAME = """
import torch


class Mm(torch.autograd.Function):  # autograd calls its node MmBackward: a product, by name
    @staticmethod
    def forward(ctx, idx, weight):
        ctx.shape = weight.shape
        return torch.nn.functional.one_hot(idx, len(weight)).to(weight.dtype) @ weight

    @staticmethod
    def backward(ctx, grad):
        return None, grad.new_zeros(ctx.shape)


def one_hot_embed(idx, weight):
    return Mm.apply(idx, weight)
"""


def test_forged_autograd_node_names_do_not_pass_the_one_hot_exercise(tmp_path):
    """The checker asks autograd, in the student's process, for the gradient with respect to weight and compares
    it with one_hot(idx)ᵀ g: a node named like a product with a wrong backward fails; a lookup, which computes the
    same values and gradient, fails as the exercise forbids it (a lookup of a weight that requires a gradient
    raises there), whatever its node is called."""
    (tmp_path / "forged.py").write_text(RIGHT + FORGED_NAME)
    (tmp_path / "lookup.py").write_text(RIGHT + "\n\ndef one_hot_embed(idx, weight):\n    return weight[idx]\n")
    (tmp_path / "detached.py").write_text(RIGHT + "\n\ndef one_hot_embed(idx, weight):\n    return "
                                          "F.one_hot(idx, len(weight)).to(weight.dtype) @ weight.detach()\n")
    forged = _grade(tmp_path / "forged.py")["one_hot_embed"]
    assert not forged.passed and "gradient autograd gives weight" in forged.message, forged.message
    lookup = _grade(tmp_path / "lookup.py")["one_hot_embed"]
    assert not lookup.passed and "looked up, not computed as a matrix product" in lookup.message, lookup.message
    detached = _grade(tmp_path / "detached.py")["one_hot_embed"]
    assert not detached.passed and "carries no gradient" in detached.message, detached.message
