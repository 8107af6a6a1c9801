"""Input checks that every component shares, so that one kind of bad input gets one kind of message.

* :func:`positive_int` — a positive integer (a Python or NumPy integer, not a bool) as an ``int``, else
  ``ValueError("<name> must be a positive integer, got <value>")``;
* :func:`shape_or_type` — what an argument is, for a message: a tensor's shape, anything else its type's name.
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np
import torch

__all__ = ["positive_int", "shape_or_type"]


def positive_int(value: Any, name: str) -> int:
    """``value`` as an ``int`` if it is a positive integer (Python or NumPy; not a bool), else ValueError."""
    if not isinstance(value, numbers.Integral) or isinstance(value, bool | np.bool_) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def shape_or_type(x: Any) -> str:
    """``(2, 3)`` for a tensor of that shape, the type's name (``list``, ``float``) for anything else."""
    return str(tuple(x.shape)) if isinstance(x, torch.Tensor) else type(x).__name__
