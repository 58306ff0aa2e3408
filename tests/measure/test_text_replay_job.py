"""``replay JOB --model NAME`` on a job whose trajectories are text (an expert job): the conversation is rebuilt
from the stored turns, rendered into the named model and scored span by span; what cannot be rebuilt says why."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from agent_runner.records import Completion, TurnRecord
from db import job_rows
from db import store as st
from db.measure_models import Replay
from db.models import Turn
from jobs.spec import JobSpec
from measure.replay import plan_replays, run_plan
from measure.text_trajectories import TextTrajectoryError, conversation
from tests import tiny_models
from tests.support.db_fixtures import sqlite_db_fixture  # noqa: F401  (fixtures)
from workers.stored_records import turn_row

TASK = "humanfmt__humanfmt-4"
VIEW = "Here's the result of running `cat -n` on the file: /testbed/x.py:\n     1 def f(x):\n     2     return x + 1"
CALLS = [
    "<think>\nOpen it.\n</think>\n\n<function=file_editor>\n<parameter=command>view</parameter>\n"
    "<parameter=path>/testbed/x.py</parameter>\n</function>",
    "<think>\nFix it.\n</think>\n\n<function=file_editor>\n<parameter=command>str_replace</parameter>\n"
    "<parameter=path>/testbed/x.py</parameter>\n<parameter=old_str>def f(x):\n    return x + 1</parameter>\n"
    "<parameter=new_str>def f(x):\n    return x</parameter>\n</function>",
]


@pytest.fixture(scope="module")
def tiny_host():
    return tiny_models.tiny_host()


def expert_job(db, *, intervened: bool = False, sent: str | None = None) -> tuple[str, str]:
    """An expert job with one finished dense episode of TASK whose two turns are CALLS (the first answered by
    VIEW); ``sent``: the scaffold digest stored with it (None: none stored)."""
    spec = JobSpec.from_dict({"backend": "expert", "methods": ["dense"], "tasks": {"suite": "mini", "ids": [TASK]}})
    with db.session() as s:
        job = job_rows.create_job(s, config=spec.model_dump(mode="json"), config_hash=spec.config_hash())
        (episode,) = job_rows.add_episodes(s, job.id, spec.episodes([TASK]))
        claim = st.claim_episode(s, episode.id)
    replies = [VIEW + "\nSteps Remaining: 39", None]
    for i, (text, reply) in enumerate(zip(CALLS, replies, strict=True)):
        turn = TurnRecord(
            index=i,
            completion=Completion(text=text),
            thought="x",
            action=None,
            observation=reply or "",
            user_message=reply,
            intervened=intervened and i == 1,
        )
        with db.session() as s:
            st.record_turn(s, claim, i, steered=turn.intervened, **turn_row(turn))
    with db.session() as s:
        result = {"scaffold": {"sent_sha256": sent}} if sent else {}
        st.finish_episode(s, claim, "submitted", patch="", result=result)
    return job.id, episode.id


def test_a_text_job_is_replayed_on_the_named_model_span_by_span(sqlite_db, tiny_host):
    job_id, episode_id = expert_job(sqlite_db)
    messages = conversation(sqlite_db, episode_id)
    assert [m.role for m in messages] == ["system", "user", "assistant", "user", "assistant"]
    assert messages[2].content == CALLS[0] and messages[3].content.startswith(VIEW)
    plan = plan_replays(sqlite_db, job_id, methods=["snapkv"])  # no stored stream, no model: says how to replay it
    assert not plan.items and "expert trajectory is text: replay it with --model NAME" in plan.missing[0][2]
    plan = plan_replays(
        sqlite_db,
        job_id,
        methods=["dense", "snapkv"],
        scopes=["prefill_only"],
        protocols=["true_eviction", "full_context"],
        densities=[0.2],
        model="tiny",
    )
    assert plan.model.name == "tiny" and {i.model for i in plan.items} == {"tiny"}
    summary = run_plan(sqlite_db, plan, host=tiny_host)
    assert summary.counts == {"ok": 4, "skipped": 0, "failed": 0}  # 2 methods x 2 protocols
    with sqlite_db.session() as s:
        rows = list(s.execute(select(Replay)).scalars())
        assert {r.model for r in rows} == {"tiny"}
        for row in rows:
            assert row.action["spans"]["copy"] >= 2 and row.action["tokens"]["copy"] > 0
            spans = row.turns[-1]["spans"]
            old = next(x for x in spans if x["kind"] == "copy" and x["param"] == "old_str")
            assert CALLS[1][old["start"] : old["end"]] == "def f(x):\n    return x + 1"
            assert old["source"] == 1 and old["back"] > 0
        dense = [r for r in rows if r.method == "dense"]
        assert all(x["held_mean"] == 1.0 for r in dense for x in r.turns[-1]["spans"] if x["held_mean"] is not None)
    # the same plan again replaces its rows (one row per source, settings and model)
    again = run_plan(sqlite_db, plan, host=tiny_host)
    with sqlite_db.session() as s:
        assert len(list(s.execute(select(Replay)).scalars())) == 4 and again.counts["ok"] == 4


def test_what_cannot_be_rebuilt_is_skipped_with_its_reason(sqlite_db, tiny_host):
    _, steered = expert_job(sqlite_db, intervened=True)
    with pytest.raises(TextTrajectoryError, match="steered"):
        conversation(sqlite_db, steered)
    job_id, changed = expert_job(sqlite_db, sent="0" * 64)
    with pytest.raises(TextTrajectoryError, match="differ from those it sent"):
        conversation(sqlite_db, changed)
    plan = plan_replays(sqlite_db, job_id, methods=["snapkv"], scopes=["prefill_only"], model="tiny")
    summary = run_plan(sqlite_db, plan, host=tiny_host)
    assert summary.counts["skipped"] == len(plan.items) > 0 and summary.counts["failed"] == 0
    assert all("differ from those it sent" in r.error for r in summary.results)
    with sqlite_db.session() as s:
        assert s.execute(select(Turn).where(Turn.episode_id == changed)).first() is not None


@pytest.mark.docker
@pytest.mark.slow
def test_agent_case_runs_demonstrations_replays_them_and_prints_the_action_table(tmp_path):
    """The first command end to end on one task (the tiny model keeps it short; README's runs smollm2-135m)."""
    import json
    import subprocess
    import sys

    from tests.conftest import docker_status, require

    require(*docker_status())
    args = ["--tasks", "humanfmt__humanfmt-4", "--model", "tiny", "--methods", "dense,snapkv", "--format", "json"]
    done = subprocess.run(
        [sys.executable, "-m", "nexus_eval.cli", "agent-case", *args, "--db", str(tmp_path / "r.db")],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    table = json.loads(done.stdout)
    assert [(d["resolved"], d["n"]) for d in table["demonstrations"]] == [(1, 1)]
    cells = {(c["method"], c["protocol"]) for c in table["action"]}
    assert cells == {(m, p) for m in ("dense", "snapkv") for p in ("true_eviction", "full_context")}
    assert all(c["spans"] > 0 and c["model"] == "tiny" for c in table["action"])
    assert "[4/4] ok" in done.stderr  # one plain progress line per replay in a pipe
