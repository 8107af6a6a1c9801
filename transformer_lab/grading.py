"""Grading a submission in a separate process, for marks.

    grade(chapter, "answers.ipynb", timeout=10.0)   -> [CheckResult, ...], one per exercise of the chapter
    grade_folder(chapter, "submissions/", "grades.csv") -> rows (student, exercise, passed, message)

The student's code runs in a child process (a scratch working folder, a memory limit, its output captured, the
book's package ``transformer_lab`` not importable); the checkers, their cases and their expected values stay in
this process. For each call a checker makes, the arguments go to the child over a pipe, the child calls the
student's function and sends the answer back, and the comparison happens here. A function passed as an argument
(a checker's ``f``) stays here too: the child calls back. So a submission that exits, hangs, crashes, prints,
patches a checker or imports a reference changes only its own process: each exercise it affects gets a ✗ and says
why, never a ✓. Messages carry tensors, arrays, numbers, strings, dtypes, containers and SymPy expressions,
written with ``torch.save`` and read with ``torch.load(weights_only=True)``: nothing the child sends is executed.

The child runs in a bubblewrap sandbox (:mod:`transformer_lab.sandbox`): its own namespaces, a clean environment,
read-only Python and site-packages with the book's package hidden, one writable tmpfs folder, limits on memory,
output, file size and processes, each named in its ✗, and its output in a log of its own, never the grader's. It
cannot read the repository, the instructor's files, the key (never on a command line: ``check --hidden-file``) or
the other submissions, nor signal the grader. Without ``bwrap`` grading refuses to run unless ``unsafe`` (``check
--unsafe``; there the child is the grader's own user, so it can reach the grader's files and output, e.g. forge
lines of the report through ``/proc/<ppid>/fd/1``). What the sandbox does not stop: an answer copied from the
book's text by hand. Read the code you grade; the hidden cases catch answers written to the public ones.

The grader's limits are its own (issue 28): a reply is decoded within limits of size and work
(:mod:`transformer_lab._wire`: a reply over one fails its exercise, saying which); a ``--memory-mb`` too small for
the grader's own process stops grading with that number (:class:`GraderLimit`), never a ✗ blaming a student.
Time: loading the submission may take ``LOAD_TIMEOUT`` seconds, each exercise ``timeout`` seconds of calls. A
process that died, hung or went over a limit is started again, and the submission reloaded, for the next exercise,
but all these reloads together get at most ``timeout`` seconds per exercise of the chapter: a reload that would not
fit in what is left is not tried, and the exercises left get a ✗ saying so. So a submission costs at most
``LOAD_TIMEOUT`` + 2 × ``timeout`` per exercise (3 × with ``hidden``), plus the grader's own start of each process.
"""

from __future__ import annotations

import csv
import os
import tempfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from transformer_lab.exercises import CheckResult, hidden_cases, registry
from transformer_lab.exercises.forbid import FORBIDDEN
from transformer_lab.sandbox import (  # noqa: F401  (the sandbox's names, importable from here as before)
    DEFAULT_MEMORY_MB,
    LOAD_TIMEOUT,
    MAX_OUTPUT_BYTES,
    MAX_PROCESSES,
    SANDBOX_MISSING,
    SCRATCH_BYTES,
    Child,
    GraderLimit,
    SandboxUnavailable,
    SubmissionFailed,
    _limit_hit,
    sandbox_available,
    sandbox_command,
)

DEFAULT_TIMEOUT = 10.0  # seconds of the child's time per exercise
MESSAGE_CHARS = 300  # a message in the CSV is cut to this
SUFFIXES = (".py", ".ipynb", ".md")


