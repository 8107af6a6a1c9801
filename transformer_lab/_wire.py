"""The messages between the grader and a student's process (:mod:`transformer_lab.grading`).

A message is a value written with ``torch.save`` and read with ``torch.load(weights_only=True)``, after an 8-byte
length: nothing either side sends is executed by the other. Values that ``torch.save`` cannot carry safely as
themselves travel as tagged tuples: tensors (with ``requires_grad``), NumPy arrays and scalars, tuples, dicts, CPU
random generators (their state: the receiver draws from a copy, so the sender's does not advance), SymPy
expressions (as a tree of SymPy class names, rebuilt from SymPy's own namespace only) and functions (as an index:
the side that holds the function runs it).

The grader reads what the student's process sends within limits of size and of work (:class:`TooLarge`, each limit
named in its message): the message's bytes (``MAX_MESSAGE``) and its pickle (``MAX_PICKLE``), stored, never
compressed, entries (``torch.save`` never compresses, so a small reply cannot inflate), the values a decoded reply
holds (``MAX_ITEMS``, a value shared many times counted each time it is reached, ``MAX_BYTES`` of tensors and
strings, ``MAX_DEPTH``), integers of at most ``MAX_INT_BITS`` bits, dense contiguous CPU tensors only, and SymPy
trees of at most ``MAX_SYMPY_NODES`` nodes, whose rebuilding (SymPy evaluates as it builds) stays cheap: a power
with a numeric exponent beyond ``MAX_EXPONENT``, or a function (``factorial``, ``Sum``'s limits ...) of an integer
beyond ``MAX_FUNCTION_INT``, is refused, not evaluated.
This module imports only torch and NumPy: the student's process loads it and nothing else of the package.
"""

from __future__ import annotations

import io
import os
import select
import struct
import sys
import time
import zipfile
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

MAX_MESSAGE = 64 * 2**20  # bytes in one message over the pipe
MAX_PICKLE = 8 * 2**20  # bytes of its pickle (data.pkl); tensors' bytes are stored beside it
MAX_ITEMS = 1_000_000  # values in one decoded message (a value reached twice counts twice)
MAX_BYTES = 256 * 2**20  # bytes of tensors, arrays and strings in one decoded message (counted the same way)
MAX_DEPTH = 100  # nesting of lists, tuples, dicts and SymPy trees
MAX_INT_BITS = 4096  # an integer, a SymPy integer or rational's numerator and denominator, before and after building
MAX_SYMPY_NODES = 10_000  # nodes of one SymPy expression
MAX_EXPONENT = 1000  # |exponent| of a SymPy power with a numeric exponent (3**(10**9) is not computed)
MAX_FUNCTION_INT = 1000  # |n| of an integer argument of a SymPy function other than +, *, ** and comparisons


class TooLarge(ValueError):
    """A message over one of the limits on size or work above; the message names it."""


_TAG = "\x00tl:"  # the first item of a tagged tuple: a value torch.save cannot carry as itself


def encode(x: Any, callbacks: list[Callable] | None = None) -> Any:
    """``x`` as something ``torch.load(weights_only=True)`` reads back; functions are registered in
    ``callbacks`` (and sent as their index) when given, else refused."""
    if isinstance(x, torch.Tensor):
        return (_TAG + "tensor", x.detach().clone().contiguous(), bool(x.requires_grad))
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
    if isinstance(x, torch.Generator) and x.device.type == "cpu":  # the receiver gets a generator in this state
        return (_TAG + "generator", x.get_state())
    if callable(x) and callbacks is not None:
        callbacks.append(x)
        return (_TAG + "callback", len(callbacks) - 1)
    raise TypeError(f"a {type(x).__name__} cannot be sent between the processes (send tensors, arrays, numbers, "
                    "strings, lists, tuples, dicts or SymPy expressions)")


def decode(x: Any, callback: Callable[[int], Callable] | None = None) -> Any:
    """The inverse of :func:`encode`, within the limits of the module docstring (:class:`TooLarge`);
    ``callback(i)`` makes the stand-in for function number ``i``."""
    return _Decoder(callback).value(x, 0)


