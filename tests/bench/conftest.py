"""Load the bench scripts (plain files under bench/, not a package) as modules for in-process smoke runs."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


def load_script(name: str):
    """Import bench/<name>.py as a module (bench/ goes on sys.path: the scripts import `common`)."""
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def decode_script():
    return load_script("decode")


@pytest.fixture(scope="session")
def parity_script():
    return load_script("kvpress_parity")
