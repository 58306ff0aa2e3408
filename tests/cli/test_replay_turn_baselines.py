"""Issue 47's "done when" on a stored text job: ``replay --methods observation_masking,snapkv`` with SnapKV's
``candidates: newest_turn`` stores rows that ``compare --format json`` tables under those names, each with its held
KV, and the budgeted observation masking holds what SnapKV holds at the same density (equal memory).

The job is the expert demonstration of ``tests/measure/test_text_replay_job`` (a view, then an edit copying it),
rendered into the tiny model (``--model tiny``; the loaded host is the shared tiny one, in this process)."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import select
from typer.testing import CliRunner

from db.measure_models import Replay
from tests import tiny_models
from tests.measure.test_text_replay_job import expert_job
from tests.support.db_fixtures import sqlite_db_fixture  # noqa: F401  (fixtures)

PROTOCOLS = "true_eviction,full_context"


def _run(db, *args: str) -> str:
    from nexus_eval.cli import app

    result = CliRunner().invoke(app, [*args, "--db", db.url], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    return result.stdout


def _held(db, job_id: str, label_rows: list[dict]) -> dict[tuple[str, str], float]:
    """(method, protocol) -> the mean KV held after a turn, over the stored ok rows behind ``label_rows``."""
    with db.session() as s:
        rows = [r for r in s.execute(select(Replay).where(Replay.job_id == job_id)).scalars() if r.status == "ok"]
        held = {}
        for cell in label_rows:
            mine = [r for r in rows if r.protocol == cell["protocol"] and _label(r) == cell["method"]]
            turns = [t["kv_held_bytes"] for r in mine for t in r.turns]
            held[cell["method"], cell["protocol"]] = sum(turns) / len(turns)
    return held


def _label(row) -> str:
    from jobs.variants import row_labels

    return row_labels([row])[0]


def test_replay_observation_masking_and_newest_turn_snapkv_reach_compare_with_their_held_kv(sqlite_db, monkeypatch):
    import agent_runner.loaded_models

    host = tiny_models.tiny_host()
    monkeypatch.setattr(agent_runner.loaded_models, "host_for", lambda spec: host)
    job_id, _ = expert_job(sqlite_db)
    replay = ["replay", job_id, "--model", "tiny", "--densities", "0.2", "--protocols", PROTOCOLS]
    replay += ["--dtype", "float32", "--processes", "1"]  # this process: the tiny host above
    _run(sqlite_db, *replay, "--methods", "observation_masking,snapkv",
         "--method-params", '{"snapkv": {"candidates": "newest_turn"}}')  # fmt: skip
    table = json.loads(_run(sqlite_db, "compare", job_id, "--format", "json"))
    action = [c for c in table["action"] if c["method"] != "dense"]
    assert {(c["method"], c["protocol"]) for c in action} == {
        (m, p) for m in ("observation_masking", "snapkv[candidates=newest_turn]") for p in PROTOCOLS.split(",")
    }
    assert all(c["paired"] == 1 and c["spans"] > 0 for c in action)
    held = _held(sqlite_db, job_id, table["action"])
    assert all(v > 0 for v in held.values())
    for protocol in PROTOCOLS.split(","):  # one observation, fewer than the paper keeps: held as dense holds
        assert held["observation_masking", protocol] == held["dense", protocol]
        assert held["snapkv[candidates=newest_turn]", protocol] < 0.5 * held["dense", protocol]
    for c in action:  # the held KV beside each action row, where the table carries it
        for key in (k for k in c if "held_bytes" in k):
            assert c[key] == pytest.approx(held[c["method"], c["protocol"]], rel=1e-6)

    _run(sqlite_db, *replay, "--methods", "observation_masking,snapkv",
         "--method-params", '{"observation_masking": {"rule": "budget"}}')  # fmt: skip
    table = json.loads(_run(sqlite_db, "compare", job_id, "--format", "json"))
    cells = [c for c in table["action"] if c["method"] in ("observation_masking[rule=budget]", "snapkv")]
    assert len(cells) == 4
    held = _held(sqlite_db, job_id, cells)
    for protocol in PROTOCOLS.split(","):
        budgeted, snapkv = held["observation_masking[rule=budget]", protocol], held["snapkv", protocol]
        assert budgeted == pytest.approx(snapkv, rel=0.05), protocol  # equal memory at density 0.2
    # told the segments, the budgeted rule drops observations first: the view, the only one, is what the edit copies
    assert all(c["copy_held"] == 0.0 for c in cells if c["method"] == "observation_masking[rule=budget]")
