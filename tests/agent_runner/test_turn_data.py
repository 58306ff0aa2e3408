"""The data a turn carries is typed end to end: a backend fills ``Completion.info`` (not a dict by key), the turn
is stored through ``workers.stored_records.turn_row`` into ``turns.extra``, and read back as
``results.turn_data.TurnExtra`` by attribute. Rows stored before (the backend's keys inside ``backend``, fields
missing, keys nobody knows) still read."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from agent_runner.backends.forced_prefix import ForcedPrefix
from agent_runner.backends.scripted import ScriptedModel
from agent_runner.records import Completion, CompletionInfo, Message, OperatorAct, ShellSession, TurnRecord
from db import Database, connect, job_rows, sqlite_url
from db import store as db_store
from db.models import Turn
from env.sandbox.tools import ToolCall
from jobs.spec import EpisodeKey
from results.turn_data import TurnExtra
from workers.stored_records import turn_row

#: a value unlike the default for every field the code reads from ``turns.extra``
INFO_VALUES: dict[str, Any] = {
    "budget": 64,
    "forced_agreed": 3,
    "forced_from": "ids",
    "attempts": 2,
    "server_model": "qwen3-8b",
    "request_id": "chatcmpl-1",
}
TURN_VALUES: dict[str, Any] = {
    "parse_error": "no closing </function>",
    "format_error": True,
    "intervened": True,
    "operator": OperatorAct(
        choice="edit",
        proposed=ToolCall(name="execute_bash", arguments={"cmd": "ls"}),
        shells=[ShellSession(transcript="$ ls\nREADME.md\n", cut=3, seconds=1.5, exit_code=0)],
    ),
    "user_message": "obs\nSteps Remaining: 3",
    "submitted": True,
    "model_s": 0.75,
    "steps_remaining": -2,
}
COMPLETION_VALUES: dict[str, Any] = {
    "finish_reason": "length",
    "context_full": True,
    "history_mismatch": True,
    "batch_rows": 2.5,
    "forced": True,
}
MESSAGES = [Message(role="system", content="sys"), Message(role="user", content="fix it")]


def _turn(completion: Completion, **fields: Any) -> TurnRecord:
    return TurnRecord(index=0, completion=completion, thought="t", action=None, observation="obs", **fields)


@pytest.fixture
def database(tmp_path) -> Database:
    db = connect(sqlite_url(tmp_path / "turns.db"))
    yield db
    db.dispose()


def _stored(db: Database, turn: TurnRecord) -> dict[str, Any]:
    """``turn`` written as a worker writes it (claim, ``record_turn(**turn_row(turn))``); its ``extra`` and
    ``observation`` read back."""
    return _stored_row(db, turn_row(turn))


def _stored_row(db: Database, row: dict[str, Any]) -> dict[str, Any]:
    with db.session() as s:
        job = job_rows.create_job(s, config={}, config_hash="h", package_versions={}, git_revision="")
        (episode,) = job_rows.add_episodes(s, job.id, [EpisodeKey("t1", "dense", "prefill_only", "true_eviction", 0)])
        episode_id = episode.id
    with db.session() as s:
        claim = db_store.claim_episode(s, episode_id)
    with db.session() as s:
        db_store.record_turn(s, claim, 0, **row)
    with db.session() as s:
        row = s.query(Turn).filter_by(episode_id=episode_id).one()
        return {"extra": row.extra, "observation": row.observation}


def test_extra_holds_exactly_the_fields_without_a_column():
    """Every field of a TurnRecord and of its Completion is a ``turns`` column or a TurnExtra field (so
    ``TurnExtra.of`` cannot drop one unnoticed); ``backend`` is ``Completion.extra``."""
    columns = set(Turn.__table__.columns.keys()) | {"text"}  # the completion's text is the column `completion`
    fields = (set(TurnRecord.model_fields) - {"completion"}) | (set(Completion.model_fields) - {"extra"})
    assert set(TurnExtra.model_fields) - {"backend"} == fields - columns
    assert set(INFO_VALUES) == set(CompletionInfo.model_fields)
    assert set(TURN_VALUES) | set(COMPLETION_VALUES) | {"info", "backend"} == set(TurnExtra.model_fields)


@pytest.mark.parametrize("name", sorted(INFO_VALUES))
def test_each_backend_field_round_trips_through_the_row(database, name):
    completion = Completion(text="x", info=CompletionInfo(**{name: INFO_VALUES[name]}))
    read = TurnExtra.of_row(_stored(database, _turn(completion)))
    assert getattr(read.info, name) == INFO_VALUES[name]
    assert read.info == completion.info and read.backend == {}


@pytest.mark.parametrize("name", sorted(TURN_VALUES))
def test_each_turn_field_round_trips_through_the_row(database, name):
    read = TurnExtra.of_row(_stored(database, _turn(Completion(text="x"), **{name: TURN_VALUES[name]})))
    assert getattr(read, name) == TURN_VALUES[name]


@pytest.mark.parametrize("name", sorted(COMPLETION_VALUES))
def test_each_completion_field_round_trips_through_the_row(database, name):
    read = TurnExtra.of_row(_stored(database, _turn(Completion(text="x", **{name: COMPLETION_VALUES[name]}))))
    assert getattr(read, name) == COMPLETION_VALUES[name]


def test_every_field_at_once_and_a_backends_own_key(database):
    completion = Completion(text="x", info=CompletionInfo(**INFO_VALUES), extra={"queue_ms": 12}, **COMPLETION_VALUES)
    turn = _turn(completion, **TURN_VALUES)
    read = TurnExtra.of_row(_stored(database, turn))
    assert read == TurnExtra.of(turn)
    assert read.info == CompletionInfo(**INFO_VALUES) and read.backend == {"queue_ms": 12}


def test_a_forced_turn_says_how_it_was_forced_through_the_row(database):
    """ForcedPrefix over a backend that cannot teacher-force steps it: ``info.forced_from`` is "stepped"."""
    forced = ForcedPrefix(["stored text"], ScriptedModel(["live text", "next"]))
    forced.reset(seed=0)
    completion = forced.complete(MESSAGES)
    assert completion.text == "stored text" and completion.forced and completion.info.forced_from == "stepped"
    read = TurnExtra.of_row(_stored(database, _turn(completion)))
    assert read.forced and read.info.forced_from == "stepped"


def test_a_known_key_is_refused_in_the_free_form_extra():
    with pytest.raises(ValidationError, match=r"set \['budget'\] on Completion.info"):
        Completion(text="x", extra={"budget": 64})


#: ``turns.extra`` as turn_row wrote it before ``Completion.info``: the backend's keys in ``backend``, the openai
#: reply's id as ``id``, and a key nothing reads
OLD_ROW = {
    **{k: v.model_dump(mode="json") if isinstance(v, OperatorAct) else v for k, v in TURN_VALUES.items()},
    **COMPLETION_VALUES,
    "backend": {**{k: v for k, v in INFO_VALUES.items() if k != "request_id"}, "id": "chatcmpl-1", "queue_ms": 12},
}


def test_a_row_stored_before_reads_into_the_typed_model(database):
    old = _stored_row(database, {"completion": "x", "extra": OLD_ROW})
    read = TurnExtra.of_row(old)
    assert read.info == CompletionInfo(**INFO_VALUES)
    assert read.backend == {"queue_ms": 12}
    for name, value in {**TURN_VALUES, **COMPLETION_VALUES}.items():
        assert getattr(read, name) == value, name


@pytest.mark.parametrize(
    ("extra", "action", "format_error"),
    [
        (None, None, True),  # no extra at all: every field at its default, no action read as a format error
        ({}, {"name": "finish", "arguments": {}}, False),
        ({"intervened": True, "someone_elses_key": [1]}, {"name": "finish", "arguments": {}}, False),
        ({"format_error": True}, {"name": "finish", "arguments": {}}, True),
    ],
)
def test_older_rows_with_fields_missing_or_unknown_read_with_defaults(extra, action, format_error):
    read = TurnExtra.read(extra)
    assert read.format_error_or(action) is format_error
    assert read.intervened is bool((extra or {}).get("intervened"))
    assert read.user_message is None and read.info == CompletionInfo() and read.backend == {}


def test_an_old_rows_backend_value_of_another_type_stays_free_form():
    read = TurnExtra.read({"backend": {"server_model": {"odd": "reply"}, "attempts": 1}})
    assert read.info == CompletionInfo(attempts=1) and read.backend == {"server_model": {"odd": "reply"}}
