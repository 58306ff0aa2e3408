"""``nexus-eval replay JOB``: score the job's dense trajectories under other methods' caches, in this process.

No worker and no container: the stored token streams are teacher-forced through each method's cache on this
machine's model (``measure.replay``), the rows go to the results database and ``compare`` shows them. With
``--model NAME`` the trajectories' text is rendered into NAME's stream under each protocol instead, and each call
is scored span by span (the agent's case: ``expert`` demonstrations, or any oracle / openai job). Names and the
job are checked before the model loads, so a typo costs nothing. ``--method-params`` runs a method under other
settings than the job's (``{"nexus": {"head_scores": "per_head"}}``, or a YAML/JSON file): a variant, whose rows
``compare`` tables apart, named ``nexus[head_scores=per_head]``.

Running the same command again continues where it stopped: a replay already stored ``ok`` (measured the same way:
chunked or ``--token-by-token``) is not measured again, failed and skipped ones are; ``--redo`` measures every one.
"""

from __future__ import annotations

import typer

from nexus_eval.commands._common import (
    DB_OPTION,
    DTYPE_OPTION,
    PROCESSES,
    choose_measuring_dtype,
    csv_list,
    fail,
    read_db,
)

REDO_OPTION = typer.Option(
    False, "--redo", help="measure again replays already stored ok (default: run only those not stored ok yet)"
)


def replay(
    job: str = typer.Argument(..., help="job id (prefix)"),
    methods: str = typer.Option(None, "--methods", help="comma-separated methods (default: the job's own)"),
    scopes: str = typer.Option(None, "--scopes", help="comma-separated scopes (default: the job's own)"),
    protocols: str = typer.Option(None, "--protocols", help="comma-separated protocols (default: the job's own)"),
    densities: str = typer.Option(
        None,
        "--densities",
        help="comma-separated densities to replay each method at, e.g. 0.1,0.2,0.5 (default: the job's)",
    ),
    token_by_token: bool = typer.Option(
        False, "--token-by-token", help="feed completions one token per forward (slow; chunks give the same logits)"
    ),
    device: str = typer.Option(None, "--device", help="the model's device here (default: the job's model device)"),
    model: str = typer.Option(
        None,
        "--model",
        help="render each trajectory's text into this model (e.g. smollm2-135m) and score its calls span by span; "
        "needed for a backend that stores text only (expert, oracle, openai)",
    ),
    method_params: str = typer.Option(
        None,
        "--method-params",
        help='per-method settings over the job\'s own, for this replay only: JSON (\'{"nexus": {"head_scores": '
        '"per_head"}}\') or a YAML/JSON file; its rows are tabled apart as nexus\\[head_scores=per_head]',
    ),
    threads: int = typer.Option(1, min=1, help="torch CPU threads a process (on a small shared CPU 1 is the fastest)"),
    processes: int = PROCESSES,
    tasks: str = typer.Option(None, "--tasks", help="comma-separated task ids or globs (default: every task)"),
    redo: bool = REDO_OPTION,
    dtype: str = DTYPE_OPTION,
    db: str = DB_OPTION,
) -> None:
    """Teacher-force the job's dense episodes through each method's cache; store NLL and top-1 per replay."""
    from rich.console import Console

    from measure.replay import plan_replays

    console = Console(stderr=True, highlight=False)
    database = read_db(db)
    try:
        chosen = choose_measuring_dtype(console, dtype, device)
        plan = plan_replays(
            database,
            job,
            methods=csv_list(methods) if methods else None,
            scopes=csv_list(scopes) if scopes else None,
            protocols=csv_list(protocols) if protocols else None,
            densities=parse_densities(densities) if densities else None,
            device=device,
            model=model,
            tasks=csv_list(tasks) if tasks else None,
            method_params=_method_params(method_params) if method_params else None,
            chunked=not token_by_token,
            redo=redo,
            dtype=chosen,
        )
    except (LookupError, ValueError) as exc:
        fail(str(exc))
    for episode_id, task_id, why in plan.missing:
        console.print(f"[yellow]not replayed:[/yellow] dense episode {episode_id} ({task_id}): {why}")
    if not plan.items and not plan.done:
        what = "a trajectory to render" if model else "a stored token stream (text trajectories: --model NAME)"
        fail(f"nothing to replay in job {plan.job_id}: no dense episode has {what}", code=1)
    say_resuming(console, plan)
    if plan.items:
        import torch

        torch.set_num_threads(threads)  # more threads than free cores makes this small-matrix work slower
    try:
        summary = run_with_progress(
            console, database, plan, chunked=not token_by_token, processes=processes, threads=threads
        )
    except ValueError as exc:  # the model host could not load
        fail(str(exc), code=1)
    Console().print(_table(summary, stored=len(plan.done)))
    _problems(console, summary.results)
    if summary.counts["failed"]:
        raise typer.Exit(1)


