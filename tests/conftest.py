"""Shared test helpers: the repository root and seeded random generators."""

import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
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
    """``checker`` must reject ``fn`` with a message containing every one of ``fragments``."""
    result = checker(fn)
    assert not result.passed, f"{checker.__name__} accepted a wrong answer"
    for fragment in fragments:
        assert fragment in result.message, result.message
    return result
