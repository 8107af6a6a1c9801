"""The student's process for grading (:mod:`transformer_lab.grading`): the bubblewrap sandbox that starts it and the
:class:`Child` that talks to it.

The child runs in a bubblewrap sandbox (``bwrap``, :func:`sandbox_command`): its own mount, PID, network, IPC
and UTS namespaces, a clean environment, read-only Python and site-packages with the book's package hidden, one
writable tmpfs folder, and limits on memory (RLIMIT_AS), output and file size (RLIMIT_FSIZE) and processes
(RLIMIT_NPROC), each named in its ✗. Its standard output and error go to a log file of its own, never the grader's
(and in its PID namespace no process of the grader is visible, so ``/proc/<ppid>/fd/1`` is that log too).

A child first starts (Python, torch) and says it is ready; only then does the submission run. So a failure before
that is the grader's, never the submission's: a memory limit too small for the grader's own process raises
:class:`GraderLimit`, with the numbers, instead of a ✗ that blames the student. The time the submission's cells take
to run is measured from that point (:attr:`Child.load_seconds`), apart from the grader's start.
"""

from __future__ import annotations

import contextlib
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

from transformer_lab._wire import TooLarge, decode, encode, receive, send

DEFAULT_MEMORY_MB = 4096  # the child's address-space limit (torch itself maps about 1 GiB)
LOAD_TIMEOUT = 120.0  # seconds to run the submission's cells (a whole chapter notebook takes < 60 s)
STARTUP_TIMEOUT = 60.0  # seconds for the child to start Python and torch, before any of the submission runs
MAX_OUTPUT_BYTES = 16 * 2**20  # printed output and each file written (_grading_child.MAX_FILE_BYTES)
MAX_PROCESSES = 64  # processes and threads of one submission (RLIMIT_NPROC in its user namespace)
SCRATCH_BYTES = 64 * 2**20  # the sandbox's one writable folder, a tmpfs
SANDBOX_MISSING = ("bwrap (bubblewrap) is not installed, so a submission cannot be sandboxed: install it "
                   "(apt-get install bubblewrap), or pass --unsafe to grade without the sandbox")


class SandboxUnavailable(RuntimeError):
    """``bwrap`` (bubblewrap) is not installed: grading for marks refuses to run without it (see ``unsafe``)."""


class GraderLimit(ValueError):
    """The grader's own process could not start within its limits (e.g. ``--memory-mb`` too small for Python and
    torch): a fault of the grader's settings, not of any submission, so nothing is graded."""


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
        raise SandboxUnavailable(SANDBOX_MISSING)
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


class SubmissionFailed(Exception):
    """The child did not answer a call: it ended, ran out of time, or sent something unreadable."""


def _raised(type_name: str, message: str) -> BaseException:
    """The student's exception, rebuilt here by name (a NotImplementedError stays one: "not written yet")."""
    if type_name == "NotImplementedError":
        return NotImplementedError(message)
    return type(type_name if re.fullmatch(r"[A-Za-z_]\w{0,60}", type_name) else "Error", (Exception,), {})(message)



