"""bench/replay.py at a smoke size: chunked and token-by-token replay agree, and the table's fields are there."""

from __future__ import annotations

import json

import pytest

from tests.bench.conftest import load_script


@pytest.mark.slow
def test_replay_bench_smoke(tmp_path):
    out = tmp_path / "replay.json"
    payload = load_script("replay").main(
        [
            "--turns",
            "2",
            "--new-tokens",
            "40",
            "--methods",
            "dense,snapkv",
            "--protocols",
            "true_eviction",
            "--out",
            str(out),
        ]
    )
    assert json.loads(out.read_text())["rows"] == payload["rows"]
    dense, snapkv = payload["rows"]
    assert dense["delta_nll"] == 0.0 and snapkv["delta_nll"] is not None
    assert snapkv["tokens"] == dense["tokens"] == 80
    assert all(r["max_logit_gap"] < 1e-4 for r in payload["rows"])  # fp32: chunks equal single tokens
    assert snapkv["forwards_chunked"] > 2  # decode-time events split the completions into several chunks
    assert snapkv["eviction_events"] > dense["eviction_events"] == 0
