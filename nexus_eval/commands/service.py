"""CLI verbs that run jobs: submit, run (embedded), worker, status, cancel.

Where the service lives comes from the environment: ``NEXUS_EVAL_BROKER`` (unset: the embedded SQLite
broker), ``NEXUS_EVAL_DB`` (unset: ./runs/nexus-eval.db; ``--db`` overrides it). See docs/service.md.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from nexus_eval.commands._common import DB_OPTION, celery_app, csv_list, db_url, fail, job_id_of, open_db

if TYPE_CHECKING:
    from env.tasks import Task
    from workers.spec import JobSpec

DEFAULT_RUN_METHODS = "dense,snapkv,nexus"

_FILE = typer.Option(None, "--file", "-f", help="a YAML job file (see workers/spec.py); flags are ignored then")
_NAME = typer.Option(None, help="a name for the job")
_MODEL = typer.Option(None, help="'tiny', a Hugging Face id or a local path (backend hf)")
_BACKEND = typer.Option("hf", help="hf | oracle | openai")
_SCOPES = typer.Option("prefill_only", help="comma-separated: prefill_only,prefill_decode")
_PROTOCOLS = typer.Option("true_eviction,full_context", help="comma-separated protocols")
_DENSITY = typer.Option(0.2, help="kept fraction of the logical tokens")
_PRESET = typer.Option("paper", help="per-method settings: paper | reference | kvcache_factory (nexus/presets.py)")
_SEEDS = typer.Option("0", help="comma-separated seeds")
_SUITE = typer.Option("mini", help="bundled suite name or task folder")
_TEMPERATURE = typer.Option(1.0)


def _job_spec(file: Path | None, flags: dict[str, Any], *, what: str) -> tuple[JobSpec, list[Task]]:
    """The job from ``--file`` or from the flags, and its tasks (the selection checked, for the preflight);
    exit 2 on any error, before anything is stored (``what`` ends the message: "nothing was submitted")."""
    from workers.spec import JobSpec, JobSpecError
    from workers.submit import load_spec, load_tasks, plan_episodes

    try:
        source = str(file) if file else "<command-line flags>"
        spec = load_spec(file) if file else JobSpec.from_dict(_flags_to_data(**flags), source=source)
        spec.check_with_library(source=source)  # every method's hyperparameters, by building its policy
        tasks = load_tasks(spec)
        plan_episodes(spec, tasks)  # a bad task selection is an error before anything is stored
    except JobSpecError as exc:
        fail(f"{exc}\n{what}")
    return spec, tasks


def _flags_to_data(
    *,
    name: str | None,
    model: str | None,
    backend: str,
    methods: str,
    scopes: str,
    protocols: str,
    density: float,
    preset: str,
    seeds: str,
    suite: str,
    tasks: str | None,
    max_steps: int,
    max_new_tokens: int | None,
    max_context_tokens: int,
    temperature: float,
) -> dict[str, Any]:
    """The job-file mapping the flags stand for."""
    data: dict[str, Any] = {
        "name": name,
        "backend": backend,
        "methods": csv_list(methods),
        "scopes": csv_list(scopes),
        "protocols": csv_list(protocols),
        "density": density,
        "preset": preset,
        "seeds": [int(s) for s in csv_list(seeds)],
        "tasks": {"suite": suite, **({"ids": csv_list(tasks)} if tasks else {})},
        "limits": {
            "max_steps": max_steps,
            "soft_step_limit": min(max_steps, 40),
            "max_context_tokens": max_context_tokens,
            "max_new_tokens": max_new_tokens,
        },
        "sampling": {"temperature": temperature, "max_new_tokens": max_new_tokens},
    }
    if backend != "oracle" or model:
        data["model"] = {"name": model or "tiny"}
    return data


def submit(
    file: Path = _FILE,
    name: str = _NAME,
    model: str = _MODEL,
    backend: str = _BACKEND,
    methods: str = typer.Option("dense,nexus", help="comma-separated eviction methods"),
    scopes: str = _SCOPES,
    protocols: str = _PROTOCOLS,
    density: float = _DENSITY,
    preset: str = _PRESET,
    seeds: str = _SEEDS,
    suite: str = _SUITE,
    tasks: str = typer.Option(None, "--tasks", help="comma-separated task ids or globs"),
    max_steps: int = typer.Option(100, "--max-steps"),
    max_new_tokens: int = typer.Option(None, "--max-new-tokens", help="per-turn cap; default none (the context)"),
    max_context_tokens: int = typer.Option(65536, "--max-context-tokens"),
    temperature: float = _TEMPERATURE,
    db: str = DB_OPTION,
) -> None:
    """Submit a job to the queue and print its id (workers run it; see `nexus-eval worker`)."""
    flags = dict(locals())
    for key in ("file", "db"):
        flags.pop(key)
    spec, tasks = _job_spec(file, flags, what="nothing was submitted")
    from rich.console import Console

    from nexus_eval.commands._preflight import refuse_unless_ready
    from nexus_eval.readiness import preflight
    from workers.submit import submit as submit_job

    # Workers build missing task images on their own machine, so submit only checks. With the embedded
    # broker the worker is this machine: its engine and images are checked too; with Redis they are not
    # (the workers' machines are elsewhere), but the broker must answer.
    broker = os.environ.get("NEXUS_EVAL_BROKER") or None
    pre = preflight(None if broker else tasks, db_url=db_url(db), broker=broker, check_broker=True)
    refuse_unless_ready(pre, "nothing was submitted")
    app = celery_app(db)
    try:
        job_id, n = submit_job(open_db(db), spec, app=app)
    except Exception as exc:
        fail(f"could not enqueue: {type(exc).__name__}: {exc}", 1)
    typer.echo(job_id)
    Console(stderr=True).print(f"submitted job {job_id}: {n} episodes on the gpu queue")


def run(
    file: Path = _FILE,
    name: str = _NAME,
    model: str = _MODEL,
    backend: str = _BACKEND,
    methods: str = typer.Option(DEFAULT_RUN_METHODS, help="comma-separated eviction methods"),
    scopes: str = _SCOPES,
    protocols: str = _PROTOCOLS,
    density: float = _DENSITY,
    preset: str = _PRESET,
    seeds: str = _SEEDS,
    suite: str = _SUITE,
    tasks: str = typer.Option("humanfmt__humanfmt-1,dslib__dslib-1", "--tasks", help="task ids or globs"),
    max_steps: int = typer.Option(4, "--max-steps"),
    max_new_tokens: int = typer.Option(48, "--max-new-tokens"),
    max_context_tokens: int = typer.Option(8192, "--max-context-tokens"),
    temperature: float = _TEMPERATURE,
    db: str = DB_OPTION,
    timeout: float = typer.Option(None, help="give up after this many seconds"),
    fmt: str = typer.Option("table", "--format", help="compare output: table | json | csv | markdown"),
) -> None:
    """Submit a job and run it here with an embedded worker (no Redis needed); print the compare table.

    The defaults finish in a few minutes on a laptop CPU: the tiny model, 2 mini tasks, dense/snapkv/nexus,
    both protocols, prefill_only, 4 steps of at most 48 tokens."""
    flags = dict(locals())
    for key in ("file", "db", "timeout", "fmt"):
        flags.pop(key)
    spec, tasks = _job_spec(file, flags, what="nothing was run")
    from rich.console import Console

    from nexus_eval.commands._preflight import build_or_fail, print_failure_reasons, refuse_unless_ready
    from nexus_eval.readiness import preflight
    from workers.compare import compare_jobs
    from workers.compare_render import render
    from workers.embedded import EmbeddedWorker, watch_job
    from workers.submit import submit as submit_job

    console = Console(stderr=True)
    url = db_url(db)
    # every backend drives containers: refuse (exit 2, nothing stored) what cannot work here, and build
    # what is only missing (the base image, local task images) before the job exists
    checks = preflight(tasks, db_url=url)
    refuse_unless_ready(checks, "nothing was stored")
    build_or_fail(checks, console)
    database = open_db(url)
    job_id, n = submit_job(database, spec, app=celery_app(url, embedded=True))
    console.print(f"job {job_id}: {n} episodes; embedded worker on {url}")
    log_file = None
    if url.startswith("sqlite:///"):
        log_file = Path(url.removeprefix("sqlite:///")).with_name(f"worker-{job_id}.log")
    with EmbeddedWorker(url, log_file=log_file) as worker:
        finished = watch_job(database, job_id, worker=worker, timeout=timeout, console=console)
    if not finished:
        print_failure_reasons(database, job_id, console)  # the episodes that did end, and why
        where = f" (worker log: {log_file})" if log_file else ""
        fail(f"job {job_id} did not finish{where}; `nexus-eval status {job_id}` shows where it stopped", 1)
    with database.session() as s:
        table = compare_jobs(s, [job_id])
    typer.echo(render(table, fmt))
    print_failure_reasons(database, job_id, console)


def worker(
    queues: str = typer.Option("gpu,grade,default", "--queues", "-Q", help="comma-separated queues"),
    pool: str = typer.Option("prefork", help="prefork (time limits work) | solo"),
    concurrency: int = typer.Option(1, "--concurrency", "-c", help="processes; keep 1 per GPU on the gpu queue"),
    episodes_per_gpu: int = typer.Option(
        1,
        "--episodes-per-gpu",
        help="episodes one gpu worker runs at once, decoded together in one batched engine (threads pool)",
    ),
    hostname: str = typer.Option(None, "--hostname", "-n", help="worker node name"),
    loglevel: str = typer.Option("INFO", "--loglevel", "-l"),
    db: str = DB_OPTION,
) -> None:
    """Start a Celery worker on the chosen queues (broker from $NEXUS_EVAL_BROKER; results in $NEXUS_EVAL_DB)."""
    from workers.app import QUEUES

    unknown = sorted(set(csv_list(queues)) - set(QUEUES))
    if unknown:
        fail(f"unknown queue(s) {unknown}; known: {', '.join(QUEUES)}")
    if "gpu" in csv_list(queues) and concurrency != 1:
        fail(
            "the gpu queue takes one process per GPU (the model lives in it): use --concurrency 1, and "
            "--episodes-per-gpu N to run N episodes in it at once"
        )
    if episodes_per_gpu < 1:
        fail(f"--episodes-per-gpu must be >= 1, got {episodes_per_gpu}")
    if episodes_per_gpu > 1:
        if "gpu" not in csv_list(queues):
            fail("--episodes-per-gpu applies to a worker on the gpu queue")
        # one process (one model), one thread per episode; Celery's time limits need prefork, so the
        # episode's own soft deadline (checked at turn boundaries) is what ends a long run here
        pool, concurrency = "threads", episodes_per_gpu
        os.environ["NEXUS_EVAL_EPISODES_PER_GPU"] = str(episodes_per_gpu)
    argv = ["worker", "-Q", queues, "--pool", pool, "--concurrency", str(concurrency), "--loglevel", loglevel]
    if hostname:
        argv += ["-n", hostname]
    celery_app(db).worker_main(argv)


def status(
    job: str = typer.Argument(None, help="a job id (prefix); omit for the newest jobs"),
    db: str = DB_OPTION,
    watch: bool = typer.Option(False, "--watch", help="redraw until the job is finished"),
) -> None:
    """Show one job's progress table, or a list of the newest jobs."""
    from rich.console import Console
    from rich.table import Table

    from db import store as db_store
    from workers.embedded import progress_table, watch_job

    database = open_db(db)
    console = Console()
    if job is None:
        table = Table(title="jobs")
        for col in ("job", "name", "status", "created", "episodes", "finished"):
            table.add_column(col)
        with database.session() as s:
            for row in db_store.list_jobs(s, limit=20):
                summary = db_store.job_summary(s, row.id)
                created = f"{row.created_at:%Y-%m-%d %H:%M}"
                table.add_row(row.id, row.name or "", row.status, created, str(summary.total), str(summary.finished))
        console.print(table)
        return
    job_id = job_id_of(database, job)
    if watch:
        watch_job(database, job_id, console=console)
    else:
        console.print(progress_table(database, job_id))


def cancel(job: str = typer.Argument(..., help="job id (prefix)"), db: str = DB_OPTION) -> None:
    """Cancel a job: queued episodes will do nothing, running ones stop at their next turn."""
    from workers.tasks import cancel as cancel_job

    database = open_db(db)
    job_id = job_id_of(database, job)
    revoked = cancel_job(database, job_id, app=celery_app(db))
    typer.echo(f"cancelled job {job_id} ({len(revoked)} queued/running episodes revoked)")


def register(app: typer.Typer) -> None:
    """Attach this area's verbs to the root app."""
    for verb in (submit, run, worker, status, cancel):
        app.command(verb.__name__)(verb)
