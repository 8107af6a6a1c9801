"""Shared test helpers: the repository root and seeded random generators.

The suite runs on a loaded two-core machine, its tests in parallel (pytest-xdist): torch.compile's inductor builds
its kernels in the test's own process (``TORCHINDUCTOR_COMPILE_THREADS=1``, inherited by the commands the tests
start) instead of a pool of worker processes, so that no test depends on a free core or on starting threads.
"""

import os
import sys
import tempfile
from pathlib import Path

import pytest
import torch

from transformer_lab.train import compile_cache_dir

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
# the tests' compiled kernels apart from the user's, one folder per CPU kernel set (see compile_cache_dir)
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(compile_cache_dir(Path(tempfile.gettempdir()) / "tl-inductor")))
sys.path.insert(0, str(ROOT / "tools"))  # the build tools are tested too

NOTEBOOK_HEADER = """---
jupytext:
  text_representation:
    extension: .md
    format_name: myst
kernelspec:
  display_name: Python 3
  language: python
  name: python3
---
"""
"""The front matter that makes a MyST-Markdown page a notebook (jupytext)."""


@pytest.fixture
def root() -> Path:
    return ROOT


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def assert_rejected(checker, fn, *fragments: str):
    """``checker`` must reject ``fn`` with a message containing every one of ``fragments``; a fragment written
    ``"!text"`` must NOT appear (a hint that would blame the wrong mistake)."""
    result = checker(fn)
    assert not result.passed, f"{checker.__name__} accepted a wrong answer"
    for fragment in fragments:
        if fragment.startswith("!"):
            assert fragment[1:] not in result.message, result.message
        else:
            assert fragment in result.message, result.message
    return result


def wrong_answers(catalogue: dict) -> list:
    """Parameters ``(name, wrong_fn, fragments)`` for every typical wrong answer in a chapter's ``CATALOGUE``
    (``{exercise: {"wrong": [(fn, [message fragments]), ...], "right": [fn, ...]}}``)."""
    return [pytest.param(name, fn, words, id=f"{name}-wrong{i}")
            for name, entry in catalogue.items() for i, (fn, words) in enumerate(entry["wrong"])]


def right_answers(catalogue: dict) -> list:
    """Parameters ``(name, fn)`` for every correct alternative (another style than the solution's) in a
    chapter's ``CATALOGUE``."""
    return [pytest.param(name, fn, id=f"{name}-right{i}")
            for name, entry in catalogue.items() for i, fn in enumerate(entry["right"])]


def assert_accepted(checker, fn):
    """``checker`` must accept ``fn``, a correct answer written in another style than the solution."""
    result = checker(fn)
    assert result.passed, f"{checker.__name__} rejected a correct answer: {result.message}"
    return result
