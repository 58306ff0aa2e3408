"""One episode's page, read-only: its turns (text and telemetry, not the token streams), patch, grading log and
siblings, as plain objects (see :mod:`dashboard.queries` for the session rules), and where two trajectories
diverge (the side-by-side page).

Long texts are cut to what a page can show (:data:`MAX_SHOWN_CHARS`, the log's tail :data:`MAX_LOG_CHARS`); the
cut says how much is left off, and ``nexus-eval inspect --json`` has the whole of it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from sqlalchemy import LargeBinary, select, type_coerce
from sqlalchemy.orm import Session, defer

from dashboard.queries import EpisodeRow, episode_row
from db import episode_lists
from db import store as db_store
from db.models import Episode, Turn, is_interactive
from db.packing import packed_keep
from env.grading.hostlog import unpack
from results.turn_data import TurnExtra

SHORT_TURN_CHARS = 1500  # a turn whose texts are shorter than this is shown open
MAX_SHOWN_CHARS = 20_000  # one observation / thought on the page; `nexus-eval inspect --json` has it whole
MAX_LOG_CHARS = 200_000  # the grading log's tail (the test results are at its end)


@dataclass
class TurnView:
    """One turn as the page shows it: its call, texts (cut), token counts, cache telemetry and what an operator did."""

    index: int
    action: dict[str, Any] | None
    action_name: str
    action_json: str
    format_error: bool
    thought: str
    observation: str
    completion: str
    intervened: bool
    tokens_appended: int
    tokens_generated: int
    logical_length: int
    physical_before: dict[str, float] | None
    physical_after: dict[str, float] | None
    eviction_events: int
    kv_held_bytes: int | None  # KV memory (nexus.memory): after the turn, and the largest during it
    kv_allocated_bytes: int | None
    kv_peak_held_bytes: int | None
    kv_peak_allocated_bytes: int | None
    prefill_s: float
    decode_s: float
    tokens_per_s: float | None
    prompt_tokens: int = 0  # the prompt this call conditioned on (logical)
    keep: int | None = None  # Turn.tokens["keep"]: the previous stream's tokens this turn's context starts with
    # the assistant text as generated (Turn.completion), its first MAX_SHOWN_CHARS (a replay's spans index it)
    text: str = ""
    text_cut: int = 0  # characters left off its end
    forced: bool = False  # teacher-forced from a stored attempt's turn (``rerun --from-turn``)
    # what the operator did at this turn of an interactive rerun (``agent_runner.records.OperatorAct``), else None
    operator: Any = None
    proposed_json: str = ""  # the model's own action when the operator replaced or skipped it

    @property
    def skipped(self) -> bool:
        return self.operator is not None and self.operator.choice == "skip"

    @property
    def is_short(self) -> bool:
        return len(self.thought) + len(self.observation) + len(self.action_json) <= SHORT_TURN_CHARS

    @property
    def divergence_key(self) -> tuple[bool, str]:
        """What two trajectories must share at a turn to count as not yet diverged: the parsed call (name and
        arguments) and whether the completion was a format error."""
        return self.format_error, json.dumps(self.action, sort_keys=True)


@dataclass
class EpisodeView:
    """One episode's page: its grid row, outcome, cost, patch, the grading log's tail, turns and siblings."""

    row: EpisodeRow
    job_id: str
    exit_status: str | None
    error: str | None
    n_turns: int | None
    generated_tokens: int | None
    kv_peak_held_bytes: int | None
    kv_peak_allocated_bytes: int | None
    agent_s: float | None
    patch: str | None
    test_log: str
    test_log_cut: int  # characters left off the front of the shown log
    grader: str | None
    grader_version: str | None
    retention: dict[str, Any] | None
    turns: list[TurnView]
    siblings: list[EpisodeRow]


def _clip(text: str | None) -> str:
    text = text or ""
    if len(text) <= MAX_SHOWN_CHARS:
        return text
    return text[:MAX_SHOWN_CHARS] + f"\n… ({len(text) - MAX_SHOWN_CHARS} more characters: nexus-eval inspect --json)"


def _proposed_json(extra: TurnExtra) -> str:
    """The model's own action of a turn whose action the operator replaced or skipped, as the page shows it."""
    proposed = extra.operator.proposed if extra.operator is not None else None
    return json.dumps(proposed.model_dump(mode="json"), indent=2, ensure_ascii=False) if proposed is not None else ""