# ------------------------------------------------------------------ what a submission holds
def submission_cells(path: str | Path) -> list[str]:
    """The code of a submission as a list of cells: a ``.py`` file is one cell; a notebook (``.ipynb``) or a
    chapter in MyST Markdown (``.md``, read by jupytext) gives its code cells, IPython magics and shell lines
    (``%...``, ``!...``) and cell magics (``%%...``) left out."""
    path = Path(path)
    if path.suffix not in SUFFIXES:
        raise ValueError(f"{path.name}: a submission is a .py file, a notebook (.ipynb) or a chapter (.md), "
                         f"not {path.suffix or 'a file without a suffix'}")
    if not path.is_file():
        raise FileNotFoundError(f"submission not found: {path}")
    text = source_text(path.read_bytes())
    if path.suffix == ".py":
        return [text]
    if path.suffix == ".ipynb":
        import nbformat

        try:
            nb = nbformat.reads(text, as_version=4)
        except Exception as exc:
            raise ValueError(f"{path.name} is not a readable notebook: {type(exc).__name__}: {exc}") from exc
    else:
        import jupytext

        nb = jupytext.reads(text, fmt="md:myst")
    cells = []
    for cell in nb.cells:
        if cell.cell_type != "code" or cell.source.lstrip().startswith("%%"):
            continue
        cells.append("\n".join("" if line.lstrip().startswith(("%", "!")) else line
                               for line in cell.source.splitlines()))
    return cells

def source_text(data: bytes) -> str:
    """A file's text as editors save it: UTF-8 with or without a BOM, or UTF-16 with one (Notepad's "Unicode"),
    line endings CRLF, CR or LF all read as LF; bytes that are not text become U+FFFD (the cell then raises)."""
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        text = data.decode("utf-16", errors="replace")
    else:
        text = data.decode("utf-8-sig", errors="replace")
    return text.lstrip("\ufeff").replace("\r\n", "\n").replace("\r", "\n")


# ------------------------------------------------------------------ grading one submission
class NotGraded(CheckResult):
    """A ✗ because the submission could not be graded on this exercise: its process ended, hung, hit a limit or
    sent something unreadable (not a wrong answer). ``check`` on a folder exits 1 when any submission has one."""


def grade(chapter: int, path: str | Path, *, timeout: float = DEFAULT_TIMEOUT, memory_mb: int = DEFAULT_MEMORY_MB,
          hidden: str | None = None, unsafe: bool = False, cells: list[str] | None = None) -> list[CheckResult]:
    """Every exercise of ``chapter`` on the functions the submission at ``path`` defines (or ``cells``, its code
    read earlier), each within ``timeout`` seconds of the student's code; the student's code runs in a child
    process in the sandbox, or without it if ``unsafe`` (see the module docstring: raises
    :class:`SandboxUnavailable` when ``bwrap`` is missing, :class:`GraderLimit` when ``memory_mb`` is too small for
    the grader itself). With ``hidden`` (the instructor's key) an exercise passes only if it also passes its hidden
    cases; the key never appears in a message."""
    exercises = registry(chapter)
    cells = submission_cells(path) if cells is None else cells
    if not unsafe and not sandbox_available():
        raise SandboxUnavailable(SANDBOX_MISSING)
    processes = _Processes(cells, memory_mb=memory_mb, unsafe=unsafe, timeout=timeout, exercises=len(exercises))
    results: list[CheckResult] = []
    try:
        for name, checker in exercises.items():
            child = processes.next()
            if isinstance(child, str):  # no process to grade with: none of the exercises left can pass
                results += [NotGraded(n, False, child) for n in list(exercises)[len(results):]]
                break
            if name not in child.names:
                results.append(CheckResult(name, False, f"{Path(path).name} defines no function named {name!r}"
                                                        + _cell_error_note(child.cell_errors, memory_mb)))
                continue
            result = _run_checker(name, checker, child, timeout)
            if result.passed and hidden is not None:
                with hidden_cases(hidden):
                    secret = _run_checker(name, checker, child, timeout)
                result = (CheckResult(name, True, result.message + "; and its hidden cases") if secret.passed else
                          type(secret)(name, False, "public cases pass, hidden cases fail: " + secret.message))
            results.append(result)
    finally:
        processes.close()
    if hidden:
        results = [type(r)(r.name, r.passed, r.message.replace(hidden, "[the key]")) for r in results]
    return results


