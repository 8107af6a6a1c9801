"""Grading for marks (issue 13): the student's code runs in its own process, and every attack on the grader ends in
a ✗ with a message, never a ✓ — a submission that hangs, exits, kills its process, crashes, exhausts memory,
prints, writes into the grader's pipe, patches a checker or imports a reference. Honest answers pass in each
format (.py, .ipynb, the chapter's .md), and a folder of submissions grades into one CSV."""

import csv
import importlib
import textwrap

import jupytext
import nbformat
import pytest

from transformer_lab import grading
from transformer_lab.exercises import CheckResult, hidden_cases, registry
from transformer_lab.grading import submission_cells

RIGHT = textwrap.dedent('''
    import math
    import torch
    import torch.nn.functional as F


    def attention_by_hand():
        Q = torch.tensor([[1.0, 0.0], [0.0, 2.0]], dtype=torch.float64)
        K = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], dtype=torch.float64)
        V = torch.tensor([[1.0, 0.0], [0.0, 1.0], [2.0, 2.0]], dtype=torch.float64)
        mask = torch.tensor([[True, True, True], [True, True, False]])
        A = torch.softmax((Q @ K.T / math.sqrt(2)).masked_fill(~mask, float("-inf")), dim=-1)
        return A, A @ V


    def attention(query, key, value, mask=None):
        s = query @ key.transpose(-2, -1) / math.sqrt(query.shape[-1])
        if mask is not None:
            s = s.masked_fill(~mask, float("-inf"))
        return torch.softmax(s, dim=-1) @ value


    def split_heads(x, n_head):
        B, T, C = x.shape
        return x.view(B, T, n_head, C // n_head).transpose(1, 2)


    def one_hot_embed(idx, weight):
        return F.one_hot(idx, weight.shape[0]).to(weight.dtype) @ weight


    def closest_scores(key, target):
        return key @ (torch.linalg.pinv(key) @ target)


    def superposition_gaps(f, x, y):
        return (f(x + y) - f(x) - f(y)).abs().max().item(), (f(2 * x) - 2 * f(x)).abs().max().item()
''')

NAMES = list(registry(1))

ATTACKS = {  # exercise -> (the body of a function that attacks, a fragment of the ✗ it must get)
    "attention_by_hand": ("while True:\n    pass", "took longer than its time limit"),
    "attention": ("import sys\nsys.exit(0)", "called sys.exit(0)"),
    "split_heads": ("import os\nos._exit(0)", "process ended (exit code 0)"),
    "one_hot_embed": ("import ctypes\nctypes.string_at(0)", "killed by signal SIGSEGV"),
    "closest_scores": ("import os\nfor fd in range(3, 64):\n    try:\n        os.write(fd, b'\\xff' * 8)\n"
                       "    except OSError:\n        pass\nimport time\ntime.sleep(5)", "unreadable message"),
    "superposition_gaps": ("return bytearray(2**40)", "MemoryError"),
}


def _attack_source() -> str:
    defs = []
    for name, (body, _) in ATTACKS.items():
        params = "f, x, y" if name == "superposition_gaps" else "*args"
        defs.append(f"def {name}({params}):\n" + textwrap.indent(body, "    "))
    return "print('garbage ' * 1000)\n" + "\n\n".join(defs) + "\nimport sys\nsys.exit(0)\n"


def _write_notebook(path, source: str) -> None:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("%matplotlib inline\n!echo this line is skipped"),
                nbformat.v4.new_code_cell("%%bash\necho a cell magic: skipped whole"),
                nbformat.v4.new_markdown_cell("My answers"),
                nbformat.v4.new_code_cell(source)]
    nbformat.write(nb, path)


@pytest.mark.parametrize("suffix", [".py", ".ipynb", ".md"])
def test_honest_answers_pass_in_every_format(tmp_path, suffix):
    path = tmp_path / f"alice{suffix}"
    if suffix == ".py":
        path.write_text(RIGHT)
    elif suffix == ".ipynb":
        _write_notebook(path, RIGHT)
    else:
        _write_notebook(tmp_path / "alice.ipynb", RIGHT)
        jupytext.write(nbformat.read(tmp_path / "alice.ipynb", as_version=4), path, fmt="md:myst")
    results = grading.grade(1, path)
    assert [r.name for r in results] == NAMES
    assert all(r.passed for r in results), [str(r) for r in results if not r.passed]