class Child:
    """The student's process: started, then the submission's cells loaded, answering calls by name; in the
    bubblewrap sandbox (:func:`sandbox_command`) unless ``unsafe``. ``load_seconds``: how long the cells took."""

    def __init__(self, cells: list[str], *, memory_mb: int = DEFAULT_MEMORY_MB, load_timeout: float = LOAD_TIMEOUT,
                 unsafe: bool = False):
        self.memory_mb = memory_mb
        self.sandboxed = not unsafe
        self.scratch = tempfile.TemporaryDirectory(prefix="tl-grade-")  # unsafe: its working folder; else the log's
        self.log = Path(self.scratch.name) / "output.txt"
        self.used = 0.0  # seconds of waiting on the child in the current exercise
        self.failure: str | None = None
        self.load_seconds = 0.0
        self._start(unsafe)
        self._wait_ready()
        start = time.monotonic()
        try:
            reply = self._exchange(("load", cells), start + load_timeout, what="running the submission")
        finally:
            self.load_seconds = time.monotonic() - start
        self.names, self.cell_errors = set(reply[1]), reply[2]

    def _start(self, unsafe: bool) -> None:
        to_child, self._write = os.pipe()
        self._read, from_child = os.pipe()
        if unsafe:
            env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "TL_"))}
            env.update(OMP_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1")
            argv, cwd = [sys.executable, "-I", "-m", "transformer_lab._grading_child", str(to_child),
                         str(from_child), str(self.memory_mb)], self.scratch.name
        else:
            env, cwd = {}, "/"
            argv = sandbox_command(to_child, from_child, self.memory_mb)
        with open(self.log, "wb") as out:  # its stdout and stderr: this log, never the grader's
            self.proc = subprocess.Popen(argv, cwd=cwd, stdin=subprocess.DEVNULL, stdout=out,
                                         stderr=subprocess.STDOUT, pass_fds=(to_child, from_child), env=env)
        os.close(to_child)
        os.close(from_child)

    def _wait_ready(self) -> None:
        """The child's first message, before any of the submission runs: ready, or its memory limit too small."""
        try:
            reply = receive(self._read, time.monotonic() + STARTUP_TIMEOUT)
        except Exception as exc:
            why = (f"it took longer than {STARTUP_TIMEOUT:g} s" if isinstance(exc, TimeoutError) else
                   f"its process {self._how_it_ended()}" if isinstance(exc, EOFError) else repr(exc))
            why += self._output_tail()
            self.close()
            raise GraderLimit(f"the grader could not start its process for the submission ({why}), before any "
                              "of the submission ran: a fault of the grader or its settings (--memory-mb "
                              f"{self.memory_mb}), not of the submission; nothing was graded") from None
        if reply[0] == "too_small":
            self.close()
            raise GraderLimit(f"--memory-mb {self.memory_mb} is too small for the grader itself: its process for "
                              f"the submission takes {reply[1]:,} MB of address space (Python, torch, NumPy) before "
                              f"any of the submission runs; give at least {reply[2]:,} MB (the default is "
                              f"{DEFAULT_MEMORY_MB} MB); nothing was graded")
        if reply[0] != "ready":
            self.close()
            raise GraderLimit(f"the grader's process for the submission started with {reply[0]!r}, not 'ready'")

    def call(self, name: str, args: tuple, kwargs: dict, budget: float, forbidden: tuple = (), *,
             grad: Any = None) -> Any:
        """``name(*args, **kwargs)`` in the child, within what is left of ``budget`` seconds for this exercise, with
        the PyTorch operators ``forbidden`` ((operator, name) pairs, :mod:`transformer_lab.exercises.forbid`)
        raising there while it runs. With ``grad`` (a tensor like the result), returns ``(result, gradients)``: the
        gradients of ``(result * grad).sum()`` with respect to the tensor arguments that require one, computed by
        autograd in the child (``None`` for each one the result does not depend on; ``None`` for all if the result
        carries no gradient)."""
        if self.failure:
            raise SubmissionFailed(self.failure)
        callbacks: list[Callable] = []
        message = ("call", name, encode(args, callbacks), encode(kwargs, callbacks), tuple(forbidden),
                   None if grad is None else encode(grad))
        start = time.monotonic()
        try:
            reply = self._exchange(message, start + max(budget - self.used, 0.0), what=f"{name}(...)",
                                   callbacks=callbacks)
        finally:
            self.used += time.monotonic() - start
        if reply[0] == "raised":
            if limit := _limit_hit(reply[1], reply[2], self.memory_mb):  # a fresh process for the next exercise
                self._fail(f"{limit} while {name}(...)")
            raise _raised(reply[1], reply[2])
        try:
            return decode(reply[1])
        except Exception as exc:  # TooLarge, or something encode never sends
            self._fail(f"the submission's reply to {name}(...) was refused: {exc}")

    def _fail(self, failure: str):
        self.failure = failure
        self.close()
        raise SubmissionFailed(failure)

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
            failure = f"took longer than its time limit while {what}; the process was stopped"
        except (EOFError, BrokenPipeError):
            failure = f"the submission's process {self._how_it_ended()} while {what}" + self._output_tail()
        except TooLarge as exc:
            failure = (f"the submission's process sent an unreadable message while {what} (over the grader's "
                       f"limits: {exc})")
        except Exception as exc:  # unreadable: the child wrote to our pipe itself
            failure = f"the submission's process sent an unreadable message while {what} ({exc})"
        self._fail(failure)

    def _how_it_ended(self) -> str:
        code = self._wait()
        if self.sandboxed and code is not None and code > 128:  # bwrap exits 128 + N for a child killed by N
            code = -(code - 128)
        how = (f"was killed by signal {_signal_name(-code)}" if code is not None and code < 0 else
               f"ended (exit code {code})")
        if self._output_bytes() >= MAX_OUTPUT_BYTES:
            how += f" after it exceeded the output limit of {MAX_OUTPUT_BYTES // 2**20} MB"
        return how

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
