"""`nexus-eval tasks convert IN OUT`: classic SWE-bench rows -> rows swebench 5.x can grade.

The verb is attached to the existing `tasks` sub-app by `register(app)` (or `tasks_app.command("convert")(convert)`).
The work is `env.tasks.swebench_legacy.convert_classic_rows` (swebench 4.1.0 in its own venv, built on first use).
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from nexus_eval.commands._common import fail


def convert(
    in_path: Path = typer.Argument(..., metavar="IN", help="classic rows: a .json, .jsonl or .parquet file"),
    out_path: Path = typer.Argument(..., metavar="OUT", help="the converted rows, written as JSONL"),
    namespace: str = typer.Option(
        "swebench", "--namespace", help="Docker Hub namespace of the instance images; 'none' for local image names"
    ),
    arch: str = typer.Option("x86_64", "--arch", help="image architecture: x86_64 or arm64"),
) -> None:
    """Add eval_script, log_parser, eval_type and image (computed by swebench 4.1.0) to classic SWE-bench rows.

    Rows that already carry an eval_script are written unchanged. Failed rows are listed at the end (exit 1).
    """
    from rich.console import Console
    from rich.markup import escape
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from env.tasks.loading import TaskError, _read_rows
    from env.tasks.swebench_legacy import LegacySwebenchError, convert_classic_rows

    console = Console(stderr=True)
    if not in_path.is_file():
        fail(f"{in_path}: no such file")
    if arch not in ("x86_64", "arm64"):
        fail(f"--arch must be x86_64 or arm64, not {arch!r}")
    try:
        labelled = list(_read_rows(in_path))
    except TaskError as exc:
        fail(str(exc))
    not_rows = [label for label, row in labelled if not isinstance(row, dict)]
    if not_rows:
        fail(f"{not_rows[0]}: not a JSON object" + (f" (and {len(not_rows) - 1} more)" if len(not_rows) > 1 else ""))
    rows = [row for _, row in labelled]

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        bar = progress.add_task(f"converting {len(rows)} rows with swebench 4.1.0", total=len(rows))

        def advanced(index: int, ok: bool) -> None:
            progress.update(
                bar, advance=1, description=f"converted {escape(str(rows[index].get('instance_id', index)))}"
            )

        try:
            result = convert_classic_rows(
                rows, namespace=None if namespace.lower() in ("", "none") else namespace, arch=arch, on_row=advanced
            )
        except LegacySwebenchError as exc:
            fail(str(exc), code=1)

    out_path.parent.mkdir(parents=True, exist_ok=True)
    with out_path.open("w", encoding="utf-8") as out:
        for row in result.rows:
            out.write(json.dumps(row, default=str) + "\n")
    converted = len(result.rows) - result.passed_through
    console.print(
        f"wrote {len(result.rows)} rows to {escape(str(out_path))}: {converted} converted "
        f"({result.cached} from the cache), "
        f"{result.passed_through} already 5.x rows passed through, {len(result.errors)} failed",
        highlight=False,
        soft_wrap=True,
    )
    for error in result.errors:
        line = f"[red]failed:[/red] row {error.index} {escape(f'{error.instance_id}: {error.reason}')}"
        console.print(line, highlight=False, soft_wrap=True)
    if result.errors:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Attach `convert` to the `tasks` sub-app (already added to `app` by nexus_eval.commands.tasks)."""
    from nexus_eval.commands.tasks import tasks_app

    tasks_app.command("convert")(convert)
