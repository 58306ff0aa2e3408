"""Probe statistics on hand-made results: Wilson, McNemar paired by sample, delta-NLL paired by sample, missing
baselines, the run's order and the notes. Expected values are worked out here, not read back from the code."""

from __future__ import annotations

import csv
import io
import random

import pytest

from measure.probes import ProbeResult
from results.probe_render import delta_text, render
from results.probe_stats import ProbeTable, notes_for, summarize
from results.stats import bootstrap_mean_ci, mcnemar

#: the KV figures of every sample (held / allocated at answer start, the peaks over the sample)
KV = dict(kv_held_bytes=150, kv_allocated_bytes=200, kv_peak_held_bytes=600, kv_peak_allocated_bytes=800)
DENSE_KV = dict(kv_held_bytes=900, kv_allocated_bytes=1000, kv_peak_held_bytes=900, kv_peak_allocated_bytes=1200)


def result(
    variant: str, sample: int, *, probe: str = "needle", correct: bool | None = None, nll: float | None = None,
    density: float = 0.2, scope: str = "prefill_only", protocol: str = "single_prefill",
) -> ProbeResult:  # fmt: skip
    return ProbeResult(
        probe=probe, variant=variant, scope=scope, protocol=protocol, density=density, sample=sample,
        source="code", length=300, depth=0.5, correct=correct, nll=nll, scored_tokens=0 if nll is None else 8,
        answer="12345" if correct else "", expected="12345", kept_fraction=1.0 if variant == "dense" else density,
        seconds=0.5, **(DENSE_KV if variant == "dense" else KV),
    )  # fmt: skip


def cell(cells, variant, **key):
    matches = [c for c in cells if c.variant == variant and all(getattr(c, k) == v for k, v in key.items())]
    assert len(matches) == 1, (variant, key, [c.key for c in cells])
    return matches[0]


def test_accuracy_carries_the_wilson_interval():
    rows = [result("snapkv", i, correct=i < 7) for i in range(10)]
    (c,) = summarize(rows)
    assert (c.n, c.n_correct, c.accuracy) == (10, 7, 0.7)
    # Wilson 95% for 7/10, by hand: center (0.7 + z²/20) / (1 + z²/10), z = 1.959964
    assert (round(c.ci_low, 4), round(c.ci_high, 4)) == (0.3968, 0.8922)
    assert c.nll is None and c.delta_nll is None and c.kept_fraction == pytest.approx(0.2)
    assert (c.kv_held_bytes, c.kv_allocated_bytes, c.kv_peak_held_bytes, c.kv_peak_allocated_bytes) == (
        150,
        200,
        600,
        800,
    )


def test_mcnemar_pairs_by_sample_index_not_by_position():
    # dense right on samples 0-5; the variant right on 6-9 and on 0. Listed in shuffled orders, so pairing by
    # position would pair the wrong samples.
    dense = [result("dense", i, correct=i < 6) for i in range(10)]
    variant = [result("nexus", i, correct=i >= 6 or i == 0) for i in range(10)]
    rows = dense + variant
    random.Random(3).shuffle(rows)
    c = cell(summarize(rows), "nexus")
    test = c.vs["dense"]
    assert (test.pairs, test.b, test.c) == (10, 4, 5)  # b: 6,7,8,9 only nexus; c: 1..5 only dense
    assert test.p_value == mcnemar(4, 5, exact=True).p_value == 1.0
    assert "snapkv" in c.vs and c.vs["snapkv"] is None  # no snapkv in the run: None, not an error
    assert cell(summarize(rows), "dense").vs == {"snapkv": None}  # no test of dense against itself


def test_mcnemar_against_snapkv_and_unpaired_samples():
    rows = [result("snapkv", i, correct=True) for i in range(6)]
    rows += [result("nexus", i, correct=False) for i in range(8)]  # samples 6, 7 have no snapkv partner
    c = cell(summarize(rows), "nexus")
    t = c.vs["snapkv"]
    assert (c.n, t.pairs, t.b, t.c) == (8, 6, 0, 6)
    assert t.p_value == pytest.approx(2 / 64)  # exact: 2 * P(X <= 0), X ~ Bin(6, 1/2)
    assert cell(summarize(rows), "snapkv").vs == {"dense": None}


