"""The measurement tables: counterfactual replays and quality-probe runs with their results.

They sit beside the service's own tables (``db.models``: jobs, episodes, turns, workers) and share its ``Base``, so
Alembic's metadata holds every table: ``db/migrations/env.py`` and ``tests/db/test_db_models.py`` import this
module for that. Kept apart because only the measuring code (``measure``, ``db.replays``, ``db.probes``) writes
them; a replay row points at a stored episode, a probe run at nothing in the service.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import Mapped, mapped_column, relationship

from db.models import Base, JSONType, UTCDateTime, in_check, new_id, utcnow


class ReplayStatus(StrEnum):
    ok = "ok"
    failed = "failed"  # the replay broke (the error says how); rerun it
    skipped = "skipped"  # the stream cannot be replayed this way (e.g. a full_context stream under true_eviction)


class Replay(Base):
    """One counterfactual replay: a dense episode's stored token stream teacher-forced through one method's
    cache (``measure.counterfactual``), scored by how well the model still predicts its own completions.

    One row per (source episode, method, scope, protocol, eviction settings, model, dtype): ``config_key`` is the
    hash of ``config`` (the ``nexus.EvictionConfig`` used) with the model and dtype it was measured on, so a rerun
    of the same configuration replaces its row while a replay under other settings (or in another dtype) gets a row
    of its own. ``turns`` holds the ``TurnScore`` dumps.
    """

    __tablename__ = "replays"
    __table_args__ = (
        UniqueConstraint("episode_id", "method", "scope", "protocol", "config_key", name="uq_replay_config"),
        CheckConstraint(in_check("status", ReplayStatus), name="ck_replays_status"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    episode_id: Mapped[str] = mapped_column(ForeignKey("episodes.id", ondelete="CASCADE"), index=True)
    task_id: Mapped[str] = mapped_column(String(200))
    method: Mapped[str] = mapped_column(String(64))
    scope: Mapped[str] = mapped_column(String(32))
    protocol: Mapped[str] = mapped_column(String(32))
    config_key: Mapped[str] = mapped_column(String(64))  # sha256 hex of the canonical JSON of ``config``
    config: Mapped[dict[str, Any]] = mapped_column(JSONType)  # the EvictionConfig as stored in an episode config
    chunked: Mapped[bool] = mapped_column(Boolean, default=True)  # False: fed token by token (--token-by-token)
    status: Mapped[str] = mapped_column(String(16))
    error: Mapped[str | None] = mapped_column(Text)
    tokens: Mapped[int | None] = mapped_column(Integer)  # completion tokens scored
    nll_mean: Mapped[float | None] = mapped_column(Float)  # over every scored token of the episode
    top1: Mapped[float | None] = mapped_column(Float)  # share of stored tokens that were the model's argmax
    turns: Mapped[list[dict[str, Any]] | None] = mapped_column(JSONType)  # TurnScore dumps, one per scored turn
    seconds: Mapped[float | None] = mapped_column(Float)
    # a text trajectory's replay: the model it was rendered into and scored on (part of config_key); NULL for a
    # token-stream replay (the source's own model). ``action``: its ActionSummary (measure.action_scores)
    model: Mapped[str | None] = mapped_column(String(200))
    action: Mapped[dict[str, Any] | None] = mapped_column(JSONType)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    # the dtype the measuring model ran in (agent_runner.measuring_dtypes.MEASURING_DTYPES: float32 | bfloat16; part of
    # config_key beside ``model``); NULL for a row stored before it was recorded: "not recorded", never guessed
    dtype: Mapped[str | None] = mapped_column(String(16))


class ProbeRunStatus(StrEnum):
    pending = "pending"  # stored, the model not loaded yet
    running = "running"  # results arriving
    done = "done"  # every planned result stored
    failed = "failed"  # stopped early (probe_runs.error says why); the results stored before it stay


class ProbeRun(Base):
    """One quality-probe run (``nexus-eval probe run``, ``measure.probes``): its ``ProbeSettings`` dump,
    what produced the numbers (``provenance``: the filler corpus fingerprint, package versions, git revision,
    device) and how far it got (``n_results`` of ``n_planned``)."""

    __tablename__ = "probe_runs"
    __table_args__ = (CheckConstraint(in_check("status", ProbeRunStatus), name="ck_probe_runs_status"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=lambda: new_id(8))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    status: Mapped[str] = mapped_column(String(16), default=ProbeRunStatus.pending.value)
    error: Mapped[str | None] = mapped_column(Text)  # the first cause of a failed run (first line: the message)
    model: Mapped[str] = mapped_column(String(200))
    settings: Mapped[dict[str, Any]] = mapped_column(JSONType)  # ProbeSettings.model_dump(mode="json")
    provenance: Mapped[dict[str, Any]] = mapped_column(JSONType, default=dict)
    n_planned: Mapped[int] = mapped_column(Integer, default=0)  # results the settings ask for
    n_results: Mapped[int] = mapped_column(Integer, default=0)  # results stored so far

    results: Mapped[list[ProbeResultRow]] = relationship(
        back_populates="run", cascade="all, delete-orphan", order_by="ProbeResultRow.id"
    )


class ProbeResultRow(Base):
    """One ``measure.probes.ProbeResult``: one sample of one (probe, variant, scope, protocol, density)
    cell, every field a column of the same name (``db.probes.RESULT_FIELDS``)."""

    __tablename__ = "probe_results"
    __table_args__ = (
        UniqueConstraint(
            "run_id", "probe", "variant", "scope", "protocol", "density", "sample", name="uq_probe_result"
        ),
        Index("ix_probe_results_run_probe", "run_id", "probe"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("probe_runs.id", ondelete="CASCADE"))
    probe: Mapped[str] = mapped_column(String(32))
    variant: Mapped[str] = mapped_column(String(200))  # a method, optionally with settings: nexus(lam=0)
    scope: Mapped[str] = mapped_column(String(32))
    protocol: Mapped[str] = mapped_column(String(32))  # single_prefill for needle and nll
    density: Mapped[float] = mapped_column(Float)
    sample: Mapped[int] = mapped_column(Integer)  # the same text in every cell of the run: the pairing key
    source: Mapped[str] = mapped_column(String(32))
    length: Mapped[int] = mapped_column(Integer)
    depth: Mapped[float | None] = mapped_column(Float)
    correct: Mapped[bool | None] = mapped_column(Boolean)  # None for nll
    nll: Mapped[float | None] = mapped_column(Float)  # None for needle
    scored_tokens: Mapped[int] = mapped_column(Integer)
    answer: Mapped[str] = mapped_column(Text)
    expected: Mapped[str] = mapped_column(Text)
    kept_fraction: Mapped[float] = mapped_column(Float)
    # KV memory (nexus.memory) at answer start, and the peaks over the sample (None before revision 0007)
    kv_held_bytes: Mapped[int | None] = mapped_column(BigInteger)
    kv_allocated_bytes: Mapped[int] = mapped_column(BigInteger)
    kv_peak_held_bytes: Mapped[int | None] = mapped_column(BigInteger)
    kv_peak_allocated_bytes: Mapped[int | None] = mapped_column(BigInteger)
    seconds: Mapped[float] = mapped_column(Float)

    run: Mapped[ProbeRun] = relationship(back_populates="results")
