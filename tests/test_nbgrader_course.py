"""The nbgrader route (issue 13): `export-course` writes a course that nbgrader releases without solutions and
autogrades with the right scores, and whose collected notebooks the isolated grader (`check N FOLDER`) marks the
same way; solutions leave no text behind in the student's copies."""

import os
import re
import shutil
import subprocess
import sys

import jupytext
import nbformat
import pytest
from conftest import NOTEBOOK_HEADER
from course_notebooks import student_notebook
from nbgrader.api import Gradebook

from transformer_lab import grading
from transformer_lab.course import (
    COURSE_ID,
    POINTS,
    Solution,
    _exercise_text,
    assignment_notebook,
    export_course,
    without_solutions,
)

CHAPTER = 8  # four exercises, each checked in well under a second
WRITTEN = NOTEBOOK_HEADER + """
# A chapter

```{code-cell} ipython3
:tags: [exercise]

def double(x):
    raise NotImplementedError  # your code here
```

```{solution-start} ex-double
:class: dropdown
```

The written solution: doubling is adding x to itself.

```{code-cell} ipython3
:tags: [solution]

def double(x):
    return 2 * x
```

Its last words.

```{solution-end}
```

Text after the exercise stays.
"""


def _text(cells) -> str:
    return "\n".join(c.source for c in cells if not isinstance(c, Solution))


def test_solution_text_inside_the_gates_is_removed(tmp_path):
    (tmp_path / "chapters").mkdir()
    page = tmp_path / "chapters" / "09-test.md"
    page.write_text(WRITTEN)
    parts = without_solutions(jupytext.read(page))
    [solution] = [p for p in parts if isinstance(p, Solution)]
    assert [c.source for c in solution.cells] == ["def double(x):\n    return 2 * x"]
    for text in (_text(parts), _text(student_notebook(page).cells)):
        assert "written solution" not in text and "last words" not in text and "return 2 * x" not in text
        assert "Text after the exercise stays." in text and "raise NotImplementedError" in text


