"""Counterfactual replay rows: the stored token streams they read and the scores they write.

A replay teacher-forces a dense episode's stored stream (``turns.tokens``) through another method's cache
(``measure.replay``). Its row is keyed by what determines the result (source episode, method, scope, protocol
and the eviction settings, with the model and the dtype it was measured in, hashed into ``config_key``), so running
the same configuration again *replaces* the row (the newest measurement is the one that counts) while other
settings, and the same settings in another dtype, keep rows of their own::

    with db.session() as s:
        streams = replayable_token_streams(s, episode_id)  # None: the episode has no (complete) stored stream
    ...
    with db.session() as s:
        record_replay(s, source, method="snapkv", scope=..., protocol=..., config=cfg, status="ok", score=...)
    with db.session() as s:
        rows = replays_for_jobs(s, [job_id])
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Row, delete, select
from sqlalchemy.orm import Session

from agent_runner.measuring_dtypes import check_measuring_dtype
from db.connection import begin_write
from db.measure_models import Replay, ReplayStatus
from db.models import AGENT_EXIT_STATUSES, GRADE_STATUSES, Episode, Turn, utcnow
from db.store import result_attempts

#: the ReplayScore fields copied into a row's columns (``turns`` holds the per-turn dumps)
SCORE_FIELDS = ("tokens", "nll_mean", "top1", "turns", "seconds", "action")


def config_key(config: dict[str, Any], model: str | None = None, dtype: str | None = None) -> str:
    """sha256 hex of the canonical JSON of an eviction config (and, for a text trajectory's replay, the model it
    was scored on; and the dtype the measuring model ran in): equal settings, equal key. Without a dtype the key is
    the one stored before dtypes were recorded (the config alone, or ``{"config", "model"}``), so those keys stay
    valid; with one it is ``{"config", "model", "dtype"}``, so a float32 and a bfloat16 replay keep a row each."""
    if dtype is not None:
        keyed: Any = {"config": config, "model": model, "dtype": dtype}
    else:
        keyed = config if model is None else {"config": config, "model": model}
    text = json.dumps(keyed, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def replayable_token_streams(session: Session, episode_id: str) -> list[dict[str, Any]] | None:
    """The episode's per-turn token streams in turn order, or ``None`` when it has no turns or any turn lacks
    one (a backend that does not report tokens, or a run stored before they were kept): a stream with a hole
    cannot be replayed, since every later turn's context is built on the earlier ones."""
    streams = list(
        session.execute(select(Turn.tokens).where(Turn.episode_id == episode_id).order_by(Turn.index)).scalars()
    )
    if not streams or any(s is None for s in streams):
        return None
    return streams


def record_replay(
    session: Session,
    source: Episode,
    *,
    method: str,
    scope: str,
    protocol: str,
    config: dict[str, Any],
    status: str,
    error: str | None = None,
    score: dict[str, Any] | None = None,
    chunked: bool = True,
    model: str | None = None,
    dtype: str | None = None,
) -> Replay:
    """Store one replay of ``source`` (replacing the row of the same configuration, if any).

    ``score``: a ``ReplayScore.model_dump(mode="json")`` for an ``ok`` replay (its ``tokens``, ``nll_mean``,
    ``top1``, ``turns``, ``seconds`` and ``action`` become columns); ``error`` says why for ``failed`` / ``skipped``.
    ``model``: the model a text trajectory was rendered into (None: the source's own token stream). ``dtype``: the
    dtype the measuring model ran in (one of ``MEASURING_DTYPES``; None: not recorded); part of the key, so only the
    row of the same dtype is replaced."""
    ReplayStatus(status)  # a typo is an error here, not a CHECK failure halfway through a batch
    if dtype is not None:
        check_measuring_dtype(dtype)
    begin_write(session)
    key = config_key(config, model, dtype)
    session.execute(
        delete(Replay)
        .where(
            Replay.episode_id == source.id,
            Replay.method == method,
            Replay.scope == scope,
            Replay.protocol == protocol,
            Replay.config_key == key,
        )
        .execution_options(synchronize_session=False)
    )
    values = {name: (score or {}).get(name) for name in SCORE_FIELDS}
    row = Replay(
        job_id=source.job_id,
        episode_id=source.id,
        task_id=source.task_id,
        method=method,
        scope=scope,
        protocol=protocol,
        config_key=key,
        config=config,
        chunked=chunked,
        model=model,
        dtype=dtype,
        status=status,
        error=error,
        created_at=utcnow(),
        **values,
    )
    session.add(row)
    session.flush()
    return row


def replays_for_jobs(session: Session, job_ids: Sequence[str]) -> list[Replay]:
    """Every replay row of the given jobs, oldest first (so a later row of the same key wins in a dict)."""
    query = select(Replay).where(Replay.job_id.in_(list(job_ids))).order_by(Replay.created_at, Replay.id)
    return list(session.execute(query).scalars())


def replay_keys(session: Session, job_ids: Sequence[str]) -> list[Row]:
    """What identifies and qualifies each replay row of the given jobs, in one query and without its scores or
    per-turn dumps: ``episode_id``, ``method``, ``scope``, ``protocol``, ``config_key``, ``model``, ``dtype``,
    ``status`` and ``chunked`` (a planner's question: which configurations are already measured)."""
    columns = (
        Replay.episode_id,
        Replay.method,
        Replay.scope,
        Replay.protocol,
        Replay.config_key,
        Replay.model,
        Replay.dtype,
    )
    query = select(*columns, Replay.status, Replay.chunked).where(Replay.job_id.in_(list(job_ids)))
    return list(session.execute(query))


#: the statuses of an attempt whose trajectory is a whole sample of the agent: a verdict, or an agent exit (its grade
#: may still come, or its job does not grade). A run that broke (timeout, infra_failure), was cancelled or is still
#: running is not one.
SOURCE_STATUSES = GRADE_STATUSES | AGENT_EXIT_STATUSES


def is_replay_source(episode: Episode, method: str) -> bool:
    """Whether ``episode``, a key's result attempt (``db.store.result_attempts``: the first the agent drove alone
    that did not break; never an interactive or steered one, never a resample), is a trajectory of ``method`` (the
    one replayed: dense) that a replay may score: its status is in :data:`SOURCE_STATUSES`."""
    return episode.method == method and episode.status in SOURCE_STATUSES


def replay_sources(session: Session, job_ids: Sequence[str], *, method: str) -> list[Episode]:
    """The episodes a replay may score (:func:`is_replay_source` among the jobs' result attempts). Replay rows of
    any other episode (an attempt since superseded) are left out of every table."""
    return [e for e in result_attempts(session, job_ids) if is_replay_source(e, method)]
