"""The SQL schema of the service: jobs, their episodes (one row per attempt), the episodes' turns, and workers.

The measurement tables (replays, probe runs and their results) are ``db.measure_models``, on the same ``Base``.

Typed SQLAlchemy 2 declarative models. The schema itself is owned by the Alembic revisions in
``db/migrations/versions``; ``tests/db/test_db_models.py`` checks the two never drift apart.

Status words (``agent_runner.status.EpisodeStatus``, defined there once) are stored as short strings guarded by
CHECK constraints, so a typo is an error at write time; adding a status means adding it there *and* a migration
that widens the check.
All timestamps are timezone-aware UTC (SQLite keeps them naive; :class:`UTCDateTime` puts the zone back).
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    CheckConstraint,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, column_property, mapped_column, relationship

from agent_runner.status import EpisodeStatus  # the words are the runner's; stored and checked here
from db.packing import PackedJSON, PackedTokens


class JobStatus(StrEnum):
    pending = "pending"  # created, no episode claimed yet
    running = "running"  # at least one episode claimed, some not terminal
    done = "done"  # every episode terminal
    cancelled = "cancelled"
    # written by earlier versions when a job's episodes could not be sent; now a job's status always follows its
    # episodes (a failed send is a note in jobs.error and `nexus-eval resume JOB`), and any change recomputes it
    failed = "failed"


def _words(*members: EpisodeStatus) -> frozenset[str]:
    """The plain strings of ``members``: each word is spelled once, in ``agent_runner.status.EpisodeStatus``, and
    the sets below only name members (a misspelt member is an AttributeError at import, where a misspelt string
    was a silent miss)."""
    return frozenset(member.value for member in members)


# The sets every reader and writer uses; the words themselves are EpisodeStatus's.
GRADE_STATUSES = _words(
    EpisodeStatus.resolved, EpisodeStatus.unresolved, EpisodeStatus.empty_patch, EpisodeStatus.patch_failed
)
AGENT_EXIT_STATUSES = _words(
    EpisodeStatus.submitted,
    EpisodeStatus.step_limit,
    EpisodeStatus.context_limit,
    EpisodeStatus.time_limit,
    EpisodeStatus.format_error_limit,
)
# the agent exits at a limit: the patch graded is whatever the agent had left when the limit cut it off
LIMIT_EXIT_STATUSES = AGENT_EXIT_STATUSES - _words(EpisodeStatus.submitted)
# the run itself broke: final, and counted as "not resolved" (as SWE-bench counts an error) unless rerun; what
# `rerun --failed` reruns. A rerun of a verdict or an agent exit is a new sample of the same key, a *resample*:
# kept apart, never counted in Pass@1 (docs/numbers.md)
RUN_FAILURE_STATUSES = _words(EpisodeStatus.timeout, EpisodeStatus.infra_failure)
# an attempt that ended in one of these produced no sample: the key's next attempt takes its place as the key's
# result (db.store.result_attempts)
SERVICE_FAILURE_STATUSES = RUN_FAILURE_STATUSES | _words(EpisodeStatus.cancelled)
# what a finished run may report: an agent exit (a grade follows), a verdict graded in-line, or a failure
FINISH_STATUSES = AGENT_EXIT_STATUSES | GRADE_STATUSES | RUN_FAILURE_STATUSES
# what grading may record: a verdict, or infra_failure when grading itself could not run
VERDICT_STATUSES = GRADE_STATUSES | _words(EpisodeStatus.infra_failure)
# counted in compare's n: verdicts and run failures
COUNTED_STATUSES = GRADE_STATUSES | RUN_FAILURE_STATUSES
# Terminal = nothing more will happen to the row by itself. Agent exits are terminal for the agent stage
# (a grade may still be recorded on top of them).
TERMINAL_STATUSES = GRADE_STATUSES | AGENT_EXIT_STATUSES | SERVICE_FAILURE_STATUSES
ACTIVE_STATUSES = _words(EpisodeStatus.queued, EpisodeStatus.running)
# a job with an episode in one of these still has work to cancel (a run, or a grade to come)
CANCELLABLE_STATUSES = ACTIVE_STATUSES | AGENT_EXIT_STATUSES


class AttemptDriver(StrEnum):
    """Who chose an attempt's actions (``episodes.driver``); docs/service.md, "Steered attempts".

    Only ``agent`` attempts are the method's result: compare, the dashboard, the report, ``export`` and
    ``regrade`` count the newest ``agent`` attempt of each key unless told to count interactive ones too.
    """

    agent = "agent"  # run by the service (a job, ``rerun --status``): the model chose every action
    # ``rerun --interactive`` in which the model chose every live action and nothing else touched the container
    # (a person still picked the episode, usually a failed one, and the turn to resume from: not an independent
    # sample)
    interactive = "interactive"
    # ``rerun --interactive`` in which the operator changed anything the agent saw or the container holds: an
    # edited, skipped or stopped action, any shell opened in the container (nothing proves a shell changed
    # nothing), or a forced turn (``--from-turn``) that repeats a stored operator's edit, skip or stop
    steered = "steered"


#: the drivers whose attempts are the method's own result
AGENT_DRIVERS = frozenset({AttemptDriver.agent.value})


def is_interactive(driver: str) -> bool:
    """An attempt run with ``rerun --interactive`` (steered or not): shown apart, not the method's own sample."""
    return driver not in AGENT_DRIVERS