class _Decoder:
    """One message's decoding, counting its items and bytes against the limits."""

    def __init__(self, callback):
        self.callback, self.items, self.bytes, self.nodes = callback, 0, 0, 0

    def count(self, n_bytes: int = 0, depth: int = 0) -> None:
        self.items += 1
        self.bytes += n_bytes
        if self.items > MAX_ITEMS:
            raise TooLarge(f"the reply holds more than {MAX_ITEMS:,} values (each shared one counted each time)")
        if self.bytes > MAX_BYTES:
            raise TooLarge(f"the reply holds more than {MAX_BYTES // 2**20} MB of tensors and strings")
        if depth > MAX_DEPTH:
            raise TooLarge(f"the reply is nested more than {MAX_DEPTH} levels deep")

    def value(self, x: Any, depth: int) -> Any:
        if isinstance(x, list):
            self.count(depth=depth)
            return [self.value(v, depth + 1) for v in x]
        if not (isinstance(x, tuple) and x and isinstance(x[0], str) and x[0].startswith(_TAG)):
            return self.leaf(x, depth)
        kind, rest = x[0][len(_TAG):], x[1:]
        if kind == "tuple":
            self.count(depth=depth)
            return tuple(self.value(v, depth + 1) for v in rest[0])
        if kind == "dict":
            self.count(depth=depth)
            return {self.value(k, depth + 1): self.value(v, depth + 1) for k, v in rest[0]}
        if kind == "tensor":
            t = self.tensor(rest[0], depth)
            if rest[1] and (t.is_floating_point() or t.is_complex()):
                t.requires_grad_()
            return t
        if kind == "ndarray":
            return self.tensor(rest[0], depth).numpy()
        if kind == "npscalar":
            return self.npscalar(rest[0], rest[1], depth)
        if kind == "sympy":
            self.nodes = 0
            return self.sympy(rest[0], depth)
        if kind == "device":
            return torch.device(str(rest[0]))
        if kind == "generator":
            state = self.tensor(rest[0], depth)
            if state.dtype != torch.uint8:
                raise ValueError("unreadable value in a message (a generator state that is not bytes)")
            return torch.Generator().set_state(state)
        if kind == "callback" and self.callback is not None:
            return self.callback(int(rest[0]))
        raise ValueError(f"unreadable value in a message (kind {kind!r})")

    def leaf(self, x: Any, depth: int) -> Any:
        if not (x is None or isinstance(x, bool | int | float | complex | str | bytes | torch.dtype)):
            raise ValueError(f"unreadable value in a message (a bare {type(x).__name__})")
        self.count(len(x) if isinstance(x, str | bytes) else 0, depth)
        if isinstance(x, int) and x.bit_length() > MAX_INT_BITS:
            raise TooLarge(f"the reply holds an integer of {x.bit_length():,} bits (at most {MAX_INT_BITS})")
        return x

    def tensor(self, t: Any, depth: int) -> torch.Tensor:
        if not isinstance(t, torch.Tensor) or type(t) is not torch.Tensor:
            raise ValueError("unreadable value in a message (not a plain tensor)")
        if t.layout != torch.strided or t.device.type != "cpu" or t.is_quantized or not t.is_contiguous():
            raise ValueError("unreadable value in a message (a tensor that is not dense, contiguous and on the "
                             "CPU, as every tensor sent is)")
        self.count(t.numel() * t.element_size(), depth)
        return t

    def npscalar(self, dtype: Any, item: Any, depth: int) -> np.generic:
        kind = np.dtype(str(dtype))
        if kind.kind not in "biufc" or kind.itemsize > 16:
            raise ValueError(f"unreadable value in a message (a NumPy scalar of dtype {kind})")
        return kind.type(self.leaf(item, depth))

    def sympy(self, tree: Any, depth: int):
        self.nodes += 1
        if self.nodes > MAX_SYMPY_NODES:
            raise TooLarge(f"the reply holds a SymPy expression of more than {MAX_SYMPY_NODES:,} nodes")
        self.count(depth=depth)
        if not (isinstance(tree, tuple) and tree):
            raise ValueError("unreadable SymPy expression")
        kind, rest = tree[0], tree[1:]
        if kind in ("A", "U"):
            args = [self.sympy(a, depth + 1) for a in rest[1]]
            return _sympy_node(kind, str(rest[0]), args)
        if kind in ("I", "Q"):
            for n in rest:
                self.leaf(n, depth)
        return _sympy_build(tree)


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
    """A leaf of a SymPy tree (a symbol, a number, a singleton); :meth:`_Decoder.sympy` builds the nodes."""
    import sympy

    kind, *rest = tree
    if kind == "S":
        return sympy.Symbol(str(rest[0]), **{str(k): bool(v) for k, v in dict(rest[1]).items()})
    if kind == "I":
        return sympy.Integer(int(rest[0]))
    if kind == "Q":
        return sympy.Rational(int(rest[0]), int(rest[1]))
    if kind == "F" and len(str(rest[0])) <= 100:
        return sympy.Float(str(rest[0]))
    if kind == "C":
        value = getattr(sympy.S, str(rest[0]), None)
        if isinstance(value, sympy.Basic):
            return value
    raise ValueError(f"unreadable SymPy expression (node {kind!r})")


