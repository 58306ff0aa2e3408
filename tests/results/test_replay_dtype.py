"""The measuring dtype in the replay and action statistics: a (model, dtype) pair is the unit a model was before, so
a replay measured in bfloat16 is never paired with a dense replay measured in float32 (not as the ΔNLL baseline, not
in one cell, not in a sign-flip test), a row whose dtype was not recorded is a unit of its own, and every caption,
JSON and CSV row says the dtype its cells were measured in.

Rows are written with ``db.replays.record_replay`` into a real SQLite database, the sources an ``expert`` job's
dense episodes (``tests.results.test_action_table``'s helpers)."""

from __future__ import annotations

import csv
import io
import json
import re

import pytest

from db import store as st
from db.replays import record_replay
from results.compare import compare_jobs
from results.compare_render import render
from results.probe_render import render as render_probe
from results.probe_render import to_csv as probe_csv
from results.probe_stats import CAPTION, ProbeTable
from tests.results.test_action_table import MODEL, expert_job, score, span
from tests.support.db_fixtures import sqlite_db_fixture  # noqa: F401  (fixtures)

SCOPE, PROTOCOL = "prefill_only", "true_eviction"


def replay(db, episode_id, method, nll, dtype, *, model=None, spans=None, density=0.2):
    """One ok replay row: a token-stream replay (``model`` None) with ``nll``, or with ``spans`` an action one."""
    with db.session() as s:
        source = st.get_episode(s, episode_id)
        if spans is None:
            values = {"tokens": 10, "nll_mean": nll, "top1": 0.9, "turns": [], "seconds": 0.1}
        else:
            values = score(spans)
        config = {"method": method, "density": density}
        record_replay(s, source, method=method, scope=SCOPE, protocol=PROTOCOL, config=config, status="ok",
                      score=values, model=model, dtype=dtype)  # fmt: skip


def replay_cell(table, method, dtype, model=None):
    (cell,) = [c for c in table.replay if (c.method, c.model, c.dtype) == (method, model, dtype)]
    return cell


def test_the_replay_table_never_pairs_a_bfloat16_replay_with_a_float32_dense(sqlite_db):
    """Dense ran in float32 on e1-e3 and in bfloat16 on e1 alone: snapkv's bfloat16 replays of e2 and e3 have no
    baseline (unpaired), though float32 dense replays of the same episodes exist; e1's is paired with the bfloat16
    dense. A row whose dtype was not recorded pairs with neither."""
    job, ids = expert_job(sqlite_db, ["t1", "t2", "t3"])
    e1, e2, e3 = ids[("t1", 0)], ids[("t2", 0)], ids[("t3", 0)]
    for e in (e1, e2, e3):
        replay(sqlite_db, e, "dense", 1.0, "float32")
        replay(sqlite_db, e, "snapkv", 2.0, "bfloat16")
    replay(sqlite_db, e1, "dense", 1.25, "bfloat16")
    replay(sqlite_db, e1, "snapkv", 1.5, "float32")
    replay(sqlite_db, e2, "snapkv", 1.75, "float32")
    replay(sqlite_db, e3, "snapkv", 9.0, None)  # stored before dtypes were recorded
    with sqlite_db.session() as s:
        table = compare_jobs(s, [job])
    bf16, fp32 = replay_cell(table, "snapkv", "bfloat16"), replay_cell(table, "snapkv", "float32")
    assert (bf16.episodes, bf16.n_pairs, bf16.unpaired) == (3, 1, 2)
    assert bf16.delta_nll == pytest.approx(2.0 - 1.25) and bf16.nll_mean == pytest.approx(2.0)
    assert (fp32.episodes, fp32.n_pairs, fp32.unpaired) == (2, 2, 0)
    assert fp32.delta_nll == pytest.approx(((1.5 - 1.0) + (1.75 - 1.0)) / 2)
    unrecorded = replay_cell(table, "snapkv", None)
    assert (unrecorded.n_pairs, unrecorded.unpaired, unrecorded.delta_nll) == (0, 1, None)
    assert replay_cell(table, "dense", "bfloat16").episodes == 1 and replay_cell(table, "dense", "float32").n_pairs == 3
    # not recorded first, then the dtypes by name; each (model, dtype) its own cells
    assert [(c.method, c.dtype) for c in table.replay] == [
        ("snapkv", None), ("dense", "bfloat16"), ("snapkv", "bfloat16"), ("dense", "float32"), ("snapkv", "float32")
    ]  # fmt: skip
    assert any("measured in several dtypes" in n for n in table.notes)
    # the trade-off table has no Pass@1 row here (an expert job); its ΔNLL is named per dtype where it has one


