"""What a job needs before it runs, as typed checks: one list for `nexus-eval doctor`, and the subset a verb
needs for the preflight of `run`, `submit` and `episode`.

Why a preflight at all: an episode that cannot reach Docker fails inside the worker as ``infra_failure``,
so a job on a machine without a daemon used to "finish" in seconds with a table of ``!`` cells and the
reason only in the database. Checking first costs a ping and a few image lookups, and a refused job stores
and enqueues nothing.

Every check returns a :class:`Check` and never raises; heavy imports stay inside the functions.
"""

from __future__ import annotations

import importlib
import os
import shutil
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from env.tasks.loading import Task

SETUP = "nexus-eval setup"
# (distribution, module): the dependencies a job imports on its way through the worker
PACKAGES = [
    ("torch", "torch"),
    ("transformers", "transformers"),
    ("celery", "celery"),
    ("sqlalchemy", "sqlalchemy"),
    ("alembic", "alembic"),
    ("docker", "docker"),
    ("swebench", "swebench"),
    ("redis", "redis"),
    ("psycopg", "psycopg"),
    ("datasets", "datasets"),
]


@dataclass(frozen=True)
class Check:
    """One thing a job needs (``required``) or may use, whether it is there, and the command that fixes it.

    ``build``: ready, but an image has to be built first (`run` and `setup` do that; it takes time)."""

    name: str
    ok: bool
    required: bool
    detail: str
    fix: str = ""
    build: bool = False

    @property
    def status(self) -> str:
        if self.ok:
            return "buildable" if self.build else "ok"
        return "missing" if self.required else "optional-missing"


def package_checks() -> list[Check]:
    """Each dependency imported for real (a broken install fails here, not in the worker), with its version."""
    from importlib.metadata import PackageNotFoundError, version

    checks = []
    for dist, module in PACKAGES:
        try:
            importlib.import_module(module)
            checks.append(Check(f"python: {dist}", True, True, version(dist)))
        except (ImportError, PackageNotFoundError, OSError) as exc:
            detail = f"{type(exc).__name__}: {exc}".splitlines()[0]
            checks.append(Check(f"python: {dist}", False, True, detail, "pip install -e ."))
    return checks


def daemon_check() -> Check:
    from env.sandbox.docker_daemon import daemon_state

    state = daemon_state()
    if state.answering:
        return Check("docker daemon", True, True, f"Docker {state.version} at {state.host}")
    return Check("docker daemon", False, True, f"no daemon answers at {state.host}: {state.reason}", SETUP)


def lookup_client() -> Any:
    """The daemon's docker-py client for image lookups (None when no daemon answers: the daemon check says why)."""
    from env.tasks.images import ImageError, docker_client

    try:
        return docker_client()
    except ImageError:
        return None


def base_image_check(client: Any, tag: str | None = None) -> Check:
    """Present, or buildable here (debootstrap on PATH), or neither."""
    from env.tasks.images import BASE_IMAGE_TAG, image_exists

    tag = tag or BASE_IMAGE_TAG
    name = "base image"
    if client is None:
        return Check(name, False, True, f"{tag}: unknown until a Docker daemon answers", SETUP)
    if image_exists(client, tag):
        return Check(name, True, True, f"{tag} ({client.images.get(tag).short_id.removeprefix('sha256:')})")
    if shutil.which("debootstrap"):
        return Check(name, True, True, f"{tag} not built yet; debootstrap is installed (about a minute)", SETUP, True)
    return Check(name, False, True, f"{tag} is missing and debootstrap (which builds it) is not on PATH", SETUP)


def task_images_check(tasks: list[Task], client: Any, base: Check) -> tuple[Check, list[Task]]:
    """One row for the tasks' images, and the local tasks whose image must be built first. A local task's
    image is built from the base image; a SWE-bench / R2E image must already be here (never pulled)."""
    from env.tasks.images import task_images

    name = f"task images ({len(tasks)})"
    if client is None:
        return Check(name, False, True, "unknown until a Docker daemon answers", SETUP), []
    states = task_images(tasks, client)
    by_id = {t.instance_id: t for t in tasks}
    build = [by_id[s.task_id] for s in states if s.buildable and not s.present]
    absent = [s for s in states if not s.buildable and not s.present]
    present = sum(s.present for s in states)
    parts = [f"{present}/{len(states)} present"]
    if build:
        parts.append(f"{len(build)} to build from the base image ({_few([t.instance_id for t in build])})")
    if absent:
        names = _few([s.image or f"{s.task_id} (no docker_image)" for s in absent])
        parts.append(f"{len(absent)} registry image(s) missing, never pulled here: {names}")
        fix = (
            "where it can be pulled: `docker pull IMAGE && docker save IMAGE | gzip > i.tgz`; here: "
            "`docker load < i.tgz`"
        )
        return Check(name, False, True, "; ".join(parts), fix), build
    if build and not base.ok:
        return Check(name, False, True, "; ".join(parts) + "; the base image cannot be built", base.fix), build
    return Check(name, True, True, "; ".join(parts), SETUP if build else "", bool(build)), build


