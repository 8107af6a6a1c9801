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

The child runs in a bubblewrap sandbox (``bwrap``, :func:`sandbox_command`): its own mount, PID, network, IPC
and UTS namespaces, a clean environment, read-only Python and site-packages with the book's package hidden, one
writable tmpfs folder, and limits on memory (RLIMIT_AS), output and file size (RLIMIT_FSIZE) and processes
(RLIMIT_NPROC), each named in its ✗. It cannot read the repository, the instructor's files, the key (never on a
command line: ``check --hidden-file``) or the other submissions, nor signal the grader. Without ``bwrap`` grading
refuses to run unless ``unsafe`` (``check --unsafe``). What this does not stop: an answer copied from the book's
text by hand. Read the code you grade; the hidden cases catch answers written to the public ones.
"""

from __future__ import annotations

import contextlib
import csv
import os
import re
import shutil
import signal
import site
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from transformer_lab._wire import decode, encode, receive, send
from transformer_lab.exercises import CheckResult, hidden_cases, registry
from transformer_lab.exercises.forbid import FORBIDDEN

DEFAULT_TIMEOUT = 10.0  # seconds of the child's time per exercise
DEFAULT_MEMORY_MB = 4096  # the child's address-space limit (torch itself maps about 1 GiB)
LOAD_TIMEOUT = 120.0  # seconds to run the submission's cells (a whole chapter notebook takes < 60 s)
MAX_OUTPUT_BYTES = 16 * 2**20  # printed output and each file written (_grading_child.MAX_FILE_BYTES)
MAX_PROCESSES = 64  # processes and threads of one submission (RLIMIT_NPROC in its user namespace)
SCRATCH_BYTES = 64 * 2**20  # the sandbox's one writable folder, a tmpfs
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

# ------------------------------------------------------------------ the sandbox
class SandboxUnavailable(RuntimeError):
    """``bwrap`` (bubblewrap) is not installed: grading for marks refuses to run without it (see ``unsafe``)."""


def sandbox_available() -> bool:
    return shutil.which("bwrap") is not None


def sandbox_command(fd_in: int, fd_out: int, memory_mb: int) -> list[str]:
    """The bubblewrap command that starts the student's process: a new mount, PID, network, IPC and UTS namespace
    (a user namespace too, unless the grader runs as root: then the child drops to an unused uid itself), a clean
    environment, read-only ``/usr``, Python (at ``/sandbox/python``) and its site-packages (``/sandbox/site-N``, the
    book's package and its editable-install hook hidden), the child's two files (``/sandbox/grader``), and one
    writable folder, ``/submission``, a tmpfs of ``SCRATCH_BYTES``; nothing of the repository, the instructor's
    files or the other submissions."""
    bwrap = shutil.which("bwrap")
    if bwrap is None or not sandbox_available():
        raise SandboxUnavailable("bwrap (bubblewrap) is not installed, so a submission cannot be sandboxed: install "
                                 "it (apt-get install bubblewrap), or pass --unsafe to grade without the sandbox")
    root = os.geteuid() == 0
    args = [bwrap, "--die-with-parent", "--new-session", "--clearenv", "--unshare-pid"]
    args += (["--unshare-ipc", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try",  # no user namespace:
              "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"] if root else ["--unshare-all"])  # see _drop_root
    args += ["--ro-bind", "/usr", "/usr"]
    for d in ("/bin", "/sbin", "/lib", "/lib32", "/lib64"):
        if os.path.islink(d):
            args += ["--symlink", os.readlink(d), d]
        elif os.path.isdir(d):
            args += ["--ro-bind", d, d]
    args += ["--ro-bind-try", "/etc/ld.so.cache", "/etc/ld.so.cache", "--proc", "/proc", "--dev", "/dev",
             "--perms", "0755", "--dir", "/sandbox", "--perms", "0755", "--dir", "/sandbox/grader",
             "--perms", "01777", "--size", str(SCRATCH_BYTES), "--tmpfs", "/submission", "--symlink", "/submission",
             "/tmp", "--chdir", "/submission"]
    base, exe = Path(sys.base_prefix).resolve(), Path(os.path.realpath(getattr(sys, "_base_executable", "")
                                                                       or sys.executable))
    args += ["--ro-bind", str(base), "/sandbox/python"]
    if exe.is_relative_to(base):
        python = f"/sandbox/python/{exe.relative_to(base)}"
    else:
        python = "/sandbox/python-bin"
        args += ["--ro-bind", str(exe), python]
    package = Path(__file__).resolve().parent
    paths = []
    sites = [d for d in site.getsitepackages() + [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))]
             if os.path.isdir(d)]
    for i, d in enumerate(dict.fromkeys(str(Path(d).resolve()) for d in sites)):
        inner = f"/sandbox/site-{i}"
        args += ["--ro-bind", d, inner]
        paths.append(f"path={inner}")
        if package.is_relative_to(d):  # installed (not editable): an empty folder over it
            args += ["--tmpfs", f"{inner}/{package.relative_to(d)}"]
        for hook in Path(d).glob("__editable__*transformer_lab*"):
            args += ["--ro-bind", "/dev/null", f"{inner}/{hook.name}"]
    for name in ("_grading_child.py", "_wire.py", "exercises/forbid.py"):
        args += ["--ro-bind", str(package / name), f"/sandbox/grader/{Path(name).name}"]
    args += ["--setenv", "HOME", "/submission", "--setenv", "TMPDIR", "/submission", "--setenv", "PATH",
             "/usr/bin:/bin", "--setenv", "OMP_NUM_THREADS", "1", "--setenv", "LANG", "C.UTF-8", "--remount-ro", "/"]
    uid = [f"uid={200000 + os.getpid() % 100000}"] if root else []  # one unused uid per grader process
    return [*args, "--", python, "-I", "-S", "/sandbox/grader/_grading_child.py", str(fd_in), str(fd_out),
                   str(memory_mb), f"nproc={MAX_PROCESSES}", *uid, *paths]


def _limit_hit(type_name: str, message: str, memory_mb: int) -> str | None:
    """The limit that the student's exception ``type_name: message`` says it hit, by name, or ``None``."""
    if type_name == "MemoryError" or (type_name == "RuntimeError" and re.search(
            r"can't allocate memory|not enough memory|bad_alloc", message)):
        return f"the submission exceeded the memory limit of {memory_mb} MB ({type_name}: {message[:100]})"
    if "[Errno 27]" in message:  # EFBIG: RLIMIT_FSIZE
        return (f"the submission exceeded the output limit of {MAX_OUTPUT_BYTES // 2**20} MB (its printed output, "
                "or a file it wrote)")
    if (type_name in ("BlockingIOError", "OSError") and "[Errno 11]" in message) or "can't start new thread" in message:
        return f"the submission exceeded the process limit of {MAX_PROCESSES} processes and threads ({message[:100]})"
    return None


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"number {number}"


# ------------------------------------------------------------------ the parent side
class SubmissionFailed(Exception):
    """The child did not answer a call: it ended, ran out of time, or sent something unreadable."""


def _raised(type_name: str, message: str) -> BaseException:
    """The student's exception, rebuilt here by name (a NotImplementedError stays one: "not written yet")."""
    if type_name == "NotImplementedError":
        return NotImplementedError(message)
    return type(type_name if re.fullmatch(r"[A-Za-z_]\w{0,60}", type_name) else "Error", (Exception,), {})(message)


class Child:
    """The student's process: started with the submission's cells loaded, answering calls by name; in the
    bubblewrap sandbox (:func:`sandbox_command`) unless ``unsafe``."""

    def __init__(self, cells: list[str], *, memory_mb: int = DEFAULT_MEMORY_MB, load_timeout: float = LOAD_TIMEOUT,
                 unsafe: bool = False):
        self.memory_mb = memory_mb
        self.sandboxed = not unsafe
        self.scratch = tempfile.TemporaryDirectory(prefix="tl-grade-")  # unsafe: its working folder; else the log's
        self.log = Path(self.scratch.name) / "output.txt"
        to_child, self._write = os.pipe()
        self._read, from_child = os.pipe()
        if unsafe:
            env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "TL_"))}
            env.update(OMP_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1")
            argv, cwd = [sys.executable, "-I", "-m", "transformer_lab._grading_child", str(to_child),
                         str(from_child), str(memory_mb)], self.scratch.name
        else:
            env, cwd = {}, "/"
            argv = sandbox_command(to_child, from_child, memory_mb)
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(argv, cwd=cwd, stdin=subprocess.DEVNULL, stdout=out,
                                         stderr=subprocess.STDOUT, pass_fds=(to_child, from_child), env=env)
        os.close(to_child)
        os.close(from_child)
        self.used = 0.0  # seconds of waiting on the child in the current exercise
        self.failure: str | None = None
        reply = self._exchange(("load", cells), time.monotonic() + load_timeout, what="running the submission")
        self.names, self.cell_errors = set(reply[1]), reply[2]

    def call(self, name: str, args: tuple, kwargs: dict, budget: float, forbidden: tuple = ()) -> Any:
        """``name(*args, **kwargs)`` in the child, within what is left of ``budget`` seconds for this exercise, with
        the PyTorch operators ``forbidden`` ((operator, name) pairs, :mod:`transformer_lab.exercises.forbid`)
        raising there while it runs."""
        if self.failure:
            raise SubmissionFailed(self.failure)
        callbacks: list[Callable] = []
        message = ("call", name, encode(args, callbacks), encode(kwargs, callbacks), tuple(forbidden))
        start = time.monotonic()
        try:
            reply = self._exchange(message, start + max(budget - self.used, 0.0), what=f"{name}(...)",
                                   callbacks=callbacks)
        finally:
            self.used += time.monotonic() - start
        if reply[0] == "raised":
            if limit := _limit_hit(reply[1], reply[2], self.memory_mb):  # a fresh process for the next exercise
                self.failure = f"{limit} while {name}(...)"
                self.close()
                raise SubmissionFailed(self.failure)
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
            if self.sandboxed and code is not None and code > 128:  # bwrap exits 128 + N for a child killed by N
                code = -(code - 128)
            how = (f"was killed by signal {_signal_name(-code)}" if code is not None and code < 0 else
                   f"ended (exit code {code})")
            if self._output_bytes() >= MAX_OUTPUT_BYTES:
                how += f" after it exceeded the output limit of {MAX_OUTPUT_BYTES // 2**20} MB"
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

    def _output_bytes(self) -> int:
        try:
            return self.log.stat().st_size
        except OSError:
            return 0

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


class NotGraded(CheckResult):
    """A ✗ because the submission could not be graded on this exercise: its process ended, hung, hit a limit or
    sent something unreadable (not a wrong answer). ``check`` on a folder exits 1 when any submission has one."""


def grade(chapter: int, path: str | Path, *, timeout: float = DEFAULT_TIMEOUT, memory_mb: int = DEFAULT_MEMORY_MB,
          hidden: str | None = None, unsafe: bool = False, cells: list[str] | None = None) -> list[CheckResult]:
    """Every exercise of ``chapter`` on the functions the submission at ``path`` defines (or ``cells``, its code
    read earlier), each within ``timeout`` seconds of the student's code; the student's code runs in a child
    process in the sandbox, or without it if ``unsafe`` (see the module docstring: raises
    :class:`SandboxUnavailable` when ``bwrap`` is missing). With ``hidden`` (the instructor's key) an exercise passes
    only if it also passes its hidden cases; the key never appears in a message."""
    exercises = registry(chapter)
    cells = submission_cells(path) if cells is None else cells
    if not unsafe and not sandbox_available():
        sandbox_command(0, 0, memory_mb)  # raises SandboxUnavailable, saying what to do
    child: Child | None = None
    results = []
    try:
        for name, checker in exercises.items():
            if child is None or child.failure:  # a fresh process after a crash or a timeout
                if child is not None:
                    child.close()
                try:
                    child = Child(cells, memory_mb=memory_mb, unsafe=unsafe)
                except SubmissionFailed as exc:  # the submission itself does not load: nothing can pass
                    results += [NotGraded(n, False, str(exc)) for n in list(exercises)[len(results):]]
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
        if child is not None:
            child.close()
    if hidden:
        results = [type(r)(r.name, r.passed, r.message.replace(hidden, "[the key]")) for r in results]
    return results


def _run_checker(name: str, checker: Callable, child: Child, timeout: float) -> CheckResult:
    def student(*args, **kwargs):  # what the checker forbids while it calls (check_function) is forbidden there
        return child.call(name, args, kwargs, timeout, FORBIDDEN.get())

    student.__name__ = student.__qualname__ = name
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
    """Grade every submission in ``folder`` (``.py``, ``.ipynb``, ``.md``; the student is the file's name without
    its suffix, or with it when two files share a name) into one CSV with columns student, exercise, passed (1/0),
    message. Every file is read before any runs. Returns the rows, as written (:func:`csv_cell`). A ``csv_path``
    that cannot be written is refused before any grading."""
    folder, csv_path = Path(folder), Path(csv_path)
    if csv_path.is_dir() or not csv_path.parent.is_dir() or not os.access(csv_path.parent, os.W_OK | os.X_OK):
        raise ValueError(f"--csv: cannot write {csv_path} (give a file name in an existing, writable folder); "
                         "nothing was graded")
    paths = sorted(p for p in folder.iterdir() if p.is_file() and p.suffix in SUFFIXES)
    if not paths:
        raise ValueError(f"{folder} holds no submissions ({', '.join(SUFFIXES)} files)")
    if not unsafe and not sandbox_available():
        sandbox_command(0, 0, memory_mb)  # raises SandboxUnavailable
    stems = [p.stem for p in paths]
    read: dict[Path, list[str] | Exception] = {}
    for path in paths:  # all read first: without the sandbox, a submission could rewrite a classmate's file
        try:
            read[path] = submission_cells(path)
        except (ValueError, OSError) as exc:
            read[path] = exc
    rows, ungraded = Rows(), []
    for path in paths:
        cells = read[path]
        if isinstance(cells, Exception):
            results = [NotGraded(name, False, str(cells)) for name in registry(chapter)]
        else:
            results = grade(chapter, path, timeout=timeout, memory_mb=memory_mb, hidden=hidden, unsafe=unsafe,
                            cells=cells)
        student = path.stem if stems.count(path.stem) == 1 else path.name  # alice.py and alice.md: two rows each
        if any(isinstance(r, NotGraded) for r in results):
            ungraded.append(csv_cell(student, hidden))
        rows += [{"student": csv_cell(student, hidden), "exercise": r.name, "passed": int(r.passed),
                  "message": csv_cell(r.message, hidden)} for r in results]
    rows.ungraded = ungraded
    tmp = Path(csv_path).with_name(Path(csv_path).name + ".tmp")
    with open(tmp, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    os.replace(tmp, csv_path)
    return rows


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