def test_every_attack_gets_a_cross_with_its_reason(tmp_path):
    path = tmp_path / "mallory.py"
    path.write_text(_attack_source())
    results = {r.name: r for r in grading.grade(1, path, timeout=2.0, memory_mb=3072)}
    for name, (_, words) in ATTACKS.items():
        assert not results[name].passed, name
        assert words in results[name].message, (name, results[name].message)


def test_the_book_package_is_out_of_reach(tmp_path):
    """Importing a checker or a reference fails in the student's process, and nothing of the package is loaded
    there to be patched; the grader's own checkers are untouched."""
    child = grading.Child(["import sys\ndef loaded():\n    return sorted(m for m in sys.modules if "
                           "m.startswith('transformer_lab'))\n",
                           "from transformer_lab.exercises.ch1 import _attention_reference as attention"])
    try:
        assert child.call("loaded", (), {}, 5.0) == []
        assert "attention" not in child.names
        assert child.cell_errors[0][:2] == (1, "ImportError")
        assert "cannot be imported by a graded submission" in child.cell_errors[0][2]
    finally:
        child.close()


def test_a_file_saved_with_a_bom_and_crlf_grades_as_written(tmp_path):
    path = tmp_path / "alice.py"
    path.write_bytes(b"\xef\xbb\xbf" + RIGHT.replace("\n", "\r\n").encode("utf-8"))  # as Notepad saves it
    assert "\ufeff" not in submission_cells(path)[0]
    assert all(r.passed for r in grading.grade(1, path)), "a BOM or CRLF line endings cost points"


def test_two_files_of_one_student_keep_one_row_each_and_a_bad_csv_grades_nothing(tmp_path, monkeypatch):
    folder = tmp_path / "submissions"
    folder.mkdir()
    (folder / "alice.py").write_text(RIGHT)
    _write_notebook(folder / "alice.ipynb", RIGHT)
    (tmp_path / "adir").mkdir()
    calls = []
    monkeypatch.setattr(grading, "grade",
                        lambda *a, **k: calls.append(a) or [CheckResult(n, True, "") for n in NAMES])
    for bad in (tmp_path / "adir", tmp_path / "missing" / "g.csv"):
        with pytest.raises(ValueError, match=r"--csv: cannot write .* nothing was graded"):
            grading.grade_folder(1, folder, bad)
    assert not calls and sorted(p.name for p in tmp_path.iterdir()) == ["adir", "submissions"]  # no adir.tmp
    rows = grading.grade_folder(1, folder, tmp_path / "g.csv")
    assert {r["student"] for r in rows} == {"alice.py", "alice.ipynb"} and len(rows) == 2 * len(NAMES)


def test_a_folder_grades_into_one_csv(tmp_path):
    """Five made-up submissions: honest, wrong, hanging, exiting, patching; only the honest one passes."""
    folder = tmp_path / "submissions"
    folder.mkdir()
    (folder / "honest.py").write_text(RIGHT)
    (folder / "wrong.py").write_text(RIGHT.replace("/ math.sqrt(query.shape[-1])", "")
                                     .replace("A, A @ V", "A, A @ V + 1"))
    (folder / "hanging.py").write_text(RIGHT.replace('def attention(query, key, value, mask=None):\n',
                                                     'def attention(query, key, value, mask=None):\n'
                                                     '    while True:\n        pass\n'))
    (folder / "exiting.py").write_text(RIGHT + "\nimport os\nos._exit(0)\n")
    (folder / "patching.py").write_text(
        "import transformer_lab.exercises as ex\nex.check_function = lambda *a, **k: ex.CheckResult('x', True, '')\n"
        + RIGHT.replace("def attention(", "def _unused(") + "\nfrom transformer_lab.attention import "
        "scaled_dot_product_attention as attention\n")
    out = tmp_path / "grades.csv"
    rows = grading.grade_folder(1, folder, out, timeout=2.0)
    with open(out, newline="") as f:
        table = list(csv.DictReader(f))
    assert table == [{k: str(v) for k, v in row.items()} for row in rows]
    assert list(table[0]) == ["student", "exercise", "passed", "message"]
    passed = {s: sum(int(r["passed"]) for r in table if r["student"] == s) for s in
              ("honest", "wrong", "hanging", "exiting", "patching")}
    assert passed["honest"] == len(NAMES)
    assert passed["wrong"] == len(NAMES) - 2 and passed["hanging"] == len(NAMES) - 1
    msg = {(r["student"], r["exercise"]): r["message"] for r in table}
    assert "took longer than its time limit" in msg["hanging", "attention"]
    # os._exit at the end of the file: the process ends while loading, so no exercise can pass
    assert passed["exiting"] == 0 and "process ended (exit code 0)" in msg["exiting", "attention"]
    # the patch and the imported reference fail in the student's process; the rest is graded as written
    assert not int(next(r["passed"] for r in table if r["student"] == "patching" and r["exercise"] == "attention"))
    assert "cannot be imported by a graded submission" in msg["patching", "attention"]
    print("\n" + grading.summary(rows))


