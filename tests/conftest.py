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