class _Processes:
    """The submission's process for each exercise in turn: the same one while it answers; after it failed, a new
    one, the submission loaded again, while that fits in the reload time: ``timeout`` seconds per exercise of the
    chapter for all reloads together (the time the submission's cells take, not the grader's start)."""

    def __init__(self, cells: list[str], *, memory_mb: int, unsafe: bool, timeout: float, exercises: int):
        self.cells, self.memory_mb, self.unsafe, self.timeout = cells, memory_mb, unsafe, timeout
        self.reload_left = timeout * exercises
        self.child: Child | None = None

    def next(self) -> Child | str:
        """The process for the next exercise, or why there is none (a :class:`NotGraded` message)."""
        child = self.child
        if child is not None and not child.failure:
            return child
        load_timeout = LOAD_TIMEOUT
        if child is not None:  # it failed: load again only if that fits in what is left of the reload time
            child.close()
            if child.load_seconds > self.reload_left:
                return (f"not graded: the submission was not loaded again after its process failed (loading it "
                        f"takes {child.load_seconds:.1f} s, more than the {self.reload_left:.1f} s left of its reload "
                        f"time, {self.timeout:g} s per exercise): {child.failure}")
            load_timeout = self.reload_left
        try:
            self.child = Child(self.cells, memory_mb=self.memory_mb, load_timeout=load_timeout, unsafe=self.unsafe)
        except SubmissionFailed as exc:  # the submission itself does not load: nothing can pass
            self.child = None
            return str(exc)
        if child is not None:
            self.reload_left -= self.child.load_seconds
        return self.child

    def close(self) -> None:
        if self.child is not None:
            self.child.close()


def _run_checker(name: str, checker: Callable, child: Child, timeout: float) -> CheckResult:
    def student(*args, **kwargs):  # what the checker forbids while it calls (check_function) is forbidden there
        return child.call(name, args, kwargs, timeout, FORBIDDEN.get())

    def value_and_grad(args: tuple, grad):  # the result and its gradients, by autograd in the student's process
        return child.call(name, args, {}, timeout, FORBIDDEN.get(), grad=grad)

    student.__name__ = student.__qualname__ = name
    student.value_and_grad = value_and_grad
    child.used = 0.0
    try:
        result = checker(student)
    except SubmissionFailed as exc:  # a checker that calls outside check_function's own error handling
        return NotGraded(name, False, str(exc))
    except Exception as exc:
        return CheckResult(name, False, f"the checker could not judge this answer: {type(exc).__name__}: {exc}")
    if child.failure:  # whatever the checker concluded, a call that did not come back is a ✗
        return NotGraded(name, False, child.failure)
    return result


def _cell_error_note(errors: list, memory_mb: int = DEFAULT_MEMORY_MB) -> str:
    if not errors:
        return ""
    first = errors[0]
    if limit := _limit_hit(first[1], first[2], memory_mb):
        return f" (while cell {first[0] + 1} of the submission ran, {limit})"
    return f" (cell {first[0] + 1} of the submission raised {first[1]}: {first[2][:200]})"


# ------------------------------------------------------------------ a folder of submissions
CSV_FIELDS = ("student", "exercise", "passed", "message")


class Rows(list):
    """The CSV's rows (dicts), and ``ungraded``: the students whose submission could not be graded on some
    exercise (:class:`NotGraded`: it ended, hung, hit a limit, or its file could not be read)."""

    ungraded: list[str]


def grade_folder(chapter: int, folder: str | Path, csv_path: str | Path, *, timeout: float = DEFAULT_TIMEOUT,
                 memory_mb: int = DEFAULT_MEMORY_MB, hidden: str | None = None, unsafe: bool = False) -> Rows:
    """Grade every submission in ``folder`` (``.py``, ``.ipynb``, ``.md``; one student per file: its name without
    the suffix, with it where two files share a name, see :func:`student_names`) into one CSV with columns student,
    exercise, passed (1/0), message. Every file is read before any runs. Returns the rows, as written
    (:func:`csv_cell`). A ``csv_path`` that cannot be written is refused before any grading (:func:`check_csv_path`)
    and no temporary file is left behind, whatever happens."""
    folder, csv_path = Path(folder), Path(csv_path)
    check_csv_path(csv_path)
    paths = sorted(p for p in folder.iterdir() if p.is_file() and p.suffix in SUFFIXES)
    if not paths:
        raise ValueError(f"{folder} holds no submissions ({', '.join(SUFFIXES)} files)")
    if not unsafe and not sandbox_available():
        raise SandboxUnavailable(SANDBOX_MISSING)
    read: dict[Path, list[str] | Exception] = {}
    for path in paths:  # all read first: without the sandbox, a submission could rewrite a classmate's file
        try:
            read[path] = submission_cells(path)
        except (ValueError, OSError) as exc:
            read[path] = exc
    rows, ungraded = Rows(), []
    for path, student in zip(paths, student_names(paths, hidden), strict=True):
        cells = read[path]
        if isinstance(cells, Exception):
            results = [NotGraded(name, False, str(cells)) for name in registry(chapter)]
        else:
            results = grade(chapter, path, timeout=timeout, memory_mb=memory_mb, hidden=hidden, unsafe=unsafe,
                            cells=cells)
        if any(isinstance(r, NotGraded) for r in results):
            ungraded.append(student)
        rows += [{"student": student, "exercise": r.name, "passed": int(r.passed),
                  "message": csv_cell(r.message, hidden)} for r in results]
    rows.ungraded = ungraded
    _write_csv(csv_path, rows)
    return rows


def check_csv_path(csv_path: str | Path) -> None:
    """Raise ``ValueError`` unless a CSV can be written at ``csv_path``: a file name (new, or an existing regular
    file) in an existing folder where a file can be created (tried: a temporary file made and removed at once)."""
    csv_path = Path(csv_path)
    problem = ("it is a folder" if csv_path.is_dir() else
               "it exists and is not a regular file" if csv_path.exists() and not csv_path.is_file() else
               f"the folder {csv_path.parent} does not exist" if not csv_path.parent.is_dir() else None)
    if problem is None:
        try:
            with tempfile.NamedTemporaryFile(dir=csv_path.parent, prefix=f".{csv_path.name}.", suffix=".tmp"):
                pass
        except OSError as exc:
            problem = f"no file can be created in {csv_path.parent} ({exc.strerror or exc})"
    if problem:
        raise ValueError(f"--csv: cannot write {csv_path}: {problem} (give a file name in an existing, writable "
                         "folder); nothing was graded")


def _write_csv(csv_path: Path, rows: list[dict]) -> None:
    """``rows`` into ``csv_path`` at once: written to a temporary file beside it, then renamed; the temporary file
    is removed if anything fails."""
    with tempfile.NamedTemporaryFile("w", dir=csv_path.parent, prefix=f".{csv_path.name}.", suffix=".tmp",
                                     newline="", encoding="utf-8", delete=False) as f:
        tmp = Path(f.name)
        try:
            writer = csv.DictWriter(f, fieldnames=CSV_FIELDS)
            writer.writeheader()
            writer.writerows(rows)
        except BaseException:
            f.close()
            tmp.unlink(missing_ok=True)
            raise
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # as open() would have made it (a temporary file is private)
        os.replace(tmp, csv_path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def student_names(paths: list[Path], key: str | None = None) -> list[str]:
    """One distinct student per file: its name without the suffix, or with it where two files share that name
    (``alice.py`` and ``alice.md``), control characters shown escaped (a name cannot add a line to the report),
    made safe for a spreadsheet (:func:`csv_cell`); a name still taken gets " (2)", " (3)" ..."""
    stems = Counter(p.stem for p in paths)
    names: list[str] = []
    for p in paths:
        raw = p.stem if stems[p.stem] == 1 else p.name
        name = base = csv_cell("".join(c if c.isprintable() else ascii(c)[1:-1] for c in raw), key)
        n = 1
        while name in names:
            n += 1
            name = f"{base} ({n})"
        names.append(name)
    return names


def csv_cell(text: str, key: str | None = None) -> str:
    """``text`` safe for a spreadsheet: the key replaced, cut to ``MESSAGE_CHARS``, and quoted with a leading
    ``'`` when it starts like a formula (``=``, ``+``, ``-``, ``@``, a tab or a carriage return)."""
    if key:
        text = text.replace(key, "[the key]")
    if len(text) > MESSAGE_CHARS:
        text = text[:MESSAGE_CHARS - 1] + "…"
    return "'" + text if text.startswith(("=", "+", "-", "@", "\t", "\r")) else text


def summary(rows: list[dict]) -> str:
    """One line per student: how many exercises pass."""
    students: dict[str, list[int]] = {}
    for row in rows:
        students.setdefault(row["student"], []).append(row["passed"])
    return "\n".join(f"{s}: {sum(p)} of {len(p)} pass" for s, p in students.items())