def new_id(n_hex: int = 12) -> str:
    """A short random id: ``n_hex`` hex digits of a uuid4 (8 for jobs, which people type; 12 for episodes)."""
    return uuid.uuid4().hex[:n_hex]


def utcnow() -> datetime:
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """A ``DateTime(timezone=True)`` that always hands back aware UTC datetimes (SQLite drops the zone)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is not None and value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r}: store timezone-aware UTC datetimes")
        return value.astimezone(UTC) if value is not None else None

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


# JSON on SQLite, JSONB on PostgreSQL (indexable, compact).
JSONType = JSON().with_variant(JSONB(), "postgresql")


def in_check(column: str, values: type[StrEnum]) -> str:
    """The CHECK that keeps ``column`` to the words of ``values`` (every status column, here and in
    ``db.measure_models``)."""
    return f"{column} IN ({', '.join(repr(v.value) for v in values)})"


class Base(DeclarativeBase):
    pass


class Job(Base):
    """One submitted job: a frozen JobSpec (``config``), its hash, and provenance."""

    __tablename__ = "jobs"
    __table_args__ = (CheckConstraint(in_check("status", JobStatus), name="ck_jobs_status"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=lambda: new_id(8))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)
    status: Mapped[str] = mapped_column(String(16), default=JobStatus.pending.value)
    name: Mapped[str | None] = mapped_column(String(200))
    config: Mapped[dict[str, Any]] = mapped_column(JSONType)  # JobSpec.model_dump(mode="json")
    config_hash: Mapped[str] = mapped_column(String(64), index=True)  # sha256 hex of canonical JSON
    package_versions: Mapped[dict[str, Any]] = mapped_column(JSONType, default=dict)
    git_revision: Mapped[str | None] = mapped_column(String(64))
    error: Mapped[str | None] = mapped_column(Text)
    # {status: number of episode keys whose newest attempt has it}, kept in step by every writer that changes an
    # episode's status (db.job_status.refresh_job_status), so a job's status and counts never scan its episodes
    counts: Mapped[dict[str, int] | None] = mapped_column(JSONType)

    episodes: Mapped[list[Episode]] = relationship(back_populates="job", cascade="all, delete-orphan")


class Episode(Base):
    """One attempt of one episode key (task x method x scope x protocol x seed).

    A rerun is a new row with ``attempt + 1``; rows are never reused for a new attempt. The claim columns
    (``worker``, ``claim_token``, ``heartbeat_at``, ``n_claims``) make execution idempotent: see
    :mod:`db.claims`.
    """

    __tablename__ = "episodes"
    __table_args__ = (
        UniqueConstraint(
            "job_id", "task_id", "method", "scope", "protocol", "seed", "attempt", name="uq_episode_attempt"
        ),
        CheckConstraint(in_check("status", EpisodeStatus), name="ck_episodes_status"),
        CheckConstraint("attempt >= 1", name="ck_episodes_attempt"),
        CheckConstraint(in_check("driver", AttemptDriver), name="ck_episodes_driver"),
        # covers the newest / result attempt subqueries (db.store, db.job_status): no table row is read for them
        Index("ix_episodes_job_key_attempt", "job_id", "episode_key", "attempt", "driver", "status"),
        Index("ix_episodes_job_status", "job_id", "status"),
        Index("ix_episodes_job_method", "job_id", "method"),
        Index("ix_episodes_job_task", "job_id", "task_id"),
        # the sweepers' look for messages taken by gone workers (db.taken_messages): only marked rows, a handful
        Index(
            "ix_episodes_taken",
            "status",
            postgresql_where=text("taken_by IS NOT NULL"),
            sqlite_where=text("taken_by IS NOT NULL"),
        ),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    task_id: Mapped[str] = mapped_column(String(200))
    method: Mapped[str] = mapped_column(String(64))
    scope: Mapped[str] = mapped_column(String(32))
    protocol: Mapped[str] = mapped_column(String(32))
    seed: Mapped[int] = mapped_column(Integer)
    attempt: Mapped[int] = mapped_column(Integer, default=1)
    driver: Mapped[str] = mapped_column(String(16), default=AttemptDriver.agent.value, server_default="agent")
    episode_key: Mapped[str] = mapped_column(String(400))  # see db.job_rows.episode_key
    status: Mapped[str] = mapped_column(String(32), default=EpisodeStatus.queued.value)
    exit_status: Mapped[str | None] = mapped_column(String(64))  # the agent loop's exit, as it reported it
    error: Mapped[str | None] = mapped_column(Text)  # why, for every status but resolved/unresolved

    patch: Mapped[str | None] = mapped_column(Text)
    test_log: Mapped[str | None] = mapped_column(Text)  # raw test output the grade was parsed from
    grader: Mapped[str | None] = mapped_column(String(100))
    grader_version: Mapped[str | None] = mapped_column(String(100))

    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime)  # last successful claim
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)  # agent stage finished
    graded_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    agent_s: Mapped[float | None] = mapped_column(Float)
    grade_s: Mapped[float | None] = mapped_column(Float)
    wall_s: Mapped[float | None] = mapped_column(Float)  # claim to agent finish, as the worker measured it

    prompt_tokens: Mapped[int | None] = mapped_column(BigInteger)  # sum over turns of the prompt length
    appended_tokens: Mapped[int | None] = mapped_column(BigInteger)
    generated_tokens: Mapped[int | None] = mapped_column(BigInteger)
    n_turns: Mapped[int | None] = mapped_column(Integer)
    # the largest KV bytes held / allocated at any moment of the episode: the max over its turns' peaks
    # (nexus.memory; None for backends without a cache and for rows stored before revision 0007)
    kv_peak_held_bytes: Mapped[int | None] = mapped_column(BigInteger)
    kv_peak_allocated_bytes: Mapped[int | None] = mapped_column(BigInteger)
    # summaries of the turns written at finish, so no job-level read loads turns (results.cost): the mean over
    # turns of kv_held_bytes, and of physical_after["mean"] / logical_length (None when no turn reports it)
    mean_kv_held_bytes: Mapped[float | None] = mapped_column(Float)
    kept_fraction: Mapped[float | None] = mapped_column(Float)

    worker: Mapped[str | None] = mapped_column(String(200))  # "hostname/pid/kernel" of the claim (db.process_identity)
    claim_token: Mapped[str | None] = mapped_column(String(32))
    heartbeat_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    n_claims: Mapped[int] = mapped_column(Integer, default=0)  # > 1 means a dead worker's run was taken over
    celery_task_id: Mapped[str | None] = mapped_column(String(64))
    # an agent exit's grade sent again by a sweeper (nobody had started it for Liveness.grade_resend_s): when, so it
    # is sent once per that bound (db.liveness.take_due_grade; revision 0012)
    grade_sent_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # the worker ("hostname/pid/kernel" of its main process: its ``workers`` row) that took the message of this queued
    # row and has not claimed it yet, and when; a sweeper sends the row again if that worker is gone (db.taken_messages;
    # revision 0013). Cleared by the claim and whenever the row is sent again
    taken_by: Mapped[str | None] = mapped_column(String(200))
    taken_at: Mapped[datetime | None] = mapped_column(UTCDateTime)

    config: Mapped[dict[str, Any]] = mapped_column(JSONType, default=dict)  # the full merged episode config
    result: Mapped[dict[str, Any] | None] = mapped_column(JSONType)  # extra result fields (grade report...)
    # the final cache's retention map {"logical_length", "kv_heads", "layers": per layer [[count, run], ...]}
    # (nexus.retention); None for backends without a cache and for runs that ended before the agent loop did
    # (stored packed: db.packing.PackedJSON, revision 0009)
    retention: Mapped[dict[str, Any] | None] = mapped_column(PackedJSON)

    job: Mapped[Job] = relationship(back_populates="episodes")
    turns: Mapped[list[Turn]] = relationship(
        back_populates="episode", cascade="all, delete-orphan", order_by="Turn.index"
    )

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES


# Values inside the JSON columns that a job-level read (compare) needs, read in SQL so it parses neither ``result``
# nor ``config`` per row: the grade's "the task needs the network" flag (None without a grade report), and the
# episode config's density, backend, sampler seed (``agent.seed``, set by versions before issue 19) and seed.
Episode.needs_network = column_property(Episode.result[("grade", "needs_network")].as_boolean())
Episode.config_density = column_property(Episode.config[("eviction", "density")].as_float())
Episode.config_backend = column_property(Episode.config["backend"].as_string())
Episode.config_agent_seed = column_property(Episode.config[("agent", "seed")].as_integer())
Episode.config_seed = column_property(Episode.config["seed"].as_integer())


class Turn(Base):
    """One agent turn's telemetry and content.

    ``physical_before/after`` are ``{"min", "mean", "max"}`` of the cache slots held per layer just before
    and after this turn's eviction (``None`` when the backend has no visible cache).

    KV memory (``nexus.memory``; ``None`` without a visible cache): ``kv_held_bytes`` (valid (layer, row, KV
    head, position) entries x (D_k + D_v) x element size) and ``kv_allocated_bytes`` (the K/V buffers, spare
    capacity and ragged padding included) after the turn; ``kv_peak_held_bytes`` / ``kv_peak_allocated_bytes``
    the largest of each during the turn (from before its prefill). Rows stored before revision 0007 have
    ``kv_allocated_bytes`` (then ``cache_bytes``) and NULL in the other three.
    """

    __tablename__ = "turns"
    __table_args__ = (UniqueConstraint("episode_id", "index", name="uq_turn_index"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    episode_id: Mapped[str] = mapped_column(ForeignKey("episodes.id", ondelete="CASCADE"), index=True)
    index: Mapped[int] = mapped_column(Integer)  # 0-based turn number
    tokens_appended: Mapped[int] = mapped_column(Integer, default=0)
    tokens_generated: Mapped[int] = mapped_column(Integer, default=0)
    prompt_tokens: Mapped[int] = mapped_column(Integer, default=0)
    logical_length: Mapped[int] = mapped_column(Integer, default=0)
    physical_before: Mapped[dict[str, float] | None] = mapped_column(JSONType)
    physical_after: Mapped[dict[str, float] | None] = mapped_column(JSONType)
    eviction_events: Mapped[int] = mapped_column(Integer, default=0)
    kv_held_bytes: Mapped[int | None] = mapped_column(BigInteger)
    kv_allocated_bytes: Mapped[int | None] = mapped_column(BigInteger)
    kv_peak_held_bytes: Mapped[int | None] = mapped_column(BigInteger)
    kv_peak_allocated_bytes: Mapped[int | None] = mapped_column(BigInteger)
    prefill_s: Mapped[float] = mapped_column(Float, default=0.0)
    decode_s: Mapped[float] = mapped_column(Float, default=0.0)
    tokens_per_s: Mapped[float | None] = mapped_column(Float)
    env_s: Mapped[float] = mapped_column(Float, default=0.0)
    completion: Mapped[str] = mapped_column(Text, default="")  # the raw model output
    thought: Mapped[str | None] = mapped_column(Text)
    # the parsed tool call ({"name", "arguments"}), None on a format error
    action: Mapped[dict[str, Any] | None] = mapped_column(JSONType)
    observation: Mapped[str | None] = mapped_column(Text)
    extra: Mapped[dict[str, Any]] = mapped_column(JSONType, default=dict)  # format_error, intervened, ...
    # the turn's token stream {"keep", "append", "generated"} (measure.counterfactual.TurnTokens) when the
    # backend reports one (hf); what counterfactual replay feeds through another method's cache. Stored packed
    # (db.packing.PackedTokens, revision 0009)
    tokens: Mapped[dict[str, Any] | None] = mapped_column(PackedTokens)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)

    episode: Mapped[Episode] = relationship(back_populates="turns")


class WorkerState(StrEnum):
    ok = "ok"  # taking episodes
    paused = "paused"  # not taking episodes: the Docker engine does not answer (``detail`` says why)
    gone = "gone"  # silent past Liveness.worker_gone_after_s: marked by another worker's sweep (db.liveness)


class WorkerRow(Base):
    """One worker process as it last reported itself (``workers.faults.sweeper``): what ``doctor`` and the dashboard
    show. A row whose ``seen_at`` is older than the liveness bound belongs to a worker that is gone: a sweeper marks
    it ``gone`` (``db.liveness.mark_gone_workers``), and its next report, if any, sets it back."""

    __tablename__ = "workers"
    __table_args__ = (CheckConstraint(in_check("state", WorkerState), name="ck_workers_state"),)

    name: Mapped[str] = mapped_column(String(200), primary_key=True)  # "hostname/pid/kernel" of the main process
    queues: Mapped[str] = mapped_column(String(200))
    state: Mapped[str] = mapped_column(String(16), default=WorkerState.ok.value)
    detail: Mapped[str | None] = mapped_column(Text)  # why it is paused; what its last sweep recovered
    started_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    seen_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    state_since: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
