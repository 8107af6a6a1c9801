"""The student's side of grading (:mod:`transformer_lab.grading`), run in the sandbox as a standalone file

    python -I -S /sandbox/grader/_grading_child.py FD_IN FD_OUT MEMORY_MB [nproc=N] [uid=U] [path=DIR ...]

(next to it ``_wire.py`` and
``exercises/forbid.py``, the only other files of the package there), or without the sandbox (``check --unsafe``)
as ``python -I -m transformer_lab._grading_child FD_IN FD_OUT MEMORY_MB``. It adds the ``path=`` folders (the
read-only site-packages: torch, NumPy, SymPy) to ``sys.path``, gives up root for ``uid=U`` when the sandbox
started it as root, says it is ready (or that its memory limit leaves the grader too little room: then it ends
before any of the submission runs), limits its own memory, file sizes and processes, forgets the book's package (the
student's code cannot import it, nor find it among the loaded modules), runs the submission's cells (a cell that
raises is recorded and skipped, as "Run all" would show it), then answers calls by name until the grader closes the
pipe.
"""

from __future__ import annotations

import builtins
import os
import resource
import signal
import sys

if __package__:  # python -m transformer_lab._grading_child (check --unsafe)
    from transformer_lab import _wire
    from transformer_lab.exercises.forbid import forbidding
else:  # the sandbox: this file, _wire.py and forbid.py, bound read-only under /sandbox/grader
    sys.path[:0] = [os.path.dirname(os.path.abspath(__file__))] + [
        a[5:] for a in sys.argv[4:] if a.startswith("path=")]
    import _wire
    from forbid import forbidding

MAX_FILE_BYTES = 16 * 2**20  # anything the submission writes, its printed output included
HEADROOM_MB = 256  # address space the grader's own work needs above its start (messages, autograd, LAPACK)


class _NoBookPackage:
    """An import hook: ``transformer_lab`` (references and checkers included) is not importable while grading."""

    def find_spec(self, name, path=None, target=None):
        if name == "transformer_lab" or name.startswith("transformer_lab."):
            raise ImportError(f"{name} cannot be imported by a graded submission: write the answer yourself")
        return None


def _describe(exc: BaseException) -> str:
    if isinstance(exc, SystemExit):
        return f"called sys.exit({exc.code!r})"
    return str(exc)[:500]


def _drop_root(uid: int) -> None:
    """The sandbox started as root (a grader run by root): become ``uid`` (no file of ours, no capability), so that
    the process limit counts (the kernel never applies RLIMIT_NPROC to root)."""
    if os.getuid() == 0 and uid:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)


def _address_space_mb() -> int:
    """This process's address space now (VmSize), in MB: what RLIMIT_AS counts."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE") // 2**20


def _gradients(value, args: tuple, grad):
    """The gradients of ``(value * grad).sum()`` with respect to the tensor arguments that require one (``None``
    where ``value`` carries no gradient or does not depend on an argument): autograd on the student's result."""
    import torch

    inputs = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
    if not (isinstance(value, torch.Tensor) and value.requires_grad and inputs):
        return None
    return torch.autograd.grad(value, inputs, grad, allow_unused=True)


def main(fd_in: int, fd_out: int, memory_mb: int, nproc: int = 0, uid: int = 0) -> int:
    _drop_root(uid)
    started = _address_space_mb()
    if started + HEADROOM_MB > memory_mb:  # the grader's limit, not the submission's: say so before it runs
        _wire.send(fd_out, ("too_small", started, started + HEADROOM_MB))
        return 3
    _wire.send(fd_out, ("ready", started))
    memory = memory_mb * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_FSIZE, (MAX_FILE_BYTES, MAX_FILE_BYTES))
    if nproc:  # a fork bomb stops at nproc processes and threads (counted in the sandbox's user namespace)
        resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit raises OSError instead of killing
    receive, send, encode, decode = _wire.receive, _wire.send, _wire.encode, _wire.decode
    for name in [n for n in sys.modules if n in ("transformer_lab", "_wire") or n.startswith("transformer_lab.")]:
        del sys.modules[name]
    sys.meta_path.insert(0, _NoBookPackage())

    def callback(index: int):
        def grader_function(*args, **kwargs):  # a function the checker passed: it runs in the grader
            send(fd_out, ("callback", index, encode(args), encode(kwargs)))
            reply = receive(fd_in)
            if reply[0] == "raised":
                raise RuntimeError(f"{reply[1]}: {reply[2]}")
            return decode(reply[1])

        return grader_function

    namespace = {"__name__": "__main__", "__builtins__": builtins}
    while True:
        try:
            message = receive(fd_in)
        except EOFError:
            return 0
        if message[0] == "load":
            errors = []
            for i, cell in enumerate(message[1]):
                try:
                    exec(compile(cell, f"<cell {i + 1}>", "exec"), namespace)
                except BaseException as exc:  # SystemExit too: the grader decides, not the submission
                    errors.append((i, type(exc).__name__, _describe(exc)))
            names = sorted(k for k, v in namespace.items() if callable(v) and not k.startswith("__"))
            send(fd_out, ("loaded", names, errors))
        elif message[0] == "call":
            _, name, args, kwargs, forbidden, grad = message
            try:
                args, kwargs = decode(args, callback), decode(kwargs, callback)
                with forbidding(dict(forbidden)):  # the operators the exercise asks the student to write
                    value = namespace[name](*args, **kwargs)
                    if grad is not None:  # the checker asks what autograd makes of the result
                        value = (value, _gradients(value, args, decode(grad)))
                reply = ("ok", encode(value))
            except BaseException as exc:
                reply = ("raised", type(exc).__name__, _describe(exc))
            send(fd_out, reply)


if __name__ == "__main__":
    options = dict(a.split("=", 1) for a in sys.argv[4:] if a.startswith(("nproc=", "uid=")))
    raise SystemExit(main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]),
                          nproc=int(options.get("nproc", 0)), uid=int(options.get("uid", 0))))