def _few(names: list[str], n: int = 3) -> str:
    return ", ".join(names[:n]) + (f" and {len(names) - n} more" if len(names) > n else "")


def broker_check(url: str | None, *, required: bool = True) -> Check:
    """The embedded SQLite broker needs nothing; a Redis broker must answer a PING within 2 s. (`doctor` passes
    ``required=False``: `run` always uses the embedded broker; `submit` and `worker` need this one.) The row
    shows the URL with its password masked (``db.urls.masked``)."""
    if not url:
        return Check("broker", True, required, "embedded SQLite broker beside the database ($NEXUS_EVAL_BROKER unset)")
    from db.urls import masked

    shown = masked(url)
    if not url.startswith(("redis://", "rediss://")):
        return Check("broker", True, required, f"{shown}: not checked (only redis:// brokers are)")
    import redis

    fix = "start Redis there (e.g. `docker compose up -d redis`), or unset NEXUS_EVAL_BROKER and use `nexus-eval run`"
    try:
        redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=2).ping()
    except Exception as exc:  # redis raises ConnectionError, TimeoutError, AuthenticationError, ...
        said = str(exc).replace(url, shown)
        detail = f"Redis at {shown} does not answer: {said}" + ("" if required else " (submit and worker need it)")
        return Check("broker", False, required, detail, fix)
    return Check("broker", True, required, f"Redis at {shown} answers")


def _settings_broker_check(db_url: str) -> Check:
    """`doctor`'s broker row: the broker of this environment's service settings (``jobs.settings.ServiceSettings``,
    the one reader of ``$NEXUS_EVAL_BROKER``), optional; a bad ``NEXUS_EVAL_*`` variable is named instead."""
    from jobs.settings import ServiceSettings

    try:
        settings = ServiceSettings.from_env(db_url=db_url)
    except ValueError as exc:
        fix = "correct or unset the NEXUS_EVAL_* variable it names (docs/service.md)"
        return Check("broker", False, False, f"service settings: {exc}", fix)
    return broker_check(settings.broker_url, required=False)


def database_check(url: str) -> Check:
    """Reachable, and at a schema revision this version knows (older ones migrate on first use). A SQLite
    file that does not exist yet is fine if its folder can be created: nothing is written here."""
    return _database(url)[0]


def _database(url: str) -> tuple[Check, str | None]:
    """:func:`database_check`'s row, and the URL to read the database by when it answers with its schema at
    head (``None`` otherwise: then :func:`workers_check` has nothing to read)."""
    from sqlalchemy.engine import make_url

    from db.connection import MIGRATIONS_DIR, current_revision, head_revision, refusal
    from db.urls import masked

    fix = "set NEXUS_EVAL_DB (or --db) to a writable SQLite path or a reachable postgresql+psycopg:// URL"
    readable = url
    try:
        parsed = make_url(url)
        if parsed.get_backend_name() == "sqlite":
            path = Path(parsed.database or "")
            if not parsed.database or not path.exists():
                folder = next(p for p in [path.parent, *path.parent.parents] if p.exists())
                if not folder.is_dir() or not os.access(folder, os.W_OK):
                    return Check("database", False, True, f"{path}: cannot create it in {folder}", fix), None
                return Check("database", True, True, f"{path} (created on first use)"), None
        elif "connect_timeout" not in parsed.query:
            parsed = parsed.update_query_dict({"connect_timeout": "3"})
        readable = parsed.render_as_string(hide_password=False)
        revision = current_revision(readable)
    except Exception as exc:  # any driver error means "not reachable"; the message says which
        # the same line every verb prints for a database that is down or missing (db.connection.refusal); a parse
        # or driver error may quote the URL it was given: never with its password
        said = str(refusal(url, exc)).replace(readable, masked(readable))
        return Check("database", False, True, said, fix), None
    head = head_revision()
    if revision == head:
        return Check("database", True, True, f"{masked(url)} (schema at {head})"), readable
    from alembic.script import ScriptDirectory

    if revision is not None and revision not in {
        s.revision for s in ScriptDirectory(str(MIGRATIONS_DIR)).walk_revisions()
    }:
        detail = f"{masked(url)}: schema revision {revision} is unknown to this version (a newer nexus-eval wrote it)"
        fix = "pip install -e . from a newer checkout, or use another database"
        return Check("database", False, True, detail, fix), None
    return Check("database", True, True, f"{masked(url)} (schema {revision or 'empty'} -> {head} on first use)"), None


