"""The messages between the grader and a student's process (:mod:`transformer_lab.grading`).

A message is a value written with ``torch.save`` and read with ``torch.load(weights_only=True)``, after an 8-byte
length: nothing either side sends is executed by the other. Values that ``torch.save`` cannot carry safely as
themselves travel as tagged tuples: tensors (with ``requires_grad`` and the names of the autograd nodes behind
them), NumPy arrays and scalars, tuples, dicts, SymPy expressions (as a tree of SymPy class names, rebuilt from
SymPy's own namespace only) and functions (as an index: the side that holds the function runs it).
This module imports only torch and NumPy: the student's process loads it and nothing else of the package.
"""

from __future__ import annotations

import io
import os
import select
import struct
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

MAX_MESSAGE = 256 * 2**20  # bytes in one message over the pipe


_TAG = "\x00tl:"  # the first item of a tagged tuple: a value torch.save cannot carry as itself


def encode(x: Any, callbacks: list[Callable] | None = None) -> Any:
    """``x`` as something ``torch.load(weights_only=True)`` reads back; functions are registered in
    ``callbacks`` (and sent as their index) when given, else refused."""
    if isinstance(x, torch.Tensor):
        graph = tuple(sorted(graph_names(x))) if x.grad_fn is not None else ()
        return (_TAG + "tensor", x.detach().clone().contiguous(), bool(x.requires_grad), graph)
    if isinstance(x, np.ndarray):
        if x.dtype == object or x.dtype.kind not in "biufc":
            raise TypeError(f"a NumPy array of dtype {x.dtype} cannot be sent between the processes")
        return (_TAG + "ndarray", torch.from_numpy(np.ascontiguousarray(x).copy()))
    if isinstance(x, np.generic):
        return (_TAG + "npscalar", x.dtype.str, x.item())
    if x is None or isinstance(x, bool | int | float | complex | str | bytes | torch.dtype):
        return x
    if isinstance(x, tuple | list):
        items = [encode(v, callbacks) for v in x]
        return (_TAG + "tuple", items) if isinstance(x, tuple) else items
    if isinstance(x, dict):
        return (_TAG + "dict", [(encode(k, callbacks), encode(v, callbacks)) for k, v in x.items()])
    if "sympy" in sys.modules and isinstance(x, sys.modules["sympy"].Basic):
        return (_TAG + "sympy", _sympy_tree(x))
    if isinstance(x, torch.device):
        return (_TAG + "device", str(x))
    if callable(x) and callbacks is not None:
        callbacks.append(x)
        return (_TAG + "callback", len(callbacks) - 1)
    raise TypeError(f"a {type(x).__name__} cannot be sent between the processes (send tensors, arrays, numbers, "
                    "strings, lists, tuples, dicts or SymPy expressions)")


def decode(x: Any, callback: Callable[[int], Callable] | None = None) -> Any:
    """The inverse of :func:`encode`; ``callback(i)`` makes the stand-in for function number ``i``."""
    if isinstance(x, list):
        return [decode(v, callback) for v in x]
    if not (isinstance(x, tuple) and x and isinstance(x[0], str) and x[0].startswith(_TAG)):
        return x
    kind, rest = x[0][len(_TAG):], x[1:]
    if kind == "tensor":
        t, requires_grad, graph = rest
        if requires_grad and (t.is_floating_point() or t.is_complex()):
            t.requires_grad_()
        if graph:
            t.grading_graph = frozenset(graph)  # the child's autograd node names (see exercises.ch1)
        return t
    if kind == "ndarray":
        return rest[0].numpy()
    if kind == "npscalar":
        return np.dtype(rest[0]).type(rest[1])
    if kind == "tuple":
        return tuple(decode(v, callback) for v in rest[0])
    if kind == "dict":
        return {decode(k, callback): decode(v, callback) for k, v in rest[0]}
    if kind == "sympy":
        return _sympy_build(rest[0])
    if kind == "device":
        return torch.device(rest[0])
    if kind == "callback" and callback is not None:
        return callback(int(rest[0]))
    raise ValueError(f"unreadable value in a message (kind {kind!r})")


