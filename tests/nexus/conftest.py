"""The nexus tests' models: the tiny random Qwen3 of tests/tiny_models.py, one float32 and one float64 per module."""

from __future__ import annotations

import pytest
import torch

from tests.tiny_models import tiny_qwen3


@pytest.fixture(scope="module")
def model32():
    return tiny_qwen3(torch.float32)


@pytest.fixture(scope="module")
def model64():
    return tiny_qwen3(torch.float64)