def test_the_action_table_never_pairs_dtypes_in_a_cell_or_a_sign_flip_test(sqlite_db):
    """Five tasks. In float32 dense, snapkv and nexus ran on every episode (copy top-1 1.0, 0.5, 0.9). In bfloat16
    dense ran on t0 alone, snapkv on t0 and t1 (1.0), nexus on every episode (0.9). A bfloat16 cell pairs with the
    bfloat16 dense of t0 only, never with the float32 dense of the others; float32 nexus is tested against float32
    snapkv on all five tasks (all one sign: p = 2/32), never against bfloat16 snapkv's t0 and t1 (the other sign)."""
    job, ids = expert_job(sqlite_db, [f"t{i}" for i in range(5)])
    episodes = [ids[(f"t{i}", 0)] for i in range(5)]
    for i, e in enumerate(episodes):
        replay(sqlite_db, e, "dense", None, "float32", model=MODEL, spans=[span(1.0)])
        replay(sqlite_db, e, "snapkv", None, "float32", model=MODEL, spans=[span(0.5)])
        replay(sqlite_db, e, "nexus", None, "float32", model=MODEL, spans=[span(0.9)])
        replay(sqlite_db, e, "nexus", None, "bfloat16", model=MODEL, spans=[span(0.9)])
        if i < 2:
            replay(sqlite_db, e, "snapkv", None, "bfloat16", model=MODEL, spans=[span(1.0)])
    replay(sqlite_db, episodes[0], "dense", None, "bfloat16", model=MODEL, spans=[span(1.0)])
    with sqlite_db.session() as s:
        table = compare_jobs(s, [job])
    cells = {(c.method, c.dtype): c for c in table.action}
    assert set(cells) == {(m, d) for m in ("dense", "snapkv", "nexus") for d in ("float32", "bfloat16")}
    snapkv = cells[("snapkv", "bfloat16")]
    assert (snapkv.episodes, snapkv.paired, snapkv.unpaired, snapkv.tasks) == (2, 1, 1, 1)
    assert (snapkv.copy_top1, snapkv.tasks_vs_dense) == (pytest.approx(1.0), 1)  # t0 alone, not t0 and t1
    nexus = cells[("nexus", "bfloat16")]
    assert (nexus.episodes, nexus.paired, nexus.unpaired) == (5, 1, 4)
    assert (nexus.tasks_vs_dense, nexus.tasks_vs_snapkv) == (1, 1)
    fp32 = cells[("nexus", "float32")]
    assert (fp32.paired, fp32.copy_top1, fp32.delta_copy_nll) == (5, pytest.approx(0.9), pytest.approx(0.1))
    assert (fp32.p_vs_snapkv, fp32.tasks_vs_snapkv) == (pytest.approx(2 / 32), 5)
    assert (fp32.p_vs_dense, fp32.tasks_vs_dense) == (pytest.approx(2 / 32), 5)
    assert cells[("dense", "bfloat16")].episodes == 1 and cells[("dense", "float32")].episodes == 5
    split = {(d.method, d.dtype) for d in table.action_by_distance}
    assert ("snapkv", "bfloat16") in split and ("snapkv", "float32") in split
    # the several-units layout tells the rows apart by model and dtype
    layout = table.action_layout
    assert layout.several_models and [r.dtype for r in layout.rows] == ["bfloat16", "float32"]
    markdown = render(table, "markdown")
    assert "| model, dtype |" in markdown
    assert f"| {MODEL}, bfloat16 |" in markdown and f"| {MODEL}, float32 |" in markdown