def test_baselines_pair_only_within_the_same_probe_scope_protocol_and_density():
    rows = [result("dense", i, correct=True, density=0.5) for i in range(5)]
    rows += [result("nexus", i, correct=False, density=0.2) for i in range(5)]
    rows += [result("dense", i, correct=True, probe="later_turn", protocol="true_eviction", nll=1.0) for i in range(5)]
    c = cell(summarize(rows), "nexus")
    assert c.vs["dense"] is None and c.delta_nll is None and c.accuracy == 0.0


def test_delta_nll_is_paired_by_sample_with_a_seeded_bootstrap():
    dense_nll = {0: 2.0, 1: 3.0, 2: 1.0, 3: 4.0}
    variant_nll = {0: 2.5, 1: 3.1, 2: 1.7, 3: 4.0, 4: 9.0}  # sample 4 has no dense partner
    rows = [result("dense", i, probe="nll", nll=v) for i, v in dense_nll.items()]
    rows += [result("snapkv", i, probe="nll", nll=v) for i, v in reversed(variant_nll.items())]
    cells = summarize(rows)
    c = cell(cells, "snapkv")
    deltas = [0.5, 3.1 - 3.0, 0.7, 0.0]  # by sample index: 0, 1, 2, 3
    assert c.nll_pairs == 4 and c.delta_nll == pytest.approx(sum(deltas) / 4)
    assert (c.delta_ci_low, c.delta_ci_high) == (None, None)  # 4 samples: too few for a bootstrap interval
    assert "+0.325 (4 samples: too few for an interval)" in delta_text(c)
    ten = [result("dense", i, probe="nll", nll=1.0) for i in range(10)]
    ten += [result("snapkv", i, probe="nll", nll=1.0 + i / 10) for i in range(10)]
    c10 = cell(summarize(ten), "snapkv")
    assert (c10.delta_ci_low, c10.delta_ci_high) == pytest.approx(
        bootstrap_mean_ci([i / 10 for i in range(10)], seed=0)
    )
    assert c.nll == pytest.approx(sum(variant_nll.values()) / 5)  # the mean NLL keeps the unpaired sample
    assert c.accuracy is None and c.n_correct is None and c.vs == {}  # nll asks no question
    again = cell(summarize(list(reversed(rows))), "snapkv")
    assert (again.delta_ci_low, again.delta_ci_high) == (c.delta_ci_low, c.delta_ci_high)  # seeded
    dense = cell(cells, "dense")
    assert dense.delta_nll is None and dense.nll_pairs == 0


def test_a_run_without_dense_gives_none_and_a_note():
    rows = [result("snapkv", i, probe="later_turn", protocol="true_eviction", correct=i % 2 == 0, nll=1.0 + i)
            for i in range(4)]  # fmt: skip
    rows += [result("nexus", i, probe="later_turn", protocol="true_eviction", correct=True, nll=1.0) for i in range(4)]
    cells = summarize(rows)
    c = cell(cells, "nexus")
    assert c.vs["dense"] is None and c.delta_nll is None and c.nll_pairs == 0
    assert (c.vs["snapkv"].b, c.vs["snapkv"].c) == (2, 0)
    notes = notes_for({"status": "done"}, {"model": "smollm2-135m"}, cells)
    assert any("no dense variant" in n for n in notes) and not any("snapkv variant" in n for n in notes)
    table = ProbeTable(
        {"id": "r", "model": "m", "status": "done", "n_results": 8, "n_planned": 8}, {}, {}, cells, notes
    )
    for fmt in ("table", "json", "csv", "markdown"):
        assert "nexus" in render(table, fmt)


