"""bench/kvpress_probes.py end to end (`--dry-run`: the tiny random Qwen3 saved to disk, 2 samples per probe)
against the real kvpress 0.5.5 in its own virtual environment.

The invariants cannot pass by accident: at density 1.0 (compression ratio 0) every prefill-only method must
reproduce dense's answers and NLL on both sides, and kvpress's numbers must equal ours, so the two halves
agree on the samples, positions, stop rule and NLL formula; at density 0.2 the methods whose rules are the
same (SnapKV, StreamingLLM) must still agree exactly while differing from dense. The venv is built by
`python bench/kvpress_parity.py --setup-only`.
"""

from __future__ import annotations

import json

import pytest

from tests.bench.conftest import load_script
from tests.conftest import require

pytestmark = pytest.mark.slow

PREFILL_ONLY = ["snapkv", "pyramidkv", "streaming_llm", "ada_snapkv"]
TOL = 1e-4


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    script = load_script("kvpress_probes")
    require(
        script.venv_ready(script.DEFAULT_VENV),
        f"kvpress venv missing at {script.DEFAULT_VENV}: run python bench/kvpress_parity.py --setup-only",
    )
    tmp = tmp_path_factory.mktemp("kvpress-probes")
    out = {}
    for density in ("1.0", "0.2"):
        path = tmp / f"probes-{density}.json"
        script.main(["--dry-run", "--density", density, "--out", str(path)])
        out[float(density)] = json.loads(path.read_text())
    return out


def _rows(run) -> dict:
    return {r["method"]: r for r in run["rows"]}


def _samples(run, method: str) -> list[dict]:
    return [s for s in run["samples"] if s["method"] == method]


def test_pipeline_end_to_end(runs):
    run = runs[0.2]
    meta = run["meta"]
    assert meta["schema"] == "nexus-bench-kvpress-probes/1"
    assert meta["kvpress_side"]["kvpress"] == "0.5.5" and meta["kvpress_side"]["transformers"].startswith("5.2")
    assert meta["model"] == "tiny" and meta["compression_ratio"] == pytest.approx(0.8)
    rows = _rows(run)
    assert list(rows) == ["dense", *PREFILL_ONLY, "snapkv@prefill_decode", "streaming_llm@prefill_decode"]
    for method, row in rows.items():
        assert row["needle_n"] == 2 and row["nll_n"] == 2, method
        assert row["note"], method
        for s in _samples(run, method):
            if s["probe"] == "needle":
                assert isinstance(s["answer_kvpress"], str) and isinstance(s["answer_ours"], str)
            else:
                assert s["nll_kvpress"] > 0 and s["nll_ours"] > 0
        if method != "dense":  # both sides really compressed, to the same budget
            assert 0.15 < row["kept_fraction_kvpress"] < 0.25 and 0.15 < row["kept_fraction_ours"] < 0.25, method


def test_density_one_equals_dense_on_both_sides(runs):
    run = runs[1.0]
    rows = _rows(run)
    dense = {(s["probe"], s["index"]): s for s in _samples(run, "dense")}
    assert rows["dense"]["nll_max_abs_delta"] < TOL and rows["dense"]["needle_same_answer"] == 2
    for method in PREFILL_ONLY:
        row = rows[method]
        assert row["kept_fraction_kvpress"] == 1.0 and row["kept_fraction_ours"] == 1.0, method
        assert row["nll_max_abs_delta"] < TOL and row["needle_same_answer"] == row["needle_n"], method
        for s in _samples(run, method):
            d = dense[(s["probe"], s["index"])]
            if s["probe"] == "nll":
                assert abs(s["nll_kvpress"] - d["nll_kvpress"]) < TOL and abs(s["nll_ours"] - d["nll_ours"]) < TOL
            else:
                assert s["answer_kvpress"] == d["answer_kvpress"] and s["answer_ours"] == d["answer_ours"]


@pytest.mark.parametrize("method", ["snapkv", "streaming_llm"])
def test_same_rules_same_results_under_compression(runs, method):
    run = runs[0.2]
    row = _rows(run)[method]
    assert row["nll_max_abs_delta"] < TOL and row["needle_same_answer"] == row["needle_n"]
    assert row["kept_fraction_kvpress"] == pytest.approx(row["kept_fraction_ours"])
    dense = {s["index"]: s["nll_ours"] for s in _samples(run, "dense") if s["probe"] == "nll"}
    # and compression changed something (the agreement is not between two dense caches)
    assert max(abs(s["nll_ours"] - dense[s["index"]]) for s in _samples(run, method) if s["probe"] == "nll") > TOL


def test_decode_time_streaming_keeps_the_sinks_only_on_our_side(runs):
    """The documented kvpress difference: its decode-time StreamingLLMPress scores slots by index after a
    prefill gather that left them in topk order, so real sinks get evicted; nexus keeps them by position."""
    row = _rows(runs[0.2])["streaming_llm@prefill_decode"]
    assert row["sinks_kept_ours"] == 1.0
    assert row["sinks_kept_kvpress"] < 1.0