def sweep_window_s() -> float:
    """How far back a worker counts as present: 3 sweeps, each ``$NEXUS_EVAL_SWEEP`` seconds (the workers'
    setting as this environment sets it; ``workers.faults.heartbeat.LIVENESS.sweep_s`` by default)."""
    from jobs.settings import LIVENESS, ServiceSettings

    try:
        return 3 * ServiceSettings.from_env().sweep_s
    except ValueError:  # a bad NEXUS_EVAL_* variable: the commands that use it say so
        return 3 * LIVENESS.sweep_s


def workers_check(db_url: str, *, within_s: float | None = None, now: datetime | None = None) -> Check:
    """The workers that reported to the database at ``db_url`` in the last ``within_s`` seconds (default
    :func:`sweep_window_s`). Optional: `run` starts its own worker; a paused one (its host's Docker engine does
    not answer, so it takes no episode) makes the row fail."""
    return _workers(*_database(db_url), within_s=within_s, now=now)


def _workers(database: Check, readable: str | None, *, within_s: float | None, now: datetime | None) -> Check:
    """:func:`workers_check` after the database row (read only when it answers at head)."""
    within_s = sweep_window_s() if within_s is None else within_s
    start = "start one: `nexus-eval worker` (or `nexus-eval run` runs its own)"
    if not database.ok:
        return Check("workers", False, False, "unknown: the database is not reachable", database.fix)
    if readable is None:  # a SQLite file not made yet, or a schema a worker of this version would have migrated
        return Check("workers", False, False, "none: no worker of this version has used this database", start)
    from sqlalchemy.orm import Session

    from db.connection import make_engine
    from db.liveness import recent_workers
    from db.models import WorkerState, utcnow

    now = now or utcnow()
    engine = make_engine(readable)
    try:
        with Session(engine) as s:
            rows = sorted(recent_workers(s, within_s=within_s, now=now), key=lambda r: r.name)
    except Exception as exc:  # the database went away since its row: say so, never raise
        return Check("workers", False, False, f"cannot read it: {type(exc).__name__}: {exc}".splitlines()[0])
    finally:
        engine.dispose()
    window = f"{within_s:g} s"
    if not rows:
        return Check("workers", False, False, f"no worker has reported in the last {window}", start)
    parts = []
    for r in rows:
        if r.state == WorkerState.paused:
            parts.append(f"{r.name} paused since {_clock(r.state_since, now)} ({r.queues}): {r.detail or '?'}")
        else:
            parts.append(f"{r.name} ok ({r.queues})")
    paused = [r for r in rows if r.state == WorkerState.paused]
    detail = f"{len(rows)} worker{'s' if len(rows) > 1 else ''} seen in the last {window}: " + "; ".join(parts)
    if paused:
        one = len(paused) == 1
        fix = f"start the Docker engine on {'that host' if one else 'their hosts'} (`{SETUP}`); " + (
            "the worker resumes by itself" if one else "the workers resume by themselves"
        )
        return Check("workers", False, False, detail, fix)
    return Check("workers", True, False, detail)


