"""CLI verbs that run jobs: submit, run (embedded), worker, status, cancel, resume.

Where the service lives comes from the environment: ``NEXUS_EVAL_BROKER`` (unset: the embedded SQLite
broker), ``NEXUS_EVAL_DB`` (unset: ./runs/nexus-eval.db; ``--db`` overrides it). See docs/service.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from nexus_eval.commands import _job_flags as jf
from nexus_eval.commands._common import (
    DB_OPTION,
    celery_app,
    csv_list,
    db_url,
    fail,
    job_id_of,
    open_db,
    read_db,
    service_settings,
)
from nexus_eval.commands._flag_group import takes_flags
from results.table_formats import FORMAT_HELP


@takes_flags
def submit(job: jf.JobFlags, db: str = DB_OPTION) -> None:
    """Submit a job to the queue and print its id (workers run it; see `nexus-eval worker`).

    The job is --file (or the job defaults, jobs/spec.py) with every flag given set on top of it."""
    plan = jf.load_job(job.file, job.overrides(), what="nothing was submitted", model_check=job.model_check)
    if job.show:
        jf.show(plan.spec)
    from rich.console import Console

    from jobs.submit import submit as submit_job
    from nexus_eval.commands._preflight import refuse_unless_ready
    from nexus_eval.readiness import preflight

    # Workers build missing task images on their own machine, so submit only checks. With the embedded
    # broker the worker is this machine: its daemon and images are checked too; with Redis they are not
    # (the workers' machines are elsewhere), but the broker must answer.
    broker = service_settings(db).broker_url  # $NEXUS_EVAL_BROKER, as the service settings read it
    pre = preflight(None if broker else list(plan.tasks), db_url=db_url(db), broker=broker, check_broker=True)
    refuse_unless_ready(pre, "nothing was submitted")
    from jobs.control import NotEnqueued

    app = celery_app(db)
    try:
        job_id, n = submit_job(open_db(db), plan, app=app)
    except NotEnqueued as exc:  # stored, not (all) sent: the message names the job and `resume`
        fail(str(exc), 1)
    typer.echo(job_id)
    from rich.markup import escape

    said = f"submitted job {job_id}: {n} episodes on the gpu queue; {who_runs_it(db)}"
    Console(stderr=True).print(escape(said), highlight=False, soft_wrap=True)


def who_runs_it(db: str | None) -> str:
    """Whether any worker listens on the gpu (and grade) queue, from the ``workers`` table (each worker writes its
    row every sweep; ``nexus_eval.service_readiness.queue_workers``), and how to start one when none does. Bounded: a
    SELECT or two."""
    from nexus_eval.service_readiness import queue_workers, sweep_window_s

    url, window, on_db = db_url(db), sweep_window_s(), f" --db {db}" if db else ""
    start = (
        f"start one: `nexus-eval worker{on_db}` (every queue; `--queues gpu` for this one alone), or run jobs with "
        f"`nexus-eval run{on_db}`, which brings its own worker"
    )
    gpu = queue_workers(url, "gpu", within_s=window)
    if gpu is None:
        return f"could not read which workers listen; if none does, {start}"
    if gpu["ok"]:
        n = len(gpu["ok"])
        said = f"{n} worker{'s' if n > 1 else ''} listen{'' if n > 1 else 's'} on it ({', '.join(gpu['ok'][:3])})"
        grade = queue_workers(url, "grade", within_s=window)
        if grade is not None and not grade["ok"]:
            said += f"; none on the grade queue (grades wait): `nexus-eval worker{on_db} --queues grade`"
        return said
    if gpu["paused"]:
        return (
            f"its workers ({', '.join(gpu['paused'])}) are paused: the Docker engine does not answer there "
            "(`nexus-eval doctor` says why); the episodes wait until it does"
        )
    return f"no worker listens on it (none reported in the last {window:g} s), so nothing runs it yet: {start}"


@takes_flags
def run(
    job: jf.RunJobFlags,
    db: str = DB_OPTION,
    timeout: float = typer.Option(None, help="give up after this many seconds"),
    fmt: str = typer.Option("table", "--format", help=f"compare output: {FORMAT_HELP}"),
) -> None:
    """Submit a job and run it here with an embedded worker (no Redis needed); print the compare table.

    `run` is `submit` plus a worker on this machine. With no --file it runs the bundled quick job (shown
    below; also examples/quick.yaml); every flag given is set on top of the job."""
    from jobs.job_file import QUICK_JOB_FILE

    plan = jf.load_job(job.file or QUICK_JOB_FILE, job.overrides(), what="nothing was run", model_check=job.model_check)
    spec = plan.spec
    if job.show:
        jf.show(spec)
    from rich.console import Console

    from nexus_eval.commands._preflight import print_failure_reasons
    from results.compare import compare_jobs
    from results.compare_render import render

    console = Console(stderr=True)
    database, job_id = run_here(plan, db, console, timeout=timeout)
    with database.session() as s:
        table = compare_jobs(s, [job_id])
    typer.echo(render(table, fmt))
    note = random_weights_note(spec)
    if note:  # after the table it qualifies; on stderr when stdout is data (json, csv, markdown)
        typer.echo(note, err=fmt != "table")
    print_failure_reasons(database, job_id, console)


def run_here(plan: Any, db: str | None, console: Any, *, timeout: float | None = None):
    """Submit the planned job (``jobs.submit.PlannedJob``, from ``load_job``) and run it with an embedded worker on
    this machine: (database, job id) once every episode ended. Exit 2 (nothing stored) when the machine cannot run
    it; exit 1 naming the episodes when the job did not finish."""
    from jobs.submit import submit as submit_job
    from nexus_eval.commands._job_progress import watch_job
    from nexus_eval.commands._preflight import build_or_fail, print_failure_reasons, refuse_unless_ready
    from nexus_eval.commands._progress import say
    from nexus_eval.readiness import preflight
    from workers.embedded import EmbeddedWorker

    url = db_url(db)
    # every backend drives containers: refuse (exit 2, nothing stored) what cannot work here, and build
    # what is only missing (the base image, local task images) before the job exists
    checks = preflight(list(plan.tasks), db_url=url)
    refuse_unless_ready(checks, "nothing was stored")
    build_or_fail(checks, console)
    database = open_db(url)
    job_id, n = submit_job(database, plan, app=celery_app(url, embedded=True))
    from db.urls import masked

    say(console, f"job {job_id} ({plan.spec.name or 'unnamed'}): {n} episodes; embedded worker on {masked(url)}")
    log_file = None
    if url.startswith("sqlite:///"):
        log_file = Path(url.removeprefix("sqlite:///")).with_name(f"worker-{job_id}.log")
    with EmbeddedWorker(url, log_file=log_file) as worker:
        finished = watch_job(database, job_id, console, worker=worker, timeout=timeout)
    if not finished:
        print_failure_reasons(database, job_id, console)  # the episodes that did end, and why
        where = f" (worker log: {log_file})" if log_file else ""
        fail(f"job {job_id} did not finish{where}; `nexus-eval status {job_id}` shows where it stopped", 1)
    return database, job_id


def random_weights_note(spec: Any) -> str | None:
    """What a job on the randomly initialised tiny model measures (nothing about quality), or None."""
    from agent_runner.config import SMOLLM2, TINY

    if spec.backend != "hf" or spec.model.name != TINY:
        return None
    return (
        f"note: the {TINY} model has random weights, so the agent resolves nothing, by design. These numbers check "
        "the plumbing (the pipeline, its telemetry, eviction running) and say nothing about a method's quality; "
        f"for that, `nexus-eval probe run` measures what eviction does to a real model's memory ({SMOLLM2}, "
        "SmolLM2-135M-Instruct; docs/probes.md)."
    )


def worker(
    queues: str = typer.Option("gpu,grade,default", "--queues", "-Q", help="comma-separated queues"),
    pool: str = typer.Option("prefork", help="prefork (time limits work) | solo"),
    concurrency: int = typer.Option(1, "--concurrency", "-c", help="processes; keep 1 per GPU on the gpu queue"),
    episodes_per_gpu: int = typer.Option(
        None,
        "--episodes-per-gpu",
        min=1,
        help="episodes one gpu worker runs at once, decoded together in one batched engine (threads pool) "
        "[default: $NEXUS_EVAL_EPISODES_PER_GPU, else 1]",
    ),
    device: str = typer.Option(
        None,
        "--device",
        help="this host's device for the model, e.g. cuda:1 (default: $NEXUS_EVAL_DEVICE or the job's)",
    ),
    hostname: str = typer.Option(None, "--hostname", "-n", help="worker node name"),
    loglevel: str = typer.Option("INFO", "--loglevel", "-l"),
    db: str = DB_OPTION,
) -> None:
    """Start a Celery worker on the chosen queues (broker from $NEXUS_EVAL_BROKER; results in $NEXUS_EVAL_DB).

    The worker's settings (``jobs.settings.ServiceSettings``: the environment's, these flags on top) reach each
    episode as arguments."""
    from jobs.queue import QUEUES

    unknown = sorted(set(csv_list(queues)) - set(QUEUES))
    if unknown:
        fail(f"unknown queue(s) {unknown}; known: {', '.join(QUEUES)}")
    flags = {k: v for k, v in {"episodes_per_gpu": episodes_per_gpu, "device": device}.items() if v is not None}
    rows = service_settings(db, **flags).episodes_per_gpu
    if "gpu" in csv_list(queues) and concurrency != 1:
        fail(
            "the gpu queue takes one process per GPU (the model lives in it): use --concurrency 1, and "
            "--episodes-per-gpu N to run N episodes in it at once"
        )
    if rows > 1:
        if "gpu" not in csv_list(queues):
            fail("--episodes-per-gpu applies to a worker on the gpu queue")
        # one process (one model), one thread per episode; Celery's time limits need prefork, so the
        # episode's own soft deadline (checked at turn boundaries) is what ends a long run here
        pool, concurrency = "threads", rows
    open_db(db)  # migrated before the first sweep (workers.faults.sweeper) reads it
    argv = ["worker", "-Q", queues, "--pool", pool, "--concurrency", str(concurrency), "--loglevel", loglevel]
    if hostname:
        argv += ["-n", hostname]
    celery_app(db, **flags).worker_main(argv)


def status(
    job: str = typer.Argument(None, help="a job id (prefix); omit for the newest jobs"),
    db: str = DB_OPTION,
    watch: bool = typer.Option(False, "--watch", help="redraw until the job is finished"),
) -> None:
    """Show one job's progress table, or a list of the newest jobs and of the workers (gone ones included)."""
    # both read counts (a GROUP BY, or the jobs' stored counts), never a job's episode rows: a 12,800-episode job's
    # table reads in tens of milliseconds, cheap enough for --watch to redraw it every second
    from rich.console import Console
    from rich.table import Table

    from db import job_rows
    from db.job_status import summarize_jobs
    from nexus_eval.commands._job_progress import watch_job
    from workers.embedded import progress_table

    database = read_db(db)
    console = Console()
    if job is None:
        table = Table(title="jobs")
        for col in ("job", "name", "status", "created", "episodes", "finished"):
            table.add_column(col)
        with database.session() as s:
            rows = job_rows.list_jobs(s, limit=20)
            summaries = summarize_jobs(s, rows)  # the stored counts: no job's episodes are read
            for row in rows:
                summary = summaries[row.id]
                created = f"{row.created_at:%Y-%m-%d %H:%M}"
                table.add_row(row.id, row.name or "", row.status, created, str(summary.total), str(summary.finished))
        console.print(table)
        console.print(_workers_table(database))
        return
    job_id = job_id_of(database, job)
    if watch:
        watch_job(database, job_id, console)
    else:
        console.print(progress_table(database, job_id))


