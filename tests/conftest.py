"""Shared test helpers: the repository root and seeded random generators."""

from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent


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
