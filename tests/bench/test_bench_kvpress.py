"""bench/kvpress_parity.py at a tiny size, against the real kvpress 0.5.5 in its own virtual environment.

Where the two libraries implement the same rule (SnapKV, StreamingLLM) the kept sets must be identical and
the next-token logits equal to float rounding; where they deliberately differ (PyramidKV's window inside
the schedule, Ada-KV's allocation formula) the overlap is high but not total. The venv is built by
`.ci/parts/50-kvpress.sh` (`python bench/kvpress_parity.py --setup-only`).
"""

from __future__ import annotations

import json

import pytest

from tests.conftest import require

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def parity(parity_script, tmp_path_factory):
    require(
        parity_script.venv_ready(parity_script.DEFAULT_VENV),
        f"kvpress venv missing at {parity_script.DEFAULT_VENV}: run python bench/kvpress_parity.py --setup-only",
    )
    out = tmp_path_factory.mktemp("parity") / "parity.json"
    parity_script.main(["--tokens", "2048", "--layers", "2", "--repeats", "1", "--threads", "1", "--out", str(out)])
    return json.loads(out.read_text())


def test_schema_is_stable(parity):
    meta = parity["meta"]
    assert meta["schema"] == "nexus-bench-kvpress-parity/1"
    assert meta["kvpress_side"]["kvpress"] == "0.5.5" and meta["kvpress_side"]["transformers"].startswith("5.2")
    assert meta["budget_tokens"] == int(2048 * (1 - 0.8))
    assert [r["method"] for r in parity["rows"]] == ["snapkv", "pyramidkv", "streaming_llm", "ada_snapkv"]
    for row in parity["rows"]:
        assert len(row["jaccard_per_layer"]) == 2 and len(row["jaccard_per_layer_head"][0]) == 4
        assert {"max_abs", "rel_l2", "top1_equal"} <= set(row["logits_nexus_vs_kvpress"])
        assert row["compress_s_nexus"] > 0 and row["compress_s_kvpress"] > 0


def test_same_weights_same_dense_logits(parity):
    assert parity["meta"]["dense_next_logits_nexus_vs_kvpress"]["max_abs"] < 1e-4


@pytest.mark.parametrize("method", ["snapkv", "streaming_llm"])
def test_identical_rules_keep_identical_sets(parity, method):
    row = next(r for r in parity["rows"] if r["method"] == method)
    assert row["jaccard_min"] == 1.0
    assert row["logits_nexus_vs_kvpress"]["max_abs"] < 1e-4
    # and compression really changed the logits (the comparison is not between two dense caches)
    assert row["logits_nexus_vs_dense"]["max_abs"] > 1e-3


def test_documented_differences_stay_small(parity):
    rows = {r["method"]: r for r in parity["rows"]}
    assert rows["ada_snapkv"]["jaccard_mean"] > 0.9
    assert rows["pyramidkv"]["recall_mean"] > 0.9