def _sympy_node(kind: str, name: str, args: list):
    """``name(*args)``, a SymPy class or an undefined function, refused where building it would be costly."""
    import sympy

    if kind == "U":
        return sympy.Function(name)(*args)
    cls = _sympy_class(name)
    _check_cost(cls, args)
    node = cls(*args)
    if isinstance(node, sympy.Rational) and max(abs(node.p), node.q).bit_length() > MAX_INT_BITS:
        raise TooLarge(f"the reply's SymPy expression evaluates to a number of more than {MAX_INT_BITS} bits")
    return node


def _check_cost(cls: type, args: list) -> None:
    """Raise :class:`TooLarge` where SymPy would compute a huge number to build ``cls(*args)``."""
    import sympy
    from sympy.logic.boolalg import Boolean

    if cls is sympy.Pow and len(args) == 2 and args[1].is_Number and args[1].is_finite:
        base, exponent = args
        bits = max(abs(base.p), base.q).bit_length() * abs(float(exponent)) if base.is_Rational else 0
        if abs(exponent) > MAX_EXPONENT or bits > MAX_INT_BITS:
            raise TooLarge(f"the reply's SymPy expression holds a power with exponent {_short(exponent)}, beyond "
                           f"what the grader evaluates (exponents up to ±{MAX_EXPONENT}, results up to "
                           f"{MAX_INT_BITS} bits)")
    if cls in (sympy.Add, sympy.Mul):
        bits = sum(a.p.bit_length() + a.q.bit_length() for a in args if a.is_Rational)
        if bits > 4 * MAX_INT_BITS:
            raise TooLarge(f"the reply's SymPy expression holds a {cls.__name__} of numbers of {bits:,} bits in all, "
                           f"more than the {4 * MAX_INT_BITS} the grader evaluates")
    if cls in (sympy.Add, sympy.Mul, sympy.Pow, sympy.Tuple) or issubclass(cls, Boolean | sympy.MatrixBase):
        return  # arithmetic, comparisons and containers: no other computation on their numbers
    for a in [*args, *(b for t in args if isinstance(t, sympy.Tuple) for b in t.args)]:  # Sum's (k, 1, n) too
        if a.is_Integer and abs(a) > MAX_FUNCTION_INT:
            raise TooLarge(f"the reply's SymPy expression applies {cls.__name__} to the integer {_short(a)}, beyond "
                           f"the ±{MAX_FUNCTION_INT} the grader evaluates")


def _short(n) -> str:
    text = str(n)
    return text if len(text) <= 20 else f"{text[:8]}…({len(text)} digits)"


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
    """One message; ``TimeoutError`` past ``deadline`` (time.monotonic()), ``EOFError`` when the pipe closed,
    :class:`TooLarge` over a limit on its size."""
    size = struct.unpack("<Q", _read(fd, 8, deadline))[0]
    if size > MAX_MESSAGE:
        raise TooLarge(f"a message of {size:,} bytes (at most {MAX_MESSAGE:,})")
    data = _read(fd, size, deadline)
    _check_archive(data)
    return torch.load(io.BytesIO(data), weights_only=True)


def _check_archive(data: bytes) -> None:
    """Refuse an archive that would grow as it is read: a compressed entry, sizes beyond the message's, a pickle
    over ``MAX_PICKLE`` bytes (``torch.save`` writes stored entries, so none of this happens to an honest one)."""
    try:
        entries = zipfile.ZipFile(io.BytesIO(data)).infolist()
    except (zipfile.BadZipFile, ValueError, OSError) as exc:
        raise ValueError(f"not a torch.save archive ({exc})") from exc
    if any(e.compress_type != zipfile.ZIP_STORED for e in entries):
        raise TooLarge("a compressed message (torch.save never compresses; it could inflate past any limit)")
    if sum(e.file_size for e in entries) > len(data):
        raise TooLarge("a message whose entries claim more bytes than it holds")
    if any(e.filename.endswith("data.pkl") and e.file_size > MAX_PICKLE for e in entries):
        raise TooLarge(f"a message whose pickle is over {MAX_PICKLE // 2**20} MB")


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