def test_captions_json_and_csv_name_the_dtype(sqlite_db):
    job, ids = expert_job(sqlite_db, ["t1", "t2"])
    for e in ids.values():
        replay(sqlite_db, e, "dense", 1.0, "bfloat16")
        replay(sqlite_db, e, "snapkv", 1.5, "bfloat16")
        replay(sqlite_db, e, "dense", 1.0, "float32")
        replay(sqlite_db, e, "snapkv", 1.25, "float32")
        replay(sqlite_db, e, "dense", None, "bfloat16", model=MODEL, spans=[span(1.0)])
        replay(sqlite_db, e, "snapkv", None, "bfloat16", model=MODEL, spans=[span(0.5)])
    with sqlite_db.session() as s:
        table = compare_jobs(s, [job])
    data = json.loads(render(table, "json"))
    assert {(r["method"], r["model"], r["dtype"]) for r in data["replay"]} == {
        (m, model, d)
        for m in ("dense", "snapkv")
        for model, d in ((None, "bfloat16"), (None, "float32"), (MODEL, "bfloat16"))
    }
    assert "own model, bfloat16; own model, float32; smollm2-135m, bfloat16" in data["replay_caption"]
    assert all(a["dtype"] == "bfloat16" for a in data["action"] + data["action_by_distance"])
    assert f"Measured on {MODEL}, bfloat16" in data["action_caption"]
    assert f"Measured on {MODEL}, bfloat16" in data["action_distance_caption"]
    lines = list(csv.DictReader(io.StringIO(render(table, "csv"))))
    replayed = {(r["method"], r["replay_model"], r["replay_dtype"]) for r in lines if r["replay_episodes"]}
    assert ("snapkv", "", "bfloat16") in replayed and ("snapkv", "", "float32") in replayed
    assert {r["action_dtype"] for r in lines if r["action_episodes"]} == {"bfloat16"}
    for fmt in ("markdown", "table"):
        text = re.sub(r"\s+", " ", render(table, fmt, width=400))
        assert "own model, bfloat16; own model, float32" in text, fmt  # the replay caption
        assert f"replayed on {MODEL}, bfloat16" in text and f"Measured on {MODEL}, bfloat16" in text, fmt
        # two rows that differ only in dtype are told apart
        assert "snapkv (bfloat16)" in text and "snapkv (float32)" in text and f"snapkv ({MODEL}, bfloat16)" in text


def test_rows_whose_dtype_was_not_recorded_say_so(sqlite_db):
    job, ids = expert_job(sqlite_db, ["t1"])
    (e,) = ids.values()
    replay(sqlite_db, e, "dense", 1.0, None)
    replay(sqlite_db, e, "snapkv", 1.5, None)
    replay(sqlite_db, e, "dense", None, None, model=MODEL, spans=[span(1.0)])
    replay(sqlite_db, e, "snapkv", None, None, model=MODEL, spans=[span(0.5)])
    with sqlite_db.session() as s:
        table = compare_jobs(s, [job])
    assert replay_cell(table, "snapkv", None).n_pairs == 1  # a not-recorded row pairs with a not-recorded dense
    data = json.loads(render(table, "json"))
    assert all(r["dtype"] is None for r in data["replay"] + data["action"])
    assert "own model, dtype not recorded" in data["replay_caption"]
    assert f"{MODEL}, dtype not recorded" in data["action_caption"]
    markdown = render(table, "markdown")
    assert "| snapkv |" in markdown  # an old row's method column reads as it did
    assert not any("several dtypes" in n for n in table.notes)


def _probe_table(provenance: dict) -> ProbeTable:
    run = {"id": "r1", "status": "done", "model": "smollm2-135m", "n_results": 0, "n_planned": 0}
    return ProbeTable(run, {"model": "smollm2-135m"}, provenance, [])


def test_the_probe_table_names_the_dtype_its_run_was_measured_in():
    table = _probe_table({"device": "cuda:0", "dtype": "bfloat16"})
    assert table.dtype == "bfloat16" and table.caption == f"{CAPTION} · measured on smollm2-135m, bfloat16"
    assert table.to_dict()["caption"] == table.caption
    for fmt in ("markdown", "table"):
        text = render_probe(table, fmt)
        assert "probe run r1 · smollm2-135m · bfloat16 · done" in text and "measured on smollm2-135m, bfloat16" in text
    assert probe_csv(table).splitlines()[0].endswith(",dtype")
    old = _probe_table({"device": "cpu"})  # a run stored before its dtype was recorded
    assert old.dtype is None and old.caption.endswith("measured on smollm2-135m, dtype not recorded")
    assert "probe run r1 · smollm2-135m · dtype not recorded · done" in render_probe(old, "markdown")
    asked = ProbeTable(old.run, {"model": "smollm2-135m", "dtype": "float32"}, {}, [])  # its model never loaded
    assert asked.dtype == "float32"