def test_bad_submissions_are_refused_clearly(tmp_path):
    with pytest.raises(ValueError, match=r"a \.py file, a notebook"):
        grading.submission_cells(tmp_path / "answers.txt")
    with pytest.raises(FileNotFoundError, match="submission not found"):
        grading.submission_cells(tmp_path / "missing.py")
    (tmp_path / "broken.ipynb").write_text("{not json")
    with pytest.raises(ValueError, match="not a readable notebook"):
        grading.submission_cells(tmp_path / "broken.ipynb")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="holds no submissions"):
        grading.grade_folder(1, tmp_path / "empty", tmp_path / "x.csv")


@pytest.mark.parametrize("chapter", range(1, 9))
def test_hidden_cases_keep_every_catalogue_verdict(chapter):
    """On the hidden cases every correct alternative of the chapter's catalogue still passes and every typical
    wrong answer still fails: the hidden cases test the same thing on other inputs."""
    catalogue = importlib.import_module(f"test_exercises_ch{chapter}").CATALOGUE
    exercises = registry(chapter)
    with hidden_cases("a lecturer's secret"):
        for name, entry in catalogue.items():
            for right in entry["right"]:
                assert exercises[name](right).passed, (name, right, exercises[name](right).message)
            for wrong, _ in entry["wrong"]:
                assert not exercises[name](wrong).passed, (name, wrong)


def test_an_answer_fitted_to_the_public_cases_fails_the_hidden_ones(tmp_path):
    """A submission that returns the public cases' answers from a table passes in the notebook and fails
    ``check --hidden``; the honest answers pass both."""
    namespace = {}
    exec(RIGHT, namespace)
    table = {}

    def recording(query, key, value, mask=None):
        out = namespace["attention"](query, key, value, mask)
        table[round(float(query.sum()), 6)] = out.tolist()
        return out

    assert registry(1)["attention"](recording).passed
    fitted = RIGHT + "\n\nTABLE = " + repr(table) + textwrap.dedent('''

        def attention(query, key, value, mask=None):
            return torch.tensor(TABLE[round(float(query.sum()), 6)], dtype=query.dtype)
        ''')
    (tmp_path / "fitted.py").write_text(fitted)
    public = {r.name: r for r in grading.grade(1, tmp_path / "fitted.py")}
    assert public["attention"].passed
    hidden = {r.name: r for r in grading.grade(1, tmp_path / "fitted.py", hidden="k")}
    assert not hidden["attention"].passed and "hidden cases fail" in hidden["attention"].message
    assert hidden["split_heads"].passed and "hidden cases" in hidden["split_heads"].message


def test_without_bwrap_check_refuses_unless_unsafe_and_the_key_stays_off_the_command_line(tmp_path, monkeypatch,
                                                                                         capsys):
    from transformer_lab import cli

    (tmp_path / "alice.py").write_text(RIGHT)
    monkeypatch.setattr(grading, "sandbox_available", lambda: False)
    assert cli.main(["check", "1", str(tmp_path / "alice.py")]) == 2
    assert "bwrap (bubblewrap) is not installed" in capsys.readouterr().err
    with pytest.raises(grading.SandboxUnavailable):
        grading.grade(1, tmp_path / "alice.py")
    assert cli.main(["check", "1", str(tmp_path / "alice.py"), "--unsafe"]) == 0
    assert "warning: --unsafe" in capsys.readouterr().err
    assert cli.main(["check", "1", str(tmp_path / "alice.py"), "--hidden", "k"]) == 2
    assert "--hidden-file" in capsys.readouterr().err


def test_csv_cells_are_cut_keyless_and_never_a_formula():
    assert grading.csv_cell("=HYPERLINK(1)") == "'=HYPERLINK(1)"
    assert grading.csv_cell("-1+2") == "'-1+2" and grading.csv_cell("@x") == "'@x" and grading.csv_cell("+x") == "'+x"
    assert grading.csv_cell("the key is s3cret!", "s3cret") == "the key is [the key]!"
    assert len(grading.csv_cell("x" * 5000)) == grading.MESSAGE_CHARS
