"""bench/dtype_agreement.py and bench/sweep_table.py: what they compute from the action table's cells."""

from __future__ import annotations

import pytest

from tests.bench.conftest import load_script


def _cell(top1: float, p: float | None, tasks: int = 5, nll: float = 1.0) -> dict:
    return dict(copy_top1=top1, delta_copy_nll=nll, copy_exact=0.2, p_vs_dense=p, p_vs_snapkv=None, tasks=tasks)


def test_agreement_sets_the_dtypes_side_by_side_ranks_each_and_names_a_test_that_changes_side():
    bench = load_script("dtype_agreement")
    key = ("prefill_only", "true_eviction")
    cells = {
        (*key, None, "dense"): {"float32": _cell(0.80, None, nll=0.0), "bfloat16": _cell(0.81, None, nll=0.0)},
        (*key, 0.2, "snapkv"): {"float32": _cell(0.60, 0.03), "bfloat16": _cell(0.66, 0.07)},
        (*key, 0.2, "nexus"): {"float32": _cell(0.64, 0.01), "bfloat16": _cell(0.65, 0.01)},
        (*key, 0.2, "h2o"): {"float32": _cell(0.50, 0.01)},  # measured in one dtype only: left out
    }
    (record,) = bench.agreement(cells)
    assert [r["method"] for r in record["rows"]] == ["dense", "snapkv", "nexus"]  # dense heads its protocol's group
    assert record["ranking"] == {"float32": ["nexus", "snapkv"], "bfloat16": ["snapkv", "nexus"]}
    assert not record["same_ranking"]
    assert record["largest_copy_top1_diff"]["method"] == "snapkv"
    assert record["largest_copy_top1_diff"]["diff"] == pytest.approx(0.06)
    assert record["significance_changes"] == ["snapkv p_vs_dense: 0.03 in float32, 0.07 in bfloat16"]
    assert "| snapkv | 5/5 | 60.0 | 66.0 | +6.0 |" in bench.table([record])


def test_agreement_refuses_cells_of_different_tasks():
    bench = load_script("dtype_agreement")
    cells = {("prefill_only", "full_context", 0.2, "snapkv"): {"float32": _cell(0.6, 0.1, tasks=4),
                                                                "bfloat16": _cell(0.6, 0.1, tasks=5)}}  # fmt: skip
    with pytest.raises(SystemExit, match="4 tasks in float32, 5 in bfloat16"):
        bench.agreement(cells)


def test_the_sweep_table_puts_the_held_memory_beside_each_row_and_the_scope_change_below():
    bench = load_script("sweep_table")
    base = dict(tasks=16, spans=128, copy_top1_ci=[0.6, 0.7], delta_copy_nll=1.1, copy_exact=0.2, copy_held=0.4,
                p_vs_dense=3e-5, p_vs_snapkv=None)  # fmt: skip
    cells = [
        dict(base, method="dense", scope="prefill_only", protocol="true_eviction", density=None, copy_top1=0.82,
             held_mb=40.0),
        dict(base, method="nexus", scope="prefill_only", protocol="true_eviction", density=0.2, copy_top1=0.65,
             held_mb=8.25),
    ]  # fmt: skip
    change = dict(method="nexus", protocol="true_eviction", density=0.2, tasks=16, diff=-0.031, p=0.01, down=12)
    text = bench.markdown(dict(dtype="bfloat16", cells=cells, scope_changes=[change]))
    assert "**true_eviction, density 0.2** (bfloat16)" in text
    assert "| nexus | prefill_only | 16 | 128 | 65.0 [60-70] | +1.10 | 20.0 | 40.0 | 3e-05 | - | 8.2 |" in text
    assert "| dense | - | 16 |" in text
    assert "| true_eviction | 0.2 | nexus | 16 | -3.1 | 12/16 | 0.01 |" in text
