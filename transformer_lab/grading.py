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

What this does not stop: a student who reads the package's files from disk and copies a reference into the
submission. Read the code you grade; the hidden cases (``check --hidden``) catch answers written to the public ones.
"""

from __future__ import annotations

import contextlib
import csv
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from transformer_lab._wire import decode, encode, receive, send
from transformer_lab.exercises import CheckResult, hidden_cases, registry

DEFAULT_TIMEOUT = 10.0  # seconds of the child's time per exercise
DEFAULT_MEMORY_MB = 4096  # the child's address-space limit (torch itself maps about 1 GiB)
LOAD_TIMEOUT = 120.0  # seconds to run the submission's cells (a whole chapter notebook takes < 60 s)
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
    text = path.read_text(encoding="utf-8-sig", errors="replace")  # as editors save it: a BOM is not code
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


# ------------------------------------------------------------------ the parent side
class SubmissionFailed(Exception):
    """The child did not answer a call: it ended, ran out of time, or sent something unreadable."""


def _raised(type_name: str, message: str) -> BaseException:
    """The student's exception, rebuilt here by name (a NotImplementedError stays one: "not written yet")."""
    if type_name == "NotImplementedError":
        return NotImplementedError(message)
    return type(type_name if re.fullmatch(r"[A-Za-z_]\w{0,60}", type_name) else "Error", (Exception,), {})(message)


class Child:
    """The student's process: started with the submission's cells loaded, answering calls by name."""

    def __init__(self, cells: list[str], *, memory_mb: int = DEFAULT_MEMORY_MB, load_timeout: float = LOAD_TIMEOUT):
        self.scratch = tempfile.TemporaryDirectory(prefix="tl-grade-")
        self.log = Path(self.scratch.name) / "output.txt"
        to_child, self._write = os.pipe()
        self._read, from_child = os.pipe()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "TL_"))}
        env.update(OMP_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1")
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-I", "-m", "transformer_lab._grading_child", str(to_child), str(from_child),
                 str(memory_mb)], cwd=self.scratch.name, stdin=subprocess.DEVNULL, stdout=out,
                stderr=subprocess.STDOUT, pass_fds=(to_child, from_child), env=env)
        os.close(to_child)
        os.close(from_child)
        self.used = 0.0  # seconds of waiting on the child in the current exercise
        self.failure: str | None = None
        reply = self._exchange(("load", cells), time.monotonic() + load_timeout, what="running the submission")
        self.names, self.cell_errors = set(reply[1]), reply[2]

    def call(self, name: str, args: tuple, kwargs: dict, budget: float) -> Any:
        """``name(*args, **kwargs)`` in the child, within what is left of ``budget`` seconds for this exercise."""
        if self.failure:
            raise SubmissionFailed(self.failure)
        callbacks: list[Callable] = []
        message = ("call", name, encode(args, callbacks), encode(kwargs, callbacks))
        start = time.monotonic()
        try:
            reply = self._exchange(message, start + max(budget - self.used, 0.0), what=f"{name}(...)",
                                   callbacks=callbacks)
        finally:
            self.used += time.monotonic() - start
        if reply[0] == "raised":
            raise _raised(reply[1], reply[2])
        return decode(reply[1])

    def _exchange(self, message, deadline: float, *, what: str, callbacks=()) -> tuple:
        try:
            send(self._write, message)
            while True:
                reply = receive(self._read, deadline)
                if not (isinstance(reply, tuple) and reply and reply[0] in ("ok", "raised", "loaded", "callback")):
                    raise ValueError(f"an unexpected message ({type(reply).__name__})")
                if reply[0] != "callback":
                    return reply
                send(self._write, self._run_callback(callbacks, reply))
        except TimeoutError:
            self.failure = f"took longer than its time limit while {what}; the process was stopped"
        except (EOFError, BrokenPipeError):
            code = self._wait()
            how = (f"was killed by signal {signal.Signals(-code).name}" if code is not None and code < 0 else
                   f"ended (exit code {code})")
            self.failure = f"the submission's process {how} while {what}" + self._output_tail()
        except Exception as exc:  # unreadable or oversized: the child wrote to our pipe itself
            self.failure = f"the submission's process sent an unreadable message while {what} ({exc})"
        self.close()
        raise SubmissionFailed(self.failure)

    @staticmethod
    def _run_callback(callbacks, reply) -> tuple:
        _, index, args, kwargs = reply
        try:
            value = callbacks[int(index)](*decode(args), **decode(kwargs))
            return ("ok", encode(value))
        except Exception as exc:
            return ("raised", type(exc).__name__, str(exc)[:500])

    def _wait(self) -> int | None:
        try:
            return self.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            return None

    def _output_tail(self) -> str:
        try:
            text = self.log.read_text(errors="replace").strip()
        except OSError:
            return ""
        return f"; its last output: {text[-300:]!r}" if text else ""

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for fd in (self._write, self._read):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._write = self._read = -1
        self.scratch.cleanup()


