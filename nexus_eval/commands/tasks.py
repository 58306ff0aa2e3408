"""CLI verbs for tasks: `tasks validate` (gold patch resolves, base state fails F2P and passes P2P)."""

from __future__ import annotations

import json
from pathlib import Path

import typer

tasks_app = typer.Typer(help="Task suites and task folders.", no_args_is_help=True)


@tasks_app.command("validate")
def validate(
    suite: str = typer.Option(None, "--suite", help="a bundled suite name, e.g. mini"),
    path: Path = typer.Option(None, "--path", help="a folder of local tasks (or one task folder)"),
    file: str = typer.Option(
        None, "--file", help="a JSON/JSONL/parquet file of dataset rows, or a Hugging Face dataset name"
    ),
    split: str = typer.Option("test", "--split", help="the dataset split, with --file NAME (R2E-Gym's is train)"),
    r2e_route: bool = typer.Option(
        False, "--r2e-route", help="grade R2E's SWE-bench rows with R2E-Gym's in-loop reward, not swebench's"
    ),
    task_id: list[str] = typer.Option(None, "--task", help="only these instance ids (repeatable)"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON list instead of a table"),
) -> None:
    """Grade every task's gold patch and its base state in fresh containers; exit 1 if any is invalid."""
    from rich.console import Console
    from rich.markup import escape
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    from env.grading import GradeConfig
    from env.grading.validate import validate_tasks
    from env.tasks.loading import TaskError, load_local_task, load_suite, load_tasks
    from nexus_eval.commands._common import fail, service_settings

    console = Console(stderr=True)
    if sum(x is not None for x in (suite, path, file)) != 1:
        fail("give exactly one of --suite NAME, --path DIR or --file ROWS")
    ceilings = service_settings().grading_ceilings  # the operator's, as a worker would load the rows
    try:
        if suite is not None:
            tasks = load_suite(suite, ceilings=ceilings)
        elif file is not None:
            tasks = load_tasks(file, split=split, ceilings=ceilings)
            for skipped in getattr(tasks, "skipped", []):
                console.print(f"[yellow]skipped:[/yellow] {escape(str(skipped))}")
        elif (path / "task.json").is_file():
            tasks = [load_local_task(path, ceilings=ceilings)]
        else:
            tasks = load_suite(path, ceilings=ceilings)
    except TaskError as exc:
        fail(str(exc))
    if task_id:
        unknown = sorted(set(task_id) - {t.instance_id for t in tasks})
        if unknown:
            fail(f"--task: no such task(s) {unknown}")
        tasks = [t for t in tasks if t.instance_id in set(task_id)]

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=as_json) as progress:
        bar = progress.add_task(f"validating {len(tasks)} tasks", total=len(tasks))

        def done(verdict) -> None:
            progress.update(bar, advance=1, description=f"validated {escape(verdict.instance_id)}")

        config = GradeConfig(r2e_swebench_route="r2e" if r2e_route else "swebench")
        results = validate_tasks(tasks, config=config, on_done=done)

    if as_json:
        typer.echo(json.dumps([r.model_dump() for r in results], indent=2))
    else:
        table = Table(title=f"task validation ({sum(r.valid for r in results)}/{len(results)} valid)")
        for column in ("task", "valid", "grader", "gold patch", "base state", "seconds", "problems"):
            table.add_column(column, overflow="fold", no_wrap=column != "problems")
        for r in results:
            table.add_row(
                r.instance_id,
                "[green]yes[/green]" if r.valid else "[red]NO[/red]",
                r.grader,
                r.gold_status,
                r.base_status,
                f"{r.seconds:.1f}",
                "\n".join(r.problems),
            )
        Console().print(table)
    if not all(r.valid for r in results):
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Attach this area's verbs to the root app."""
    app.add_typer(tasks_app, name="tasks")