def _turn_view(t: Turn, keep: int | None = None) -> TurnView:
    extra = TurnExtra.of_row(t)
    action = t.action
    return TurnView(
        index=t.index,
        action=action,
        action_name=(action or {}).get("name") or "(no call)",
        action_json=json.dumps(action, indent=2, ensure_ascii=False) if action is not None else "",
        format_error=extra.format_error_or(action),
        thought=_clip(t.thought),
        observation=_clip(t.observation),
        completion=_clip(t.completion) if action is None or extra.replaced else "",
        intervened=extra.replaced,
        tokens_appended=t.tokens_appended or 0,
        tokens_generated=t.tokens_generated or 0,
        logical_length=t.logical_length or 0,
        physical_before=t.physical_before,
        physical_after=t.physical_after,
        eviction_events=t.eviction_events or 0,
        kv_held_bytes=t.kv_held_bytes,
        kv_allocated_bytes=t.kv_allocated_bytes,
        kv_peak_held_bytes=t.kv_peak_held_bytes,
        kv_peak_allocated_bytes=t.kv_peak_allocated_bytes,
        prefill_s=t.prefill_s or 0.0,
        decode_s=t.decode_s or 0.0,
        tokens_per_s=t.tokens_per_s,
        prompt_tokens=t.prompt_tokens or 0,
        keep=keep,
        text=(t.completion or "")[:MAX_SHOWN_CHARS],
        text_cut=max(0, len(t.completion or "") - MAX_SHOWN_CHARS),
        forced=extra.forced,
        operator=extra.operator,
        proposed_json=_proposed_json(extra),
    )


def siblings(session: Session, e: Episode) -> list[EpisodeRow]:
    """The result attempts (the first the agent drove alone that did not break) of the same job, task and seed under
    the other methods / scopes / protocols."""
    rows = session.execute(
        select(*episode_lists.ROW_COLUMNS, Episode.episode_key).where(
            Episode.job_id == e.job_id, Episode.task_id == e.task_id, Episode.seed == e.seed
        )
    )
    newest: dict[str, Any] = {}
    for r in rows:
        if r.episode_key == e.episode_key or is_interactive(r.driver):
            continue
        if r.episode_key not in newest or r.attempt > newest[r.episode_key].attempt:
            newest[r.episode_key] = r
    return [episode_row(r) for _, r in sorted(newest.items())]


def episode(session: Session, episode_id: str) -> EpisodeView:
    """One episode (id or unique prefix) with its turns, patch, grading log and siblings."""
    e = db_store.get_episode(session, episode_id)
    # not the token streams (Turn.tokens, the largest column): the page shows text and telemetry only
    turns = session.execute(
        select(Turn).where(Turn.episode_id == e.id).order_by(Turn.index).options(defer(Turn.tokens))
    ).scalars()
    # ... but where each turn's new tokens start in the stream (the retention map's turn marks): one number each
    keep = select(Turn.index, type_coerce(Turn.tokens, LargeBinary)).where(Turn.episode_id == e.id)
    keeps: dict[int, int | None] = {index: packed_keep(stored) for index, stored in session.execute(keep)}
    log = unpack(e.test_log)
    cut = max(0, len(log) - MAX_LOG_CHARS)
    return EpisodeView(
        row=episode_row(e),
        job_id=e.job_id,
        exit_status=e.exit_status,
        error=e.error,
        n_turns=e.n_turns,
        generated_tokens=e.generated_tokens,
        kv_peak_held_bytes=e.kv_peak_held_bytes,
        kv_peak_allocated_bytes=e.kv_peak_allocated_bytes,
        agent_s=e.agent_s,
        patch=e.patch,
        test_log=log[cut:],
        test_log_cut=cut,
        grader=e.grader,
        grader_version=e.grader_version,
        retention=getattr(e, "retention", None),  # episodes.retention (migration 0003); None before it
        turns=[_turn_view(t, keeps.get(t.index)) for t in turns],
        siblings=siblings(session, e),
    )


def divergence(a: list[TurnView], b: list[TurnView]) -> int | None:
    """The first turn index where two trajectories differ (call, format error, or one has ended); None if equal."""
    for i in range(max(len(a), len(b))):
        if i >= len(a) or i >= len(b) or a[i].divergence_key != b[i].divergence_key:
            return i
    return None