def test_cells_follow_the_run_order_and_notes_warn():
    settings = {"model": "tiny", "probes": ["nll", "needle"], "variants": ["snapkv", "dense"],
                "densities": [0.5, 0.1], "scopes": ["prefill_only"], "protocols": ["true_eviction"]}  # fmt: skip
    rows = [result(v, 0, probe=p, density=d, correct=True if p == "needle" else None, nll=1.0 if p == "nll" else None)
            for p in ("needle", "nll") for v in ("dense", "snapkv") for d in (0.1, 0.5)]  # fmt: skip
    cells = summarize(rows, settings)
    assert [(c.probe, c.density, c.variant) for c in cells] == [
        (p, d, v) for p in ("nll", "needle") for d in (0.5, 0.1) for v in ("snapkv", "dense")
    ]
    run = {"status": "failed", "error": "ValueError: boom\n\ntraceback", "n_results": 8, "n_planned": 20}
    notes = notes_for(run, settings, cells)
    assert notes[0].startswith("tiny model: random weights")
    assert any("n < 30 per cell (fewest: 1)" in n for n in notes)
    assert any("failed after 8 of 20 results (ValueError: boom)" in n for n in notes)
    assert any(n.startswith("needle: the question is in the prompt") for n in notes)
    real = notes_for(run, {**settings, "model": "smollm2-135m"}, cells)
    assert real[0].startswith("smollm2-135m is a 135M-parameter model") and "tiny" not in real[0]


def test_kv_figures_a_sample_did_not_store_are_left_out_and_shown_as_a_dash():
    """Results stored before the held / peak figures existed (revision 0007) have them NULL: a cell's mean skips
    them, a cell with none of them gets None, and every form shows "-" (csv: empty), never 0."""
    old = [result("snapkv", i, correct=True) for i in range(3)]
    for r in old:
        r.kv_held_bytes = r.kv_peak_held_bytes = r.kv_peak_allocated_bytes = None
    (c,) = summarize(old)
    assert (c.kv_allocated_bytes, c.kv_held_bytes, c.kv_peak_held_bytes, c.kv_peak_allocated_bytes) == (
        200,
        None,
        None,
        None,
    )
    (mixed,) = summarize(old + [result("snapkv", 3, correct=True)])
    assert (mixed.kv_held_bytes, mixed.kv_peak_allocated_bytes) == (150, 800)  # the one that has them, not /4
    run = {"id": "r1", "status": "done", "model": "m", "n_results": 3, "n_planned": 3}
    table = ProbeTable(run, {}, {}, [c])
    text = render(table, "markdown")
    header = next(line for line in text.splitlines() if "KV held" in line)
    line = next(line for line in text.splitlines() if line.startswith("| snapkv"))
    cells = dict(zip(header.strip("| ").split(" | "), line.strip("| ").split(" | "), strict=True))
    assert (cells["KV held"], cells["KV alloc"], cells["KV alloc peak"]) == ("-", "200 B", "-")
    (row,) = list(csv.DictReader(io.StringIO(render(table, "csv"))))
    assert (row["kv_held_bytes"], row["kv_allocated_bytes"], row["kv_peak_allocated_bytes"]) == ("", "200.0", "")


def test_cells_that_hold_more_or_less_than_their_density_are_named():
    """Equal memory at equal density is the premise of every comparison; where a cell cannot hold it (Nexus's
    minimum budget above density x length, PyramidKV's floored schedule) the notes name it and its kept fraction."""
    import dataclasses

    rows = [result("snapkv", i, correct=True) for i in range(3)]
    rows += [dataclasses.replace(result("nexus", i, correct=True, density=0.1), kept_fraction=0.108) for i in range(3)]
    notes = notes_for({"status": "done"}, {"model": "tiny"}, summarize(rows))
    (note,) = [n for n in notes if n.startswith("kept differs")]
    assert "1 cell(s) (nexus prefill_only 0.1: 10.8%)" in note and "snapkv" not in note
    assert not [n for n in notes_for({}, {}, summarize(rows[:3])) if n.startswith("kept differs")]