def _workers_table(database):  # noqa: ANN202 - a rich Table or a line, imported lazily
    """The workers that reported in the last 3 sweeps and those marked gone in the last hour (``db.worker_rows``),
    as the dashboard lists them."""
    from rich.table import Table

    from db.models import utcnow
    from db.worker_rows import GONE_LISTED_S, recent_workers
    from nexus_eval.service_readiness import sweep_window_s

    now, window = utcnow(), sweep_window_s()
    with database.session() as s:
        rows = sorted(recent_workers(s, within_s=window, now=now, gone_within_s=GONE_LISTED_S), key=lambda r: r.name)
    if not rows:
        return f"no worker has reported in the last {window:g} s: `nexus-eval worker` starts one"
    table = Table(title="workers")
    for col in ("worker", "queues", "state", "since", "last seen", "detail"):
        table.add_column(col)
    for r in rows:
        seen = f"{max(0.0, (now - r.seen_at).total_seconds()):.0f} s ago"
        table.add_row(r.name, r.queues, r.state, f"{r.state_since:%Y-%m-%d %H:%M:%S} UTC", seen, r.detail or "")
    return table


def cancel(job: str = typer.Argument(..., help="job id (prefix)"), db: str = DB_OPTION) -> None:
    """Cancel a job: queued episodes will do nothing, running ones stop at their next turn."""
    from jobs.control import cancel as cancel_job

    database = read_db(db)
    job_id = job_id_of(database, job)
    revoked = cancel_job(database, job_id, app=celery_app(db))
    if revoked is None:
        why = "has no episode queued, running or waiting for its grade"
        typer.echo(f"job {job_id} {why}: nothing cancelled, its status is unchanged")
        return
    typer.echo(f"cancelled job {job_id} ({len(revoked)} queued/running episodes revoked)")