def say_resuming(console, plan) -> None:  # type: ignore[no-untyped-def]
    """One line when some planned replays are already stored ok (``plan.done``): how many are left to run."""
    done, total = len(plan.done), len(plan.done) + len(plan.items)
    if not done:
        return
    if plan.items:
        line = f"resuming: {done} of {total} replays already stored, {len(plan.items)} to run"
    else:
        line = f"all {total} replays already stored, none to run"
    console.print(f"{line} (--redo measures them again)", soft_wrap=True)


def parse_densities(text: str) -> list[float]:
    try:
        return [float(d) for d in csv_list(text)]
    except ValueError:
        fail(f"--densities: {text!r} is not a comma-separated list of numbers")


def _method_params(text: str) -> dict:
    """``--method-params``: a JSON mapping, or the path of a YAML/JSON file holding one."""
    import json
    from pathlib import Path

    import yaml

    stripped = text.strip()
    if stripped.startswith("{"):
        try:
            data = json.loads(stripped)
        except json.JSONDecodeError as exc:
            fail(f"--method-params: not valid JSON: {exc}")
    else:
        path = Path(text).expanduser()
        if not path.is_file():
            fail(f"--method-params: {text!r} is neither a JSON mapping nor a file")
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8"))  # YAML reads JSON too
        except (OSError, yaml.YAMLError) as exc:
            fail(f"--method-params: cannot read {path}: {exc}")
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        fail('--method-params: must map each method to its settings, e.g. {"nexus": {"head_scores": "per_head"}}')
    return data


def run_with_progress(console, database, plan, *, chunked: bool, processes: int = 1, threads: int = 1):  # type: ignore[no-untyped-def]
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from measure.processes import resolve_processes
    from measure.replay import run_plan

    processes = resolve_processes(processes, plan.model.device if plan.model else None)

    if not plan.items:  # every replay is stored already: the summary of the stored rows, no model loaded
        return run_plan(database, plan, chunked=chunked)

    def describe(result) -> str:  # type: ignore[no-untyped-def]
        i = result.item
        at = f"@{i.eviction['density']:g}" if i.method != "dense" else ""
        return f"{i.method}{at}/{i.scope}/{i.protocol} {i.task_id}"

    if not console.is_terminal:  # a pipe or a log file: one plain line per replay as it is stored
        where = f" in {processes} processes" if processes > 1 else ""
        console.print(f"replay {plan.job_id}: {len(plan.items)} replays planned; loading the model{where}")

        def line(result, done, total):  # type: ignore[no-untyped-def]
            console.print(f"[{done}/{total}] {result.status} {describe(result)}", soft_wrap=True)

        return run_plan(database, plan, chunked=chunked, progress=line, processes=processes, threads=threads)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=False) as bar:
        task = bar.add_task(f"replay {plan.job_id}: loading the model", total=len(plan.items))

        def progress(result, done, total):  # type: ignore[no-untyped-def]
            bar.update(task, completed=done, description=f"replay {describe(result)}")

        return run_plan(database, plan, chunked=chunked, progress=progress, processes=processes, threads=threads)


def _problems(console, results, limit: int = 10) -> None:  # type: ignore[no-untyped-def]
    """The skipped / failed replays, one line per distinct first line of the error (the rows hold the rest)."""
    groups: dict[tuple[str, str], list[str]] = {}
    for r in results:
        if r.status != "ok":
            first = (r.error or "").splitlines()[0] if r.error else "(no message)"
            groups.setdefault((r.status, first), []).append(f"{r.item.method}/{r.item.protocol}")
    for (status, message), where in list(groups.items())[:limit]:
        console.print(f"[yellow]{status}[/yellow] {', '.join(sorted(set(where)))}: {message}")
    if len(groups) > limit:
        console.print(f"... and {len(groups) - limit} more distinct errors (the replay rows hold every one)")


def _table(summary, stored: int = 0):  # type: ignore[no-untyped-def]
    from rich.markup import escape
    from rich.table import Table

    from results.compare_render import REPLAY_HEADER, replay_text, several_dtypes
    from results.replay_stats import replay_caption

    counts = ", ".join(
        [f"{n} {status}" for status, n in summary.counts.items() if n] + ([f"{stored} stored before"] if stored else [])
    )
    table = Table(title=f"replay {summary.job_id}: {counts or 'nothing ran'}", caption=replay_caption(summary.cells))
    for i, name in enumerate(REPLAY_HEADER):
        table.add_column(name, justify="left" if i < 4 else "right")
    for cell in summary.cells:  # escaped: a variant's label, nexus[head_scores=per_head], is not rich markup
        table.add_row(*(escape(v) for v in replay_text(cell, several_dtypes(summary.cells))))
    return table


def register(app: typer.Typer) -> None:
    app.command("replay")(replay)
