"""A `matrix(keep=K)` test runs K of its cells per run, drawn with a printed seed: the same seed keeps the same
cells, `--matrix-full` keeps them all, and `matrix(always=True)` cells always run (tests/conftest.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CELLS = """
import pytest

@pytest.mark.parametrize("n", [pytest.param(n, marks=pytest.mark.matrix(keep=3)) for n in range(10)]
                         + [pytest.param(99, marks=pytest.mark.matrix(always=True))])
def test_cell(n):
    pass
"""


def _kept(tmp_path: Path, *flags: str) -> tuple[list[str], str]:
    target = ROOT / "tests" / f"_matrix_probe_{tmp_path.name}.py"
    target.write_text(CELLS)
    try:
        out = subprocess.run(
            [sys.executable, "-m", "pytest", str(target), "--collect-only", "-q", "-p", "no:cacheprovider", *flags],
            capture_output=True, text=True, cwd=ROOT, check=False,
        )  # fmt: skip
    finally:
        target.unlink()
    return sorted(
        line.split("[")[1].rstrip("]") for line in out.stdout.splitlines() if "::test_cell[" in line
    ), out.stdout


def test_a_matrix_keeps_a_seeded_sample_and_its_always_cells(tmp_path):
    sampled, _ = _kept(tmp_path, "--matrix-seed", "7")
    full, _ = _kept(tmp_path, "--matrix-full")
    assert len(sampled) == 4 and "99" in sampled  # keep=3 of the ten, and the always cell
    assert len(full) == 11 and set(sampled) < set(full)


def test_same_named_matrices_in_two_files_keep_their_own_samples(tmp_path):
    """Cells are grouped by test (file and function), not by function name: two files' ``test_cell`` matrices
    each keep their own K (they were one group of 20 keeping 3)."""
    targets = [ROOT / "tests" / f"_matrix_probe_{tmp_path.name}_{side}.py" for side in ("a", "b")]
    for target in targets:
        target.write_text(CELLS)
    try:
        out = subprocess.run(
            [sys.executable, "-m", "pytest", *map(str, targets), "--collect-only", "-q", "-p", "no:cacheprovider"],
            capture_output=True, text=True, cwd=ROOT, check=False,
        )  # fmt: skip
    finally:
        for target in targets:
            target.unlink()
    kept = [sum(f"{t.name}::test_cell[" in line for line in out.stdout.splitlines()) for t in targets]
    assert kept == [4, 4], out.stdout