def grade(chapter: int, path: str | Path, *, timeout: float = DEFAULT_TIMEOUT, memory_mb: int = DEFAULT_MEMORY_MB,
          hidden: str | None = None) -> list[CheckResult]:
    """Every exercise of ``chapter`` on the functions the submission at ``path`` defines, each within ``timeout``
    seconds of the student's code; the student's code runs in a child process (see the module docstring).
    With ``hidden`` (the instructor's key) an exercise passes only if it also passes its hidden cases."""
    exercises = registry(chapter)
    cells = submission_cells(path)
    child: Child | None = None
    results = []
    try:
        for name, checker in exercises.items():
            if child is None or child.failure:  # a fresh process after a crash or a timeout
                if child is not None:
                    child.close()
                try:
                    child = Child(cells, memory_mb=memory_mb)
                except SubmissionFailed as exc:  # the submission itself does not load: nothing can pass
                    return results + [CheckResult(n, False, str(exc)) for n in list(exercises)[len(results):]]
            if name not in child.names:
                results.append(CheckResult(name, False, f"{Path(path).name} defines no function named {name!r}"
                                                        + _cell_error_note(child.cell_errors)))
                continue
            result = _run_checker(name, checker, child, timeout)
            if result.passed and hidden is not None:
                with hidden_cases(hidden):
                    secret = _run_checker(name, checker, child, timeout)
                result = (CheckResult(name, True, result.message + "; and its hidden cases") if secret.passed else
                          CheckResult(name, False, "public cases pass, hidden cases fail: " + secret.message))
            results.append(result)
    finally:
        if child is not None:
            child.close()
    return results


def _run_checker(name: str, checker: Callable, child: Child, timeout: float) -> CheckResult:
    def student(*args, **kwargs):
        return child.call(name, args, kwargs, timeout)

    student.__name__ = student.__qualname__ = name
    child.used = 0.0
    try:
        result = checker(student)
    except SubmissionFailed as exc:  # a checker that calls outside check_function's own error handling
        return CheckResult(name, False, str(exc))
    except Exception as exc:
        return CheckResult(name, False, f"the checker could not judge this answer: {type(exc).__name__}: {exc}")
    if child.failure:  # whatever the checker concluded, a call that did not come back is a ✗
        return CheckResult(name, False, child.failure)
    return result


def _cell_error_note(errors: list) -> str:
    if not errors:
        return ""
    first = errors[0]
    return f" (cell {first[0] + 1} of the submission raised {first[1]}: {first[2][:200]})"


# ------------------------------------------------------------------ a folder of submissions
CSV_FIELDS = ("student", "exercise", "passed", "message")


def grade_folder(chapter: int, folder: str | Path, csv_path: str | Path, *, timeout: float = DEFAULT_TIMEOUT,
                 memory_mb: int = DEFAULT_MEMORY_MB, hidden: str | None = None) -> list[dict]:
    """Grade every submission in ``folder`` (``.py``, ``.ipynb``, ``.md``; the student is the file's name without
    its suffix, or with it when two files share a name) into one CSV with columns student, exercise, passed (1/0),
    message. Returns the rows. A ``csv_path`` that cannot be written is refused before any grading."""
    folder, csv_path = Path(folder), Path(csv_path)
    if csv_path.is_dir() or not csv_path.parent.is_dir() or not os.access(csv_path.parent, os.W_OK | os.X_OK):
        raise ValueError(f"--csv: cannot write {csv_path} (give a file name in an existing, writable folder); "
                         "nothing was graded")
    paths = sorted(p for p in folder.iterdir() if p.is_file() and p.suffix in SUFFIXES)
    if not paths:
        raise ValueError(f"{folder} holds no submissions ({', '.join(SUFFIXES)} files)")
    stems = [p.stem for p in paths]
    rows = []
    for path in paths:
        try:
            results = grade(chapter, path, timeout=timeout, memory_mb=memory_mb, hidden=hidden)
        except (ValueError, OSError) as exc:
            results = [CheckResult(name, False, str(exc)) for name in registry(chapter)]
        student = path.stem if stems.count(path.stem) == 1 else path.name  # alice.py and alice.md: two rows each
        rows += [{"student": student, "exercise": r.name, "passed": int(r.passed), "message": r.message}
                 for r in results]
    tmp = Path(csv_path).with_name(Path(csv_path).name + ".tmp")
    with open(tmp, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    os.replace(tmp, csv_path)
    return rows


def summary(rows: list[dict]) -> str:
    """One line per student: how many exercises pass."""
    students: dict[str, list[int]] = {}
    for row in rows:
        students.setdefault(row["student"], []).append(row["passed"])
    return "\n".join(f"{s}: {sum(p)} of {len(p)} pass" for s, p in students.items())
