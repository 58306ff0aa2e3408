"""CLI verbs that read results: compare, export, regrade (no agent, no worker needed). Listing and reading one
episode (``episodes``, ``inspect``) live in ``service_episodes``."""

from __future__ import annotations

from pathlib import Path

import typer

from nexus_eval.commands._common import DB_OPTION, fail, read_db
from results.table_formats import FORMAT_HELP, unknown_format


def compare(
    jobs: list[str] = typer.Argument(..., help="one or more job ids (prefixes), or one probe run id"),
    fmt: str = typer.Option("table", "--format", help=FORMAT_HELP),
    include_interactive: bool = typer.Option(
        False,
        "--include-interactive",
        help="count interactive attempts (rerun --interactive, steered or not) as results, marked *",
    ),
    db: str = DB_OPTION,
) -> None:
    """Table 3: scope x protocol x density rows, method columns, resolved rate with 95% CI, a paired test vs dense,
    and quality beside cost (kept fraction, KV held and allocated, turns, generated tokens, wall time per episode).

    Several jobs (a sweep over the budget) are aligned by method, scope, protocol and density; other setting
    differences are named in the notes. Each key counts its first agent attempt that did not break; later ones are
    resamples, shown apart as best of n; interactive reruns are kept apart (a note says how many) unless
    --include-interactive. A job of the expert stand-in holds demonstrations, never a Pass@1 cell: it gets one
    line, and its replays (nexus-eval replay JOB --model NAME) the replay table and the action table (copy top-1
    of the calls' copied values per method, ΔNLL vs dense, by distance). What each number means: docs/numbers.md.
    Given one probe run id instead, the probe run's table."""
    from results.compare import compare_jobs
    from results.compare_render import render

    if message := unknown_format(fmt):
        fail(message)
    database = read_db(db)
    if len(jobs) == 1:
        from db.probes import job_or_probe_run

        try:
            with database.session() as s:
                kind, full_id = job_or_probe_run(s, jobs[0])
        except LookupError as exc:
            fail(str(exc))
        if kind == "probe_run":
            from nexus_eval.commands.probe import show_table

            show_table(database, full_id, fmt)
            return
    try:
        with database.session() as s:
            table = compare_jobs(s, jobs, include_interactive=include_interactive)
    except LookupError as exc:
        fail(str(exc))
    typer.echo(render(table, fmt))


def export(
    job: str = typer.Argument(..., help="job id (prefix)"),
    output: Path = typer.Option(None, "--output", "-o", help="the file for one configuration (default: stdout)"),
    output_dir: Path = typer.Option(
        None, "--output-dir", help="write one file per configuration into this folder (it is created)"
    ),
    method: str = typer.Option(None, "--method", help="only this method"),
    scope: str = typer.Option(None, "--scope", help="only this scope"),
    protocol: str = typer.Option(None, "--protocol", help="only this protocol"),
    seed: int = typer.Option(None, "--seed", help="only this seed"),
    model_name: str = typer.Option(
        None, "--model-name", help="model_name_or_path for a single configuration (default: model__method__...)"
    ),
    r2e_filter: bool = typer.Option(
        False,
        "--r2e-filter",
        help="R2E-Gym's true_output_patch: only .py files the agent edited with file_editor str_replace",
    ),
    include_interactive: bool = typer.Option(
        False, "--include-interactive", help="export interactive attempts (steered or not) in place of the agent's"
    ),
    db: str = DB_OPTION,
) -> None:
    """SWE-bench predictions JSONL (instance_id, model_name_or_path, model_patch) for the official harness.

    One configuration (method, scope, protocol, seed) per file, since the harness keeps one prediction per
    instance: pick one with --method/--scope/--protocol/--seed, or use --output-dir for one file each. Each
    key's result attempt (its first the agent drove alone that did not break) that left a non-empty patch is written."""
    from results.export import collect, write_each, write_one

    if output is not None and output_dir is not None:
        fail("give --output FILE or --output-dir DIR, not both")
    database = read_db(db)
    only = {"method": method, "scope": scope, "protocol": protocol, "seed": seed}
    # two streaming reads, a chunk of patches held at a time (results.export): what the files will hold first, so
    # an ambiguous or empty export is refused before anything is written; then the lines, written as they come
    try:
        with database.session() as s:
            found = collect(s, job, r2e_filter=r2e_filter, include_interactive=include_interactive, only=only)
    except LookupError as exc:
        fail(str(exc))
    if not found.files:
        fail(f"nothing to export from job {found.job_id}: {found.summary()}")
    if output_dir is None and len(found.files) > 1:
        listed = "\n".join(f"  {c.label}" for c in found.files)
        fail(
            f"job {found.job_id} has {len(found.files)} configurations and the harness keeps one prediction per "
            f"instance, so one file must hold one:\n{listed}\npick one with --method/--scope/--protocol/--seed, "
            "or write one file each with --output-dir DIR"
        )
    if model_name and len(found.files) > 1:
        fail("--model-name names one configuration; with several, each file is named model__method__scope__...")
    for instance_id, episode_id in found.interactive:
        typer.echo(f"note: {instance_id} comes from interactive attempt {episode_id}", err=True)
    if output_dir is None:
        (configuration,) = found.files
        name = model_name or configuration.model_name(found.model)
        with database.session() as s:
            if output is None:
                write_one(s, found, name, lambda text: typer.echo(text, nl=False))
            else:
                with output.open("w", encoding="utf-8") as f:
                    write_one(s, found, name, f.write)
        typer.echo(f"{configuration.label}: {found.summary()}" + (f" -> {output}" if output else ""), err=True)
        return
    try:
        output_dir.mkdir(parents=True, exist_ok=True)
        with database.session() as s:
            write_each(s, found, output_dir)
    except OSError as exc:
        fail(f"cannot write into {output_dir}: {exc.strerror or exc}", 1)
    typer.echo(f"wrote {found.summary()} to {output_dir}", err=True)


def regrade(
    job: str = typer.Argument(..., help="job id (prefix)"),
    include_interactive: bool = typer.Option(
        False,
        "--include-interactive",
        help="regrade a key's newest interactive attempt in place of its result, where it has one",
    ),
    db: str = DB_OPTION,
) -> None:
    """Re-derive every result's verdict from the stored test logs (no agent, no container); print what changed."""
    from rich.console import Console
    from rich.table import Table

    from workers.grade_stored import regrade_job

    database = read_db(db)
    try:
        changes = regrade_job(database, job, include_interactive=include_interactive)
    except LookupError as exc:
        fail(str(exc))
    table = Table(title=f"regraded {len(changes)} episodes")
    for col in ("episode", "before", "after"):
        table.add_column(col)
    for episode_id, old, new in changes:
        table.add_row(episode_id, old or "-", new if new == old else f"[bold]{new}[/bold]")
    Console().print(table)


def register(app: typer.Typer) -> None:
    for verb in (compare, export, regrade):
        app.command(verb.__name__)(verb)
