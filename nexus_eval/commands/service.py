"""CLI verbs for the service: submit, run (embedded), worker, status, cancel; and, from the sibling modules,
compare, inspect, export, regrade (``service_results``) and rerun (``service_rerun``).

Where the service lives comes from the environment: ``NEXUS_EVAL_BROKER`` (unset: the embedded SQLite
broker), ``NEXUS_EVAL_DB`` (unset: ./runs/nexus-eval.db). See docs/service.md.
"""

from __future__ import annotations

import os
from pathlib import Path

import typer

from nexus_eval.commands import service_rerun, service_results

DEFAULT_RUN_METHODS = "dense,snapkv,nexus"


def _err(message: str, code: int = 2) -> typer.Exit:
    from rich.console import Console

    Console(stderr=True).print(f"[red]error:[/red] {message}", highlight=False, soft_wrap=True)
    return typer.Exit(code)


def open_db(db: str | None = None):
    """The results database (``--db``, else ``$NEXUS_EVAL_DB``, else ./runs/nexus-eval.db), migrated."""
    from db import connect

    return connect(_db_url(db))


def _db_url(db: str | None) -> str:
    from db.connection import default_url, sqlite_url

    if db is None:
        return default_url()
    return db if "://" in db else sqlite_url(db)


def _csv(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def _spec_from_flags(
    name,
    model,
    backend,
    methods,
    scopes,
    protocols,
    density,
    seeds,
    suite,
    task_ids,
    max_steps,
    max_new_tokens,
    max_context_tokens,
    temperature,
):
    from workers.spec import JobSpec

    data = {
        "name": name,
        "backend": backend,
        "methods": _csv(methods),
        "scopes": _csv(scopes),
        "protocols": _csv(protocols),
        "density": density,
        "seeds": [int(s) for s in _csv(seeds)],
        "tasks": {"suite": suite, **({"ids": _csv(task_ids)} if task_ids else {})},
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
    return JobSpec.from_dict(data, source="<command-line flags>")


_FILE = typer.Option(None, "--file", "-f", help="a YAML job file (see workers/spec.py); flags are ignored then")
_NAME = typer.Option(None, help="a name for the job")
_MODEL = typer.Option(None, help="'tiny', a Hugging Face id or a local path (backend hf)")
_BACKEND = typer.Option("hf", help="hf | oracle | openai")
_SCOPES = typer.Option("prefill_only", help="comma-separated: prefill_only,prefill_decode")
_PROTOCOLS = typer.Option("true_eviction,full_context", help="comma-separated protocols")
_DENSITY = typer.Option(0.2, help="kept fraction of the logical tokens")
_SEEDS = typer.Option("0", help="comma-separated seeds")
_SUITE = typer.Option("mini", help="bundled suite name or task folder")
_DB = typer.Option(None, "--db", help="results database URL or SQLite path (default $NEXUS_EVAL_DB)")


def submit(
    file: Path = _FILE,
    name: str = _NAME,
    model: str = _MODEL,
    backend: str = _BACKEND,
    methods: str = typer.Option("dense,nexus", help="comma-separated eviction methods"),
    scopes: str = _SCOPES,
    protocols: str = _PROTOCOLS,
    density: float = _DENSITY,
    seeds: str = _SEEDS,
    suite: str = _SUITE,
    tasks: str = typer.Option(None, "--tasks", help="comma-separated task ids or globs"),
    max_steps: int = typer.Option(100, "--max-steps"),
    max_new_tokens: int = typer.Option(4096, "--max-new-tokens"),
    max_context_tokens: int = typer.Option(65536, "--max-context-tokens"),
    temperature: float = typer.Option(1.0),
    db: str = _DB,
) -> None:
    """Submit a job to the queue and print its id (workers run it; see `nexus-eval worker`)."""
    from workers.spec import JobSpecError

    try:
        spec = (
            _load_file(file)
            if file
            else _spec_from_flags(
                name,
                model,
                backend,
                methods,
                scopes,
                protocols,
                density,
                seeds,
                suite,
                tasks,
                max_steps,
                max_new_tokens,
                max_context_tokens,
                temperature,
            )
        )
        from workers.submit import plan_episodes

        plan_episodes(spec)  # a bad task selection is an error before anything is stored
    except JobSpecError as exc:
        raise _err(f"{exc}\nnothing was submitted") from None
    if db:
        os.environ["NEXUS_EVAL_DB"] = _db_url(db)  # the Celery app reads it at import
    from workers.submit import submit as submit_job

    database = open_db(db)
    try:
        job_id, n = submit_job(database, spec)
    except Exception as exc:
        raise _err(f"could not enqueue: {type(exc).__name__}: {exc}", 1) from None
    typer.echo(job_id)
    from rich.console import Console

    Console(stderr=True).print(f"submitted job {job_id}: {n} episodes on the gpu queue")


def _load_file(file: Path):
    from workers.submit import load_spec

    return load_spec(file)


def run(
    file: Path = _FILE,
    name: str = _NAME,
    model: str = _MODEL,
    backend: str = _BACKEND,
    methods: str = typer.Option(DEFAULT_RUN_METHODS, help="comma-separated eviction methods"),
    scopes: str = _SCOPES,
    protocols: str = _PROTOCOLS,
    density: float = _DENSITY,
    seeds: str = _SEEDS,
    suite: str = _SUITE,
    tasks: str = typer.Option("humanfmt__humanfmt-1,dslib__dslib-1", "--tasks", help="task ids or globs"),
    max_steps: int = typer.Option(4, "--max-steps"),
    max_new_tokens: int = typer.Option(48, "--max-new-tokens"),
    max_context_tokens: int = typer.Option(8192, "--max-context-tokens"),
    temperature: float = typer.Option(1.0),
    db: str = _DB,
    timeout: float = typer.Option(None, help="give up after this many seconds"),
    fmt: str = typer.Option("table", "--format", help="compare output: table | json | csv | markdown"),
) -> None:
    """Submit a job and run it here with an embedded worker (no Redis needed); print the compare table.

    The defaults finish in a few minutes on a laptop CPU: the tiny model, 2 mini tasks, dense/snapkv/nexus,
    both protocols, prefill_only, 4 steps of at most 48 tokens."""
    from workers.spec import JobSpecError

    os.environ.pop("NEXUS_EVAL_BROKER", None)  # embedded: the SQLite broker beside the results database
    os.environ.pop("NEXUS_EVAL_RESULT_BACKEND", None)
    url = _db_url(db)
    os.environ["NEXUS_EVAL_DB"] = url
    try:
        spec = (
            _load_file(file)
            if file
            else _spec_from_flags(
                name,
                model,
                backend,
                methods,
                scopes,
                protocols,
                density,
                seeds,
                suite,
                tasks,
                max_steps,
                max_new_tokens,
                max_context_tokens,
                temperature,
            )
        )
        from workers.submit import plan_episodes

        plan_episodes(spec)
    except JobSpecError as exc:
        raise _err(f"{exc}\nnothing was run") from None
    from rich.console import Console

    from workers.compare import compare_jobs, render
    from workers.embedded import EmbeddedWorker, watch_job
    from workers.submit import submit as submit_job

    console = Console(stderr=True)
    database = open_db(url)
    job_id, n = submit_job(database, spec)
    console.print(f"job {job_id}: {n} episodes; embedded worker on {url}")
    log_file = (
        Path(url.removeprefix("sqlite:///")).with_name(f"worker-{job_id}.log") if url.startswith("sqlite:///") else None
    )
    with EmbeddedWorker(url, log_file=log_file) as worker:
        finished = watch_job(database, job_id, worker=worker, timeout=timeout, console=console)
    if not finished:
        where = f" (worker log: {log_file})" if log_file else ""
        raise _err(f"job {job_id} did not finish{where}; `nexus-eval status {job_id}` shows where it stopped", 1)
    with database.session() as s:
        table = compare_jobs(s, [job_id])
    typer.echo(render(table, fmt))


def worker(
    queues: str = typer.Option("gpu,grade,default", "--queues", "-Q", help="comma-separated queues"),
    pool: str = typer.Option("prefork", help="prefork (time limits work) | solo"),
    concurrency: int = typer.Option(1, "--concurrency", "-c", help="processes; keep 1 per GPU on the gpu queue"),
    hostname: str = typer.Option(None, "--hostname", "-n", help="worker node name"),
    loglevel: str = typer.Option("INFO", "--loglevel", "-l"),
) -> None:
    """Start a Celery worker on the chosen queues (broker from $NEXUS_EVAL_BROKER; results in $NEXUS_EVAL_DB)."""
    from workers.app import QUEUES, app

    unknown = sorted(set(_csv(queues)) - set(QUEUES))
    if unknown:
        raise _err(f"unknown queue(s) {unknown}; known: {', '.join(QUEUES)}")
    if "gpu" in _csv(queues) and concurrency != 1:
        raise _err("the gpu queue takes one process per GPU (the model lives in it): use --concurrency 1")
    argv = ["worker", "-Q", queues, "--pool", pool, "--concurrency", str(concurrency), "--loglevel", loglevel]
    if hostname:
        argv += ["-n", hostname]
    app.worker_main(argv)


def status(
    job: str = typer.Argument(None, help="a job id (prefix); omit for the newest jobs"),
    db: str = _DB,
    watch: bool = typer.Option(False, "--watch", help="redraw until the job is finished"),
) -> None:
    """Show one job's progress table, or a list of the newest jobs."""
    from rich.console import Console
    from rich.table import Table
    from sqlalchemy import select

    from db import store as db_store
    from db.models import Job
    from workers.embedded import progress_table, watch_job

    database = open_db(db)
    console = Console()
    if job is None:
        table = Table(title="jobs")
        for col in ("job", "name", "status", "created", "episodes", "finished"):
            table.add_column(col)
        with database.session() as s:
            for row in s.execute(select(Job).order_by(Job.created_at.desc()).limit(20)).scalars():
                summary = db_store.job_summary(s, row.id)
                table.add_row(
                    row.id,
                    row.name or "",
                    row.status,
                    f"{row.created_at:%Y-%m-%d %H:%M}",
                    str(summary.total),
                    str(summary.finished),
                )
        console.print(table)
        return
    try:
        with database.session() as s:
            job_id = db_store.get_job(s, job).id
    except LookupError as exc:
        raise _err(str(exc)) from None
    if watch:
        watch_job(database, job_id, console=console)
    else:
        console.print(progress_table(database, job_id))


def cancel(job: str = typer.Argument(..., help="job id (prefix)"), db: str = _DB) -> None:
    """Cancel a job: queued episodes will do nothing, running ones stop at their next turn."""
    from db import store as db_store
    from workers.tasks import cancel as cancel_job

    database = open_db(db)
    try:
        with database.session() as s:
            job_id = db_store.get_job(s, job).id
    except LookupError as exc:
        raise _err(str(exc)) from None
    revoked = cancel_job(database, job_id)
    typer.echo(f"cancelled job {job_id} ({len(revoked)} queued/running episodes revoked)")


def register(app: typer.Typer) -> None:
    """Attach this area's verbs to the root app."""
    for verb in (submit, run, worker, status, cancel):
        app.command(verb.__name__)(verb)
    service_results.register(app)
    service_rerun.register(app)
