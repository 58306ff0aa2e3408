"""bench/throughput.py: the table's ratios and estimates, and a smoke run on the tiny model (one child process)."""

from __future__ import annotations

import json

import pytest

from tests.bench.conftest import load_script


def test_table_sets_bfloat16_beside_float32_and_before_and_estimates_the_full_runs():
    bench = load_script("throughput")
    rows = [
        dict(part="probe", variant="before", results=200, seconds=400.0),
        dict(part="probe", variant="float32", results=200, seconds=100.0),
        dict(part="probe", variant="bfloat16", results=200, seconds=50.0),
        dict(part="probe_full", variant="bfloat16", results=240, seconds=60.0, samples=1),
        dict(part="replay_full", variant="bfloat16", results=110, seconds=600.0, tokens=6000),
        dict(part="sweep", variant="bfloat16", results=1760, seconds=5400.0),
    ]
    text = bench.table(rows, total_tokens=96000)
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines()[2:]]
    lines = {(c[0], c[1]): c for c in cells}
    assert lines["probe", "bfloat16"][5:7] == ["2.0x", "8.0x"]  # against float32's 0.5 s a result, before's 2 s
    assert lines["probe", "float32"][5:7] == ["", "4.0x"] and lines["probe", "before"][5:7] == ["", ""]
    assert "10.0 min (10 samples" in lines["probe_full", "bfloat16"][7]
    assert "160 min (16 tasks" in lines["replay_full", "bfloat16"][7]  # 600 s x 96000 / 6000 tokens
    assert lines["sweep", "bfloat16"][7] == "90.0 min (measured to its end)"


@pytest.mark.slow
def test_a_tiny_probe_run_is_measured_in_its_own_process_in_each_dtype(tmp_path):
    bench = load_script("throughput")
    out = tmp_path / "t.json"
    args = ["--model", "tiny", "--parts", "probe", "--samples", "1", "--processes", "1", "--out", str(out)]
    bench.main([*args, "--variants", "float32,bfloat16"])
    rows = json.loads(out.read_text())["rows"]
    assert [(r["part"], r["variant"], r["results"]) for r in rows] == [
        ("probe", "float32", 20),
        ("probe", "bfloat16", 20),
    ]
    assert all(r["seconds"] > 0 for r in rows)
    with pytest.raises(SystemExit, match="--before"):
        bench.main([*args, "--variants", "before"])