def test_every_chapter_exports_with_graded_cells(tmp_path):
    export_course(tmp_path)
    for path in sorted((tmp_path / "source").glob("ch*/ch*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        meta = [c.metadata["nbgrader"] for c in nb.cells if "nbgrader" in c.metadata]
        assert all(m["schema_version"] == 3 for m in meta)
        assert len({m["grade_id"] for m in meta}) == len(meta), f"{path.name}: grade_ids repeat"
        solutions = [i for i, c in enumerate(nb.cells) if c.metadata.get("nbgrader", {}).get("solution")]
        assert solutions, f"{path.name} has no solution cells"
        for i in solutions:
            assert "### BEGIN SOLUTION" in nb.cells[i].source and nb.cells[i].source.startswith("def ")
            test = nb.cells[i + 1].metadata["nbgrader"]
            assert test["grade"] and test["locked"] and test["points"] == POINTS
        text = "\n".join(c.source for c in nb.cells)
        assert "solution-start" not in text and "claim(" not in text
        roles = re.findall(r"\{\w+(?::\w+)?\}`[^`]*`", text)  # Jupyter shows MyST roles as raw text
        assert not roles, f"{path.name}: MyST roles left in the text: {roles}"
    assert (tmp_path / "nbgrader_config.py").is_file()


def test_roles_become_plain_words():
    assert _exercise_text("see {ref}`ch1-rank`") == "see *What a $d_k$-dimensional dot product cannot express* " \
                                                    "(chapter 1)"
    assert _exercise_text("{cite}`barrett2021implicit`") == "Barrett and Dherin (2021)"
    assert _exercise_text("{doc}`08-mini-gpt`") == "*The mini-GPT: everything together*"
    assert _exercise_text("{ref}`the rank <ch1-rank>`") == "the rank"


def _nbgrader(course, *args):
    bin_dir = os.path.dirname(sys.executable)  # the venv's nbgrader, and the alembic it calls
    home = course.parent / "home"
    env = {**os.environ, "HOME": str(home), "JUPYTER_CONFIG_DIR": str(home / "config"),
           "JUPYTER_DATA_DIR": str(home / "data"), "JUPYTER_RUNTIME_DIR": str(home / "runtime"),
           "PATH": bin_dir + os.pathsep + os.environ.get("PATH", "")}
    run = subprocess.run([os.path.join(bin_dir, "nbgrader"), *args], cwd=course, env=env,
                         capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout + run.stderr


def _body(source: str) -> str:
    """The code between the solution markers."""
    return source.split("### BEGIN SOLUTION\n")[1].split("### END SOLUTION")[0]


def _submit(course, assignment, student, release, solutions, wrong=None):
    """The released notebook with every answer filled in from the instructor's source; ``wrong`` returns None."""
    nb = nbformat.read(release, as_version=4)
    for cell in nb.cells:
        grade_id = cell.metadata.get("nbgrader", {}).get("solution") and cell.metadata["nbgrader"]["grade_id"]
        if grade_id:
            head = solutions[grade_id].split("### BEGIN SOLUTION")[0]
            body = "    return None\n" if grade_id == wrong else _body(solutions[grade_id])
            cell.source = head.rstrip() + "\n" + body
    folder = course / "submitted" / student / assignment
    folder.mkdir(parents=True)
    nbformat.write(nb, folder / release.name)


@pytest.mark.timeout(300)
def test_nbgrader_releases_without_solutions_and_autogrades(tmp_path):
    course = export_course(tmp_path / "course", [CHAPTER])
    assignment = f"ch{CHAPTER:02d}"
    _nbgrader(course, "generate_assignment", assignment)

    source = assignment_notebook(CHAPTER)
    solutions = {c.metadata["nbgrader"]["grade_id"]: c.source for c in source.cells
                 if c.metadata.get("nbgrader", {}).get("solution")}
    release = course / "release" / assignment / f"{assignment}.ipynb"
    released = release.read_text()
    assert "BEGIN SOLUTION" not in released and released.count("# YOUR CODE HERE") == len(solutions)
    for body in map(_body, solutions.values()):
        lines = [line.strip() for line in body.splitlines() if line.strip()]
        assert not any(line in released for line in lines if len(line) > 12), f"solution text released:\n{body}"

    wrong = next(iter(solutions))
    _submit(course, assignment, "right", release, solutions)
    _submit(course, assignment, "wrong", release, solutions, wrong=wrong)
    _nbgrader(course, "autograde", assignment)

    total = POINTS * len(solutions)
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}", COURSE_ID) as gradebook:
        right, bad = (gradebook.find_submission(assignment, s) for s in ("right", "wrong"))
        assert (right.score, right.max_score) == (total, total)
        assert (bad.score, bad.max_score) == (total - POINTS, total)
        [failed] = [g for g in bad.notebooks[0].grades if g.score < g.max_score]
        assert failed.cell.name == f"test_{wrong}"

    flat = tmp_path / "collected"  # the course guide's way to the isolated grader: one notebook per student
    flat.mkdir()
    for student in ("right", "wrong"):
        shutil.copy(course / "submitted" / student / assignment / release.name, flat / f"{student}.ipynb")
    rows = grading.grade_folder(CHAPTER, flat, tmp_path / "grades.csv")
    assert {(r["student"], r["exercise"]) for r in rows if not r["passed"]} == {("wrong", wrong)}
    assert len(rows) == 2 * len(solutions)


def test_export_course_command(tmp_path, capsys):
    from transformer_lab import cli

    assert cli.main(["export-course", str(tmp_path / "course"), "--chapters", "8"]) == 0
    assert (tmp_path / "course" / "source" / "ch08" / "ch08.ipynb").is_file()
    assert "nbgrader generate_assignment" in capsys.readouterr().out
    assert cli.main(["export-course", str(tmp_path / "other"), "--chapters", "9"]) == 2
    assert capsys.readouterr().err.startswith("error: ")