def resume(job: str = typer.Argument(..., help="job id (prefix)"), db: str = DB_OPTION) -> None:
    """Send again every episode of a job that nothing would finish otherwise: queued ones (a send was lost),
    running ones whose worker stopped beating, agent exits whose grade nobody started. Safe to repeat: an
    episode that is already queued or held is never run twice."""
    from db import job_rows
    from workers.celery_tasks import resume as resume_job

    database = read_db(db)
    job_id = job_id_of(database, job)
    try:
        counts = resume_job(database, job_id, app=celery_app(db))
    except Exception as exc:  # the broker: whatever was sent stays sent, the rest stays queued
        fail(f"job {job_id}: could not send: {type(exc).__name__}: {exc}; run `nexus-eval resume {job_id}` again", 1)
    with database.session() as s:
        status = job_rows.get_job(s, job_id).status
    said = ", ".join(f"{n} {what.replace('_', ' ')}" for what, n in counts.items())
    typer.echo(f"job {job_id}: {said}; job {status}")


def register(app: typer.Typer) -> None:
    """Attach this area's verbs to the root app."""
    from jobs.job_file import QUICK_JOB_FILE

    for verb in (submit, worker, status, cancel, resume):
        app.command(verb.__name__)(verb)
    # `run --help` shows the bundled quick job itself, so what runs without a --file is never a guess
    from rich.markup import escape

    quick = "\n".join(line for line in QUICK_JOB_FILE.read_text().splitlines() if line.strip())
    app.command("run", epilog=escape(f"The quick job (jobs/bundled/quick.yaml):\n\n{quick}"))(run)
