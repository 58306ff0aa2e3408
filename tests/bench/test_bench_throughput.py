"""bench/throughput.py: the table's ratios and estimates, and a smoke run on the tiny model (one child process)."""

from __future__ import annotations

import json

import pytest

from tests.bench.conftest import load_script


def test_table_sets_each_variant_against_before_and_estimates_the_full_runs():
    bench = load_script("throughput")
    rows = [
        dict(part="probe", variant="before", results=200, seconds=400.0),
        dict(part="probe", variant="after2", results=200, seconds=100.0),
        dict(part="probe_full", variant="after", results=240, seconds=60.0, samples=1),
        dict(part="replay_full", variant="after2", results=110, seconds=600.0, tokens=6000),
    ]
    text = bench.table(rows, total_tokens=96000)
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines()[2:]]
    lines = {(c[0], c[1]): c for c in cells}
    assert lines["probe", "after2"][5] == "4.0x"  # 0.5 s a result against 2 s
    assert lines["probe", "before"][5] == ""
    assert "10.0 min (10 samples)" in lines["probe_full", "after"][6]
    assert "160 min (16 tasks" in lines["replay_full", "after2"][6]  # 600 s x 96000 / 6000 tokens


@pytest.mark.slow
def test_a_tiny_probe_run_is_measured_in_its_own_process(tmp_path):
    bench = load_script("throughput")
    out = tmp_path / "t.json"
    bench.main(["--model", "tiny", "--parts", "probe", "--variants", "after", "--samples", "1", "--out", str(out)])
    data = json.loads(out.read_text())
    (row,) = data["rows"]
    assert row["part"] == "probe" and row["variant"] == "after" and row["results"] == 20 and row["seconds"] > 0
    with pytest.raises(SystemExit, match="--before"):
        bench.main(["--model", "tiny", "--parts", "probe", "--variants", "before", "--out", str(out)])
