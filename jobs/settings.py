"""The service's settings, read once from the environment: where the broker and results live, what a job may
make a worker send, the operator's grading ceilings, and the timing of liveness. The Celery app built from
them is :mod:`jobs.queue`.

Queues: ``gpu`` runs episodes (the model lives in the worker process, loaded lazily on the first task; one
process per GPU: ``--pool prefork --concurrency 1`` or ``--pool solo``), ``grade`` grades patches in fresh
containers (CPU nodes), ``default`` takes the small bookkeeping tasks.

Where things live, from the environment (see :class:`ServiceSettings`):

- ``NEXUS_EVAL_BROKER``: ``redis://host:6379/0`` for a real deployment. Unset: the *embedded* broker, a
  SQLite file through kombu's SQLAlchemy transport (``sqla+sqlite:////abs/runs/celery-broker.db``) beside
  the results database, so ``nexus-eval run`` needs no service at all.
- ``NEXUS_EVAL_DB``: the results database (``db.connection.default_url``); SQLite file or PostgreSQL URL.
  It is the source of truth; the Celery result backend only carries the live PROGRESS state.
- ``NEXUS_EVAL_RESULT_BACKEND``: defaults to the Redis broker's URL, or ``db+sqlite:///.../celery-results.db``
  for the embedded broker.

What a job may make the worker send, and where (``backend: openai``; the operator's choice, never the job's):

- ``NEXUS_EVAL_OPENAI_HOSTS``: comma-separated hosts (or globs) a job's ``openai.base_url`` may name; default
  loopback only (``agent_runner.backend_settings.DEFAULT_HOSTS``).
- ``NEXUS_EVAL_OPENAI_KEY_ENVS``: comma-separated variable names (or globs) a job's ``openai.api_key_env`` may
  name, whose value is sent as the Bearer key; default ``OPENAI_API_KEY,*_API_KEY`` (``DEFAULT_KEY_ENVS``).

Reliability settings (the reasons are in docs/service.md): late acks, prefetch 1, reject on worker loss, a
broker visibility timeout above the hard time limit (otherwise Redis redelivers a long episode while it is
still running), soft and hard time limits, ``task_track_started`` and ``result_extended``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

from agent_runner.backend_settings import (
    DEFAULT_HOSTS,
    DEFAULT_KEY_ENVS,
    HOSTS_VARIABLE,
    KEY_ENVS_VARIABLE,
    AllowedEndpoints,
)
from db.connection import default_url
from env.tasks.ceilings import DEFAULT_CEILINGS, GradingCeilings


@dataclass(frozen=True)
class Liveness:
    """The timing of liveness, defined here once (:class:`ServiceSettings` takes its defaults).

    heartbeat_s:   a held episode is marked alive this often.
    stale_after_s: a holder silent this long is gone and its episode is taken over (10 missed beats: a
                   worker under load or a database blip is not mistaken for a dead one; short enough that a
                   crashed worker's episode restarts within about 3 minutes, sweep included).
    sweep_s:       each worker looks for stranded episodes this often.
    db_retry_s:    a database call is retried this long before the message is requeued.
    grade_resend_s: an agent exit that nobody has started grading this long after it finished (or after its
                   grade was last sent) has its grade sent again by a sweeper, once per this many seconds: a
                   hand-off the broker lost is found. Long enough that a grade waiting in a busy ``grade``
                   queue is rarely sent twice (a duplicate finds it claimed or graded and does nothing), and above
                   the hand-off's own retries through a broker outage (``jobs.queue.publish_window_s``, 117 s).
    """

    heartbeat_s: float = 15.0
    stale_after_s: float = 150.0
    sweep_s: float = 30.0
    db_retry_s: float = 120.0
    grade_resend_s: float = 600.0

    @property
    def worker_gone_after_s(self) -> float:
        """A worker whose row in the ``workers`` table (written every sweep) is older than this is marked gone:
        the holders' bound, and never under 3 sweeps (what ``doctor`` counts as present)."""
        return max(self.stale_after_s, 3 * self.sweep_s)


LIVENESS = Liveness()


def _runs_dir(db_url: str) -> Path:
    """The folder of the SQLite results file (embedded broker files go beside it), else ./runs."""
    if db_url.startswith("sqlite:///"):
        return Path(db_url.removeprefix("sqlite:///")).parent
    return Path("runs").resolve()


#: the environment variable of each setting read as text (unset or empty: None)
_TEXT_VARIABLES = {
    "broker_url": "NEXUS_EVAL_BROKER",
    "result_backend": "NEXUS_EVAL_RESULT_BACKEND",
    "device": "NEXUS_EVAL_DEVICE",
}
#: the environment variable of each setting read as a number (``*_s``: seconds), named in its error
_VARIABLES = {
    "episodes_per_gpu": "NEXUS_EVAL_EPISODES_PER_GPU",
    "infra_retries": "NEXUS_EVAL_INFRA_RETRIES",
    "soft_time_limit_s": "NEXUS_EVAL_SOFT_TIME_LIMIT",
    "hard_time_limit_s": "NEXUS_EVAL_HARD_TIME_LIMIT",
    "visibility_timeout_s": "NEXUS_EVAL_VISIBILITY_TIMEOUT",
    "stale_after_s": "NEXUS_EVAL_STALE_AFTER",
    "heartbeat_s": "NEXUS_EVAL_HEARTBEAT",
    "sweep_s": "NEXUS_EVAL_SWEEP",
    "db_retry_s": "NEXUS_EVAL_DB_RETRY",
    "grade_resend_s": "NEXUS_EVAL_GRADE_RESEND",
    "docker_wait_s": "NEXUS_EVAL_DOCKER_WAIT",
}
#: the operator's grading ceilings (``env.tasks.ceilings.GradingCeilings`` fields) and their variables
_CEILING_VARIABLES = {
    "memory": "NEXUS_EVAL_GRADING_MAX_MEMORY",
    "pids": "NEXUS_EVAL_GRADING_MAX_PIDS",
    "cpus": "NEXUS_EVAL_GRADING_MAX_CPUS",
    "timeout_s": "NEXUS_EVAL_GRADING_MAX_TIMEOUT",
    "allow_network": "NEXUS_EVAL_GRADING_NETWORK",
}
#: the environment variable of each setting read as a comma-separated list
_LIST_VARIABLES = {"openai_key_envs": KEY_ENVS_VARIABLE, "openai_hosts": HOSTS_VARIABLE}
#: every variable :meth:`ServiceSettings.from_env` reads: the one reader of each (``NEXUS_EVAL_DB`` through
#: ``db.connection.default_url``, which it calls); everything else gets the values from a ``ServiceSettings``
ENV_VARIABLES: tuple[str, ...] = (
    *_TEXT_VARIABLES.values(),
    "NEXUS_EVAL_DB",
    *_VARIABLES.values(),
    *_CEILING_VARIABLES.values(),
    *_LIST_VARIABLES.values(),
)


def _say(error: dict) -> str:
    """One pydantic error as a sentence that names the setting (and its variable) it is about."""
    message = error["msg"].removeprefix("Value error, ")
    if not error.get("loc"):
        return message  # a check across settings names them itself
    field = str(error["loc"][0])
    variable = _VARIABLES.get(field) or _LIST_VARIABLES.get(field)
    where = f"{field} (${variable})" if variable else field
    return f"{where}={error.get('input')!r}: {message}"


class ServiceSettings(BaseModel):
    """The service's deployment settings; :meth:`from_env` reads ``NEXUS_EVAL_*`` variables."""

    broker_url: str | None = Field(None, description="redis://... ; None: the embedded SQLite broker")
    db_url: str = Field(default_factory=default_url, description="the results database URL")
    result_backend: str | None = Field(None, description="Celery's PROGRESS store; None: derived")
    soft_time_limit_s: float = Field(4 * 3600.0, gt=0, description="episode: save partial, mark timeout")
    hard_time_limit_s: float = Field(4 * 3600.0 + 600.0, gt=0, description="episode: the process is killed")
    visibility_timeout_s: float | None = Field(
        None, gt=0, description="Redis redelivery window; None: hard limit + 1 h"
    )
    heartbeat_s: float = Field(
        LIVENESS.heartbeat_s, gt=0, description="how often a worker marks the episode it holds alive"
    )
    stale_after_s: float = Field(
        LIVENESS.stale_after_s, gt=0, description="an episode (run or grade) whose heartbeat is older is taken over"
    )
    sweep_s: float = Field(LIVENESS.sweep_s, gt=0, description="how often each worker looks for stranded episodes")
    db_retry_s: float = Field(
        LIVENESS.db_retry_s, gt=0, description="how long a database call is retried before the message is requeued"
    )
    grade_resend_s: float = Field(
        LIVENESS.grade_resend_s, gt=0, description="an agent exit whose grade nobody started this long is sent again"
    )
    docker_wait_s: float = Field(
        300.0, gt=0, description="how long a task waits for Docker before it requeues its message"
    )
    infra_retries: int = Field(
        2, ge=0, description="new attempts made automatically for an infra_failure (each kept as an attempt)"
    )
    episodes_per_gpu: int = Field(
        1, description="episodes a gpu worker process decodes together on its one model (docs/engine.md)"
    )
    device: str | None = Field(
        None, description="this worker host's device for the model (cuda:1 ...); None: the job's ModelSpec.device"
    )
    openai_key_envs: tuple[str, ...] = Field(
        DEFAULT_KEY_ENVS,
        description="variables (names or globs) a job's openai.api_key_env may name: their value is sent as the key",
    )
    openai_hosts: tuple[str, ...] = Field(
        DEFAULT_HOSTS, description="hosts (names or globs) a job's openai.base_url may send requests to"
    )

    grading_ceilings: GradingCeilings | None = Field(
        None,
        description="the most a task row's `grading` block may ask for; None: the defaults, the test-run limit "
        "held under soft_time_limit_s",
    )

    @field_validator("openai_key_envs", "openai_hosts", mode="before")
    @classmethod
    def _names(cls, value: object) -> object:
        """A comma-separated string (the variable) or a sequence; each entry stripped, empty ones dropped."""
        if isinstance(value, str):
            value = value.split(",")
        if isinstance(value, list | tuple):
            return tuple(str(v).strip() for v in value if str(v).strip())
        return value

    @field_validator("openai_key_envs")
    @classmethod
    def _key_patterns(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        bad = [v for v in value if not all(c.isalnum() or c in "_*?[]!" for c in v)]
        if bad:
            raise ValueError(f"{bad} are not variable names or globs of them (letters, digits, _, * ? [ ])")
        return value

    @field_validator("openai_hosts")
    @classmethod
    def _host_patterns(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        bad = [v for v in value if any(c in v for c in "/@?# ")]
        if bad:
            raise ValueError(f"{bad} are not host names (give hosts only, without scheme, path or credentials)")
        return tuple(v.lower() for v in value)

    @field_validator("episodes_per_gpu", mode="before")
    @classmethod
    def _whole_rows(cls, value: object) -> int:
        try:
            rows = int(str(value))
        except ValueError:
            rows = 0
        if rows < 1:
            raise ValueError("must be a whole number >= 1")
        return rows

    @model_validator(mode="after")
    def _ordered(self) -> ServiceSettings:
        if self.hard_time_limit_s <= self.soft_time_limit_s:
            raise ValueError(
                f"hard_time_limit_s ({self.hard_time_limit_s}) must exceed soft_time_limit_s "
                f"({self.soft_time_limit_s}) so the soft limit can save the partial trajectory"
            )
        if self.stale_after_s < 4 * self.heartbeat_s:
            raise ValueError(
                f"stale_after_s ({self.stale_after_s}) must be at least 4 heartbeats ({self.heartbeat_s} s each), "
                "or a worker that misses one beat under load is taken over while it is alive"
            )
        if self.sweep_s > self.stale_after_s:
            raise ValueError(f"sweep_s ({self.sweep_s}) must not exceed stale_after_s ({self.stale_after_s})")
        if self.grading_ceilings is None:  # the default ceiling, held under this worker's own time limit
            timeout = min(DEFAULT_CEILINGS.timeout_s, 0.9 * self.soft_time_limit_s)
            self.grading_ceilings = DEFAULT_CEILINGS.model_copy(update={"timeout_s": timeout})
        elif self.grading_ceilings.timeout_s >= self.soft_time_limit_s:
            raise ValueError(
                f"grading_ceilings.timeout_s ($NEXUS_EVAL_GRADING_MAX_TIMEOUT={self.grading_ceilings.timeout_s}) must "
                f"be below soft_time_limit_s ({self.soft_time_limit_s}), or a task's test run outlives its worker"
            )
        if self.visibility_timeout_s is not None and self.visibility_timeout_s <= self.hard_time_limit_s:
            raise ValueError(
                f"visibility_timeout_s ({self.visibility_timeout_s}) must exceed hard_time_limit_s "
                f"({self.hard_time_limit_s}), or Redis redelivers episodes that are still running"
            )
        return self

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: object) -> ServiceSettings:
        """The settings from ``NEXUS_EVAL_*`` variables (``environ``, default ``os.environ``: the one place
        they are read), then ``overrides`` (a command's flags: ``db_url``, ``episodes_per_gpu``, ``device``)
        on top; every value validated. The variables: BROKER, RESULT_BACKEND, DB, EPISODES_PER_GPU, DEVICE,
        SOFT_TIME_LIMIT, HARD_TIME_LIMIT, VISIBILITY_TIMEOUT, STALE_AFTER, HEARTBEAT, SWEEP, DB_RETRY, GRADE_RESEND,
        DOCKER_WAIT, INFRA_RETRIES (docs/service.md, "Faults"); OPENAI_KEY_ENVS, OPENAI_HOSTS (comma-separated names
        or globs; unset or empty: the defaults); GRADING_MAX_MEMORY, GRADING_MAX_PIDS, GRADING_MAX_CPUS,
        GRADING_MAX_TIMEOUT, GRADING_NETWORK (the grading ceilings; unset: the defaults)."""
        env = os.environ if environ is None else environ
        values: dict[str, object] = {field: env.get(var) or None for field, var in _TEXT_VARIABLES.items()}
        values["db_url"] = default_url(env)
        values.update({field: env[var] for field, var in _LIST_VARIABLES.items() if env.get(var, "").strip()})
        ceilings = {field: env[var].strip() for field, var in _CEILING_VARIABLES.items() if env.get(var, "").strip()}
        if ceilings:
            try:
                values["grading_ceilings"] = GradingCeilings(**ceilings)
            except ValidationError as exc:
                bad = exc.errors()[0]
                var = _CEILING_VARIABLES.get(str(bad["loc"][0]), "NEXUS_EVAL_GRADING_*") if bad["loc"] else ""
                raise ValueError(f"${var}={bad.get('input')!r}: {bad['msg'].removeprefix('Value error, ')}") from None
        for field, var in _VARIABLES.items():
            if not env.get(var):
                continue
            if not field.endswith("_s"):  # whole numbers, validated by the field
                values[field] = env[var]
                continue
            try:
                values[field] = float(env[var])
            except ValueError:
                raise ValueError(f"${var}={env[var]!r} is not a number of seconds") from None
        try:
            return cls(**{**values, **overrides})
        except ValidationError as exc:
            raise ValueError("; ".join(_say(e) for e in exc.errors())) from None

    @property
    def openai_allowed(self) -> AllowedEndpoints:
        """Where this process lets an openai job send requests, and which key (``execute_episode``, the CLI)."""
        return AllowedEndpoints(self.openai_key_envs, self.openai_hosts)

    @property
    def liveness(self) -> Liveness:
        return Liveness(self.heartbeat_s, self.stale_after_s, self.sweep_s, self.db_retry_s, self.grade_resend_s)

    @property
    def embedded(self) -> bool:
        return self.broker_url is None

    @property
    def effective_broker(self) -> str:
        if self.broker_url:
            return self.broker_url
        return f"sqla+sqlite:///{_runs_dir(self.db_url) / 'celery-broker.db'}"

    @property
    def effective_result_backend(self) -> str:
        if self.result_backend:
            return self.result_backend
        if self.broker_url and self.broker_url.startswith(("redis://", "rediss://")):
            return self.broker_url
        return f"db+sqlite:///{_runs_dir(self.db_url) / 'celery-results.db'}"

    @property
    def effective_visibility_timeout(self) -> float:
        return self.visibility_timeout_s or self.hard_time_limit_s + 3600.0