def graph_names(t: torch.Tensor) -> set[str]:
    """The names of the autograd nodes that produced ``t`` (``type(node).__name__``, e.g. ``MmBackward0``)."""
    seen, todo, names = set(), [t.grad_fn], set()
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        names.add(type(node).__name__)
        todo.extend(n for n, _ in node.next_functions)
    return names


def _sympy_tree(e) -> tuple:
    import sympy
    from sympy.core.function import AppliedUndef

    if isinstance(e, sympy.Symbol):
        return ("S", e.name, {k: bool(v) for k, v in e.assumptions0.items() if v is not None})
    if isinstance(e, sympy.Integer):
        return ("I", int(e))
    if isinstance(e, sympy.Rational):
        return ("Q", int(e.p), int(e.q))
    if isinstance(e, sympy.Float):
        return ("F", str(e))
    if isinstance(e, AppliedUndef):
        return ("U", e.func.__name__, [_sympy_tree(a) for a in e.args])
    if not e.args and getattr(sympy.S, type(e).__name__, None) is e:
        return ("C", type(e).__name__)  # a singleton: pi, E, oo, I, zoo, nan ...
    return ("A", type(e).__name__, [_sympy_tree(a) for a in e.args])


def _sympy_build(tree):
    import sympy

    kind, *rest = tree
    if kind == "S":
        return sympy.Symbol(str(rest[0]), **{str(k): bool(v) for k, v in rest[1].items()})
    if kind == "I":
        return sympy.Integer(int(rest[0]))
    if kind == "Q":
        return sympy.Rational(int(rest[0]), int(rest[1]))
    if kind == "F":
        return sympy.Float(str(rest[0]))
    if kind == "U":
        return sympy.Function(str(rest[0]))(*(_sympy_build(a) for a in rest[1]))
    if kind == "C":
        value = getattr(sympy.S, str(rest[0]), None)
        if isinstance(value, sympy.Basic):
            return value
    if kind == "A":
        cls = _sympy_class(str(rest[0]))
        return cls(*(_sympy_build(a) for a in rest[1]))
    raise ValueError(f"unreadable SymPy expression (node {kind!r})")


def _sympy_class(name: str) -> type:
    """A SymPy class by name, from SymPy's own namespace only (never an arbitrary callable)."""
    import sympy
    from sympy.functions.elementary.piecewise import ExprCondPair

    cls = {"ExprCondPair": ExprCondPair}.get(name, getattr(sympy, name, None))
    if not (isinstance(cls, type) and issubclass(cls, sympy.Basic)):
        raise ValueError(f"the answer holds a SymPy object of an unknown kind ({name})")
    return cls


def send(fd: int, message: Any) -> None:
    buf = io.BytesIO()
    torch.save(message, buf)
    data = buf.getvalue()
    os.write(fd, struct.pack("<Q", len(data)))
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def receive(fd: int, deadline: float | None = None) -> Any:
    """One message; ``TimeoutError`` past ``deadline`` (time.monotonic()), ``EOFError`` when the pipe closed."""
    size = struct.unpack("<Q", _read(fd, 8, deadline))[0]
    if size > MAX_MESSAGE:
        raise ValueError(f"a message of {size:,} bytes (at most {MAX_MESSAGE:,})")
    return torch.load(io.BytesIO(_read(fd, size, deadline)), weights_only=True)


def _read(fd: int, n: int, deadline: float | None) -> bytes:
    chunks, left = [], n
    while left:
        if deadline is not None:
            wait = deadline - time.monotonic()
            if wait <= 0 or not select.select([fd], [], [], wait)[0]:
                raise TimeoutError
        chunk = os.read(fd, min(left, 2**20))
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)