def queue_workers(db_url: str, queue: str, *, within_s: float | None = None, now: datetime | None = None) -> dict:
    """The workers that reported listening on ``queue`` to the database at ``db_url`` in the last ``within_s``
    seconds (default :func:`sweep_window_s`), by state: ``{"ok": [names], "paused": [names]}``; ``None`` when
    the workers table cannot be read. One short SELECT (a PostgreSQL connect gives up after 2 s); never raises."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.orm import Session

    from db.connection import make_engine
    from db.liveness import recent_workers
    from db.models import WorkerState, utcnow

    within_s = sweep_window_s() if within_s is None else within_s
    found: dict = {"ok": [], "paused": []}
    try:
        parsed = make_url(db_url)
        if parsed.get_backend_name() == "postgresql" and "connect_timeout" not in parsed.query:
            parsed = parsed.update_query_dict({"connect_timeout": "2"})
        engine = make_engine(parsed.render_as_string(hide_password=False))
        try:
            with Session(engine) as s:
                rows = recent_workers(s, within_s=within_s, now=now or utcnow())
        finally:
            engine.dispose()
    except Exception:  # the caller says "unknown"
        return None
    for row in sorted(rows, key=lambda r: r.name):
        if queue in [q.strip() for q in (row.queues or "").split(",")]:
            found["paused" if row.state == WorkerState.paused else "ok"].append(row.name)
    return found


def _clock(at: datetime, now: datetime) -> str:
    """``12:01:03 UTC`` today, with the date on another day."""
    return f"{at:%H:%M:%S} UTC" if at.date() == now.date() else f"{at:%Y-%m-%d %H:%M:%S} UTC"


def gpu_check() -> Check:
    try:
        import torch

        if torch.cuda.is_available():
            names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
            return Check("gpu", True, False, f"{len(names)} CUDA device(s): {_few(names)}")
        detail = f"torch {torch.__version__} sees no CUDA device (the tiny model runs on CPU)"
    except Exception as exc:  # a broken torch is reported by the package rows
        detail = f"{type(exc).__name__}: {exc}".splitlines()[0]
    return Check("gpu", False, False, detail, "only for real models: a machine with an NVIDIA GPU and a CUDA torch")


def model_check() -> Check:
    """The real CPU model preset (informational: the quick job runs the tiny model, which needs no download)."""
    from agent_runner.config import SMOLLM2
    from agent_runner.real_models import is_ready, preset_path

    path = preset_path(SMOLLM2)
    if is_ready(SMOLLM2):
        return Check(f"model: {SMOLLM2}", True, False, f"ready at {path}")
    detail = f"not set up ({path} has no converted copy); only jobs with model.name={SMOLLM2} need it"
    return Check(f"model: {SMOLLM2}", False, False, detail, SETUP)


def flash_attn_check() -> Check:
    from importlib.metadata import PackageNotFoundError, version

    try:
        importlib.import_module("flash_attn")
        return Check("flash-attn", True, False, version("flash-attn"))
    except (ImportError, PackageNotFoundError, OSError) as exc:
        detail = f"not importable ({type(exc).__name__}); sdpa attention is used instead"
        return Check("flash-attn", False, False, detail, 'pip install -e ".[gpu]"  (needs CUDA to build)')


@dataclass
class Preflight:
    """The checks one verb needs, and the images a run builds before starting (base, then local tasks)."""

    checks: list[Check]
    build_base: bool = False
    build_tasks: list[Task] = field(default_factory=list)

    @property
    def failures(self) -> list[Check]:
        return [c for c in self.checks if c.required and not c.ok]


def container_checks(tasks: list[Task]) -> Preflight:
    """Daemon, base image (when a task is local) and the tasks' images."""
    daemon = daemon_check()
    client = lookup_client() if daemon.ok else None
    checks = [daemon]
    base = Check("base image", True, True, "not needed (no local task)")
    if any(t.kind == "local" for t in tasks):
        base = base_image_check(client)
        checks.append(base)
    images, build = task_images_check(tasks, client, base)
    checks.append(images)
    return Preflight(checks, build_base=base.build, build_tasks=build)


def preflight(
    tasks: list[Task] | None, *, db_url: str | None = None, broker: str | None = None, check_broker: bool = False
) -> Preflight:
    """The preflight of a verb: containers for ``tasks`` (None: not run here), the database at ``db_url``
    (None: not used), and the broker when ``check_broker``."""
    result = container_checks(tasks) if tasks is not None else Preflight([])
    if check_broker:
        result.checks.append(broker_check(broker))
    if db_url is not None:
        result.checks.append(database_check(db_url))
    return result


def doctor_checks(db_url: str, suite: str) -> list[Check]:
    """Everything `nexus-eval doctor` shows: packages, the containers of ``suite``, broker, database, the workers
    that reported to it, the real CPU model, GPU."""
    from env.tasks.loading import load_suite

    checks = package_checks()
    checks += container_checks(load_suite(suite)).checks
    checks.append(_settings_broker_check(db_url))
    database, readable = _database(db_url)
    checks += [database, _workers(database, readable, within_s=None, now=None)]
    return [*checks, model_check(), gpu_check(), flash_attn_check()]
