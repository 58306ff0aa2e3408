"""A turn is stored whole: every field of the TurnRecord and of its Completion reaches the database under its
own name (a column, else ``turns.extra``), typed, with no allow-list in between (issue 19: the token stream
and the flags used to travel in an untyped ``Completion.extra`` that a hand-written list filtered)."""

from __future__ import annotations

from agent_runner.records import (
    Completion,
    CompletionInfo,
    LayerStats,
    OperatorAct,
    ShellSession,
    TurnRecord,
    TurnTokens,
)
from db import store as db_store
from db.models import Turn
from jobs.spec import JobSpec
from jobs.submit import create_job_rows, load_job_tasks, plan_job
from results.turn_data import TurnExtra
from tests.support.db_fixtures import sqlite_db_fixture  # noqa: F401  (fixture)
from tests.support.worker_fixtures import oracle_job
from workers.stored_records import turn_row

STATS = LayerStats(min=1, mean=2, max=3)


def _every_field_set() -> TurnRecord:
    """A turn whose every field differs from its default, so a dropped field cannot hide."""
    completion = Completion(
        text="<think>t</think>",
        tokens_appended=5,
        tokens_generated=3,
        prompt_tokens=40,
        logical_length=43,
        physical_before=STATS,
        physical_after=STATS,
        eviction_events=2,
        kv_held_bytes=1000,
        kv_allocated_bytes=1024,
        kv_peak_held_bytes=3000,
        kv_peak_allocated_bytes=4096,
        prefill_s=0.5,
        decode_s=0.25,
        tokens_per_s=8.0,
        finish_reason="stop",
        tokens=TurnTokens(keep=2, append=[7, 8, 9], generated=[4, 5, 6]),
        context_full=True,
        history_mismatch=True,
        batch_rows=2.5,
        forced=True,
        info=CompletionInfo(
            budget=64, forced_agreed=3, forced_from="ids", attempts=2, server_model="m", request_id="r1"
        ),
        extra={"a_backends_own_key": 1},
    )
    return TurnRecord(
        index=0,
        completion=completion,
        thought="t",
        action={"name": "execute_bash", "arguments": {"cmd": "ls"}},
        parse_error="none really",
        format_error=True,
        intervened=True,
        operator=OperatorAct(choice="skip", shells=[ShellSession(transcript="$ pwd\n/testbed\n", exit_code=0)]),
        observation="the observation",
        user_message="the observation\nSteps Remaining: 3",
        submitted=True,
        env_s=0.125,
        model_s=0.75,
        steps_remaining=3,
    )


def test_every_field_of_the_turn_and_its_completion_is_stored_under_its_name(sqlite_db):
    turn = _every_field_set()
    assert all(getattr(turn, f) != info.default for f, info in TurnRecord.model_fields.items() if f != "index")
    assert all(
        getattr(turn.completion, f) != info.get_default(call_default_factory=True)
        for f, info in Completion.model_fields.items()
    )
    spec = JobSpec.from_dict(oracle_job(["humanfmt__humanfmt-1"], ["dense"], ["true_eviction"]))
    _, (episode_id,) = create_job_rows(sqlite_db, plan_job(spec, load_job_tasks(spec)))
    with sqlite_db.session() as s:
        claim = db_store.claim_episode(s, episode_id)
    with sqlite_db.session() as s:
        db_store.record_turn(s, claim, turn.index, **turn_row(turn))
    with sqlite_db.session() as s:
        row = s.query(Turn).filter_by(episode_id=episode_id).one()
        stored = {c.name: getattr(row, c.name) for c in Turn.__table__.columns}
        assert turn.observation not in str(stored["extra"])  # the user message is stored after it, not again
        assert stored["extra"]["user_message_after_observation"] == "\nSteps Remaining: 3"
        stored["extra"] = {**stored["extra"], **TurnExtra.of_row(row).model_dump(mode="json")}
    c = turn.completion.model_dump(mode="json")
    assert stored["completion"] == c["text"] and stored["tokens"] == c["tokens"]
    assert stored["extra"]["backend"] == c["extra"]
    for name, value in c.items():
        if name not in ("text", "tokens", "extra"):
            assert stored.get(name, stored["extra"].get(name)) == value, name
    for name, value in turn.model_dump(mode="json", exclude={"completion", "index"}).items():
        assert stored.get(name, stored["extra"].get(name)) == value, name
