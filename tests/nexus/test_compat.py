"""The cache on the GPU machine's transformers release (5.17: `past_key_values=`, no `cache=`).

Runs tests/nexus/test_cache.py under the interpreter environment `.ci/parts/40-transformers-5.17.sh` builds.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import require

VENV = Path(os.environ.get("NEXUS_TF517_VENV", "/opt/nexus-tf517"))
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_cache_suite_passes_on_transformers_5_17():
    python = VENV / "bin" / "python"
    require(python.exists(), f"no transformers 5.17 environment at {VENV} (run .ci/parts/40-transformers-5.17.sh)")
    version = subprocess.run(
        [python, "-c", "import transformers; print(transformers.__version__)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert version == "5.17.0"
    proc = subprocess.run(
        [
            python,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests/nexus/test_cache.py",
            "tests/nexus/test_exactness_matrix.py",
            "-k",
            "nexus or snapkv or dense or ragged or random",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    sys.stdout.write(proc.stdout[-3000:])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout
