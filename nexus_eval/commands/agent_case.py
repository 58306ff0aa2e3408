"""``nexus-eval agent-case``: the agent's case in one command, here (docs/agent_case.md).

1. runs an expert job (``jobs/bundled/agent_case.yaml`` by default: demonstrations of 2 ``mini`` tasks, each
   solved through the agent's real tools in a real container, graded) with an embedded worker, as ``run`` does;
2. replays its trajectories on a real model (``--model``, default smollm2-135m) under each method, scope,
   protocol and density (``measure.replay`` with a model: the text rendered into that model's stream);
3. prints the compare table: the demonstrations' line and the action table (copy top-1 with its interval, ΔNLL
   against dense) and its split by how far back each copy's source was.

Everything is stored in the results database (``--db``), so ``compare``, the dashboard and the report show it
later. Names are checked before anything runs. Each run submits a new job; when its replays stop part way (killed,
or some failed), the ``nexus-eval replay JOB --model ...`` line it prints continues them: only the replays not yet
stored ``ok`` run.
"""

from __future__ import annotations

from pathlib import Path

import typer

from nexus.config import EVICTION_DEFAULTS
from nexus_eval.commands import _job_flags as jf
from nexus_eval.commands._common import DB_OPTION, DTYPE_OPTION, PROCESSES, choose_measuring_dtype, csv_list, fail
from nexus_eval.commands.replay import REDO_OPTION
from results.table_formats import FORMAT_HELP

#: what the first command replays: the paper's method, its Ada variant and the two baselines it is read against
DEFAULT_METHODS = "dense,snapkv,streaming_llm,nexus,ada_nexus"


def agent_case(
    file: Path = typer.Option(None, "--file", "-f", help="an expert job file (default: the bundled agent case)"),
    tasks: str = jf.TASKS,
    model: str = typer.Option("smollm2-135m", "--model", help="the model the demonstrations are replayed on"),
    methods: str = typer.Option(DEFAULT_METHODS, "--methods", help="comma-separated methods to replay under"),
    scopes: str = typer.Option("prefill_only", "--scopes", help="comma-separated scopes"),
    protocols: str = typer.Option("true_eviction,full_context", "--protocols", help="comma-separated protocols"),
    densities: str = typer.Option(
        str(EVICTION_DEFAULTS["density"]), "--densities", help="comma-separated densities, e.g. 0.1,0.2,0.3"
    ),
    threads: int = typer.Option(1, min=1, help="torch CPU threads a process (on a small shared CPU 1 is the fastest)"),
    processes: int = PROCESSES,
    redo: bool = REDO_OPTION,
    dtype: str = DTYPE_OPTION,
    db: str = DB_OPTION,
    fmt: str = typer.Option("table", "--format", help=FORMAT_HELP),
) -> None:
    """Expert demonstrations of a few mini tasks in real containers, replayed on a real model under each method
    and protocol; print the action table (what an agent must copy, and how much of it each method keeps)."""
    from rich.console import Console

    from jobs.job_file import AGENT_CASE_JOB_FILE
    from measure.replay import check_replay_settings, plan_replays
    from nexus_eval.commands.replay import parse_densities, run_with_progress, say_resuming
    from nexus_eval.commands.service import run_here
    from results.compare import compare_jobs
    from results.compare_render import render

    overrides = jf.job_overrides(tasks=tasks)
    plan = jf.load_job(file or AGENT_CASE_JOB_FILE, overrides, what="nothing was run")
    if plan.spec.backend == "hf":
        fail("agent-case replays demonstrations: give a job whose backend is expert (or oracle / openai)")
    wanted = {
        "methods": csv_list(methods),
        "scopes": csv_list(scopes),
        "protocols": csv_list(protocols),
        "densities": parse_densities(densities),
    }
    try:  # every name, and a model this machine can find (agent_runner.model_lookup), before anything runs
        from agent_runner.model_lookup import resolve_model

        check_replay_settings(**wanted)
        resolve_model(model)
        console = Console(stderr=True, highlight=False)
        chosen = choose_measuring_dtype(console, dtype, None)
    except ValueError as exc:
        fail(f"{exc}\nnothing was run")
    database, job_id = run_here(plan, db, console)
    try:
        plan = plan_replays(database, job_id, model=model, chunked=True, redo=redo, dtype=chosen, **wanted)
    except (LookupError, ValueError) as exc:
        fail(str(exc))
    for episode_id, task_id, why in plan.missing:
        console.print(f"[yellow]not replayed:[/yellow] episode {episode_id} ({task_id}): {why}")
    say_resuming(console, plan)
    import torch

    torch.set_num_threads(threads)  # more threads than free cores makes this small-matrix work slower, not faster
    again = (  # what continues these replays: the same settings on this job, only those not stored ok
        f"`nexus-eval replay {job_id} --model {model} --methods {methods} --scopes {scopes} "
        f"--protocols {protocols} --densities {densities} --dtype {chosen}{f' --db {db}' if db else ''}`"
    )
    try:
        summary = run_with_progress(console, database, plan, chunked=True, processes=processes, threads=threads)
    except ValueError as exc:  # the model could not load
        fail(str(exc), code=1)
    except KeyboardInterrupt:
        console.print(f"[yellow]interrupted[/yellow]: {again} continues where it stopped", soft_wrap=True)
        raise typer.Exit(130) from None
    with database.session() as s:
        table = compare_jobs(s, [job_id])
    typer.echo(render(table, fmt))
    if summary.counts["failed"]:
        console.print(f"[red]{summary.counts['failed']} replays failed[/red]: {again} reruns them", soft_wrap=True)
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command("agent-case")(agent_case)
