"""The stored-record format of a run: how a ``TurnRecord`` becomes a ``turns`` row, and how the runner's record of
what ran is kept in ``episodes.result["runner"]`` and read back.

Kept apart from running (``workers.execution``) because the format is what readers depend on: replay, the text
replay job, the exports and the tests write turns exactly as a worker does by calling :func:`turn_row`, and a
stored row's spec is read back with :func:`runner_spec`, whatever wrote it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from agent_runner import spec_diff
from results.turn_data import TurnExtra

if TYPE_CHECKING:
    from agent_runner.records import TurnRecord


#: the completion fields that have columns of their own (``db.models.Turn``; the turn's: index, thought, action,
#: observation, env_s); every other field of the turn and of its completion is ``results.turn_data.TurnExtra``
_COMPLETION_COLUMNS = {
    *("text", "tokens", "tokens_appended", "tokens_generated", "prompt_tokens", "logical_length"),
    *("physical_before", "physical_after", "eviction_events", "prefill_s", "decode_s", "tokens_per_s"),
    *("kv_held_bytes", "kv_allocated_bytes", "kv_peak_held_bytes", "kv_peak_allocated_bytes"),
}


def turn_row(turn: TurnRecord) -> dict[str, Any]:
    """A ``TurnRecord`` -> the ``db.models.Turn`` columns ``record_turn`` takes, the record stored whole: the
    fields queried by SQL are columns, every other field of the turn and of its completion goes into ``extra`` as
    ``results.turn_data.TurnExtra`` (typed, under its own name; ``Completion.info`` under ``info``, the backend's
    free-form ``Completion.extra`` under ``backend``), which every reader parses back."""
    c = turn.completion
    dumped = c.model_dump(mode="json")
    return {
        **{name: dumped[name] for name in _COMPLETION_COLUMNS if name not in ("text", "tokens")},
        "env_s": turn.env_s,
        "completion": c.text,
        "thought": turn.thought,
        "action": turn.action.model_dump(mode="json") if turn.action else None,
        "observation": turn.observation,
        "tokens": dumped["tokens"],  # the token stream counterfactual replay feeds (None without one)
        "extra": TurnExtra.of(turn).stored(turn.observation),
    }


def runner_record(config: dict[str, Any], ran: dict[str, Any]) -> dict[str, Any]:
    """The runner's record of what ran (``EpisodeResult.config``) as it is stored: the spec the worker ran is kept
    as what it changed from the episode's ``config`` (most runs change only the device), the rest as it came."""
    record = dict(ran)
    if "episode" in record:
        record["episode_changes"] = spec_diff.changes(config, record.pop("episode"))
    return record


def runner_spec(config: dict[str, Any], result: dict[str, Any] | None) -> dict[str, Any] | None:
    """The episode spec as the worker ran it, from an episode's ``config`` and ``result`` (``None``: the run did not
    start). Rows stored before the record was kept as changes hold the spec whole."""
    runner = (result or {}).get("runner")
    if runner is None:
        return None
    if "episode" in runner:
        return runner["episode"]
    return spec_diff.apply(config, runner.get("episode_changes") or {})
