"""CLI verbs that read results: compare, inspect, export, regrade (no agent, no worker needed)."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from nexus_eval.commands._common import DB_OPTION, fail, open_db


def compare(
    jobs: list[str] = typer.Argument(..., help="one or more job ids (prefixes), or one probe run id"),
    fmt: str = typer.Option("table", "--format", help="table | json | csv | markdown"),
    db: str = DB_OPTION,
) -> None:
    """Table 3: scope x protocol rows, method columns, resolved rate with 95% CI, McNemar vs dense.

    Given one probe run id instead, the probe run's table (as `nexus-eval probe show`)."""
    from workers.compare import compare_jobs
    from workers.compare_render import FORMATS, render

    if fmt not in FORMATS:
        fail(f"unknown --format {fmt!r}; use one of {', '.join(FORMATS)}")
    database = open_db(db)
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
            table = compare_jobs(s, jobs)
    except LookupError as exc:
        fail(str(exc))
    typer.echo(render(table, fmt))


def _fmt_stats(stats: dict | None) -> str:
    return "-" if not stats else f"{stats['min']:.0f}/{stats['mean']:.0f}/{stats['max']:.0f}"


def inspect(
    episode: str = typer.Argument(..., help="episode id (prefix)"),
    full: bool = typer.Option(False, "--full", help="print every turn's thought, action and observation"),
    as_json: bool = typer.Option(False, "--json", help="the episode and its turns as JSON"),
    db: str = DB_OPTION,
) -> None:
    """An episode's trajectory and per-turn cache telemetry."""
    from rich.console import Console
    from rich.table import Table

    from db import store as db_store

    database = open_db(db)
    try:
        with database.session() as s:
            row = db_store.get_episode(s, episode)
            turns = list(row.turns)
            info = {c.name: getattr(row, c.name) for c in row.__table__.columns}
            turn_rows = [{c.name: getattr(t, c.name) for c in t.__table__.columns} for t in turns]
    except LookupError as exc:
        fail(str(exc))
    if as_json:
        from env.grading.hostlog import unpack

        info["test_log"] = unpack(info.get("test_log")) or None
        typer.echo(json.dumps({"episode": info, "turns": turn_rows}, default=str))
        return
    console = Console()
    console.print(
        f"[bold]episode {info['id']}[/bold] job {info['job_id']} attempt {info['attempt']}: "
        f"{info['task_id']} {info['method']}/{info['scope']}/{info['protocol']} seed {info['seed']}"
    )
    console.print(
        f"status [bold]{info['status']}[/bold] (agent exit {info['exit_status']}), {info['n_turns']} turns,"
        f" generated {info['generated_tokens']} tokens, peak cache {info['peak_cache_bytes']} bytes"
    )
    if info["error"]:
        console.print(f"[yellow]{info['error'].splitlines()[0]}[/yellow]")
    if info.get("grader"):
        grade = (info.get("result") or {}).get("grade") or {}
        offline = (
            " [yellow](the task needs the network; graded without it)[/yellow]" if grade.get("needs_network") else ""
        )
        console.print(f"graded by {info['grader']} ({info['grader_version']}){offline}")
    table = Table(title="turns")
    for col in (
        "turn",
        "action",
        "appended",
        "generated",
        "logical",
        "physical before",
        "physical after",
        "events",
        "cache bytes",
        "prefill s",
        "decode s",
        "env s",
    ):
        table.add_column(col, justify="left" if col == "action" else "right")
    for t in turn_rows:
        action = (t["action"] or {}).get("name", "(no call)")
        if (t["extra"] or {}).get("intervened"):
            action += " *"
        table.add_row(
            str(t["index"]),
            action,
            str(t["tokens_appended"]),
            str(t["tokens_generated"]),
            str(t["logical_length"]),
            _fmt_stats(t["physical_before"]),
            _fmt_stats(t["physical_after"]),
            str(t["eviction_events"]),
            str(t["cache_bytes"] or "-"),
            f"{t['prefill_s']:.2f}",
            f"{t['decode_s']:.2f}",
            f"{t['env_s']:.2f}",
        )
    console.print(table)
    if full:
        for t in turn_rows:
            console.rule(f"turn {t['index']}")
            console.print("[bold]thought[/bold]", t["thought"] or "", highlight=False, markup=False)
            console.print("[bold]action[/bold]", json.dumps(t["action"]), highlight=False)
            console.print("[bold]observation[/bold]", (t["observation"] or "")[:4000], highlight=False, markup=False)


def export(
    job: str = typer.Argument(..., help="job id (prefix)"),
    output: Path = typer.Option(None, "--output", "-o", help="file to write (default: stdout)"),
    model_name: str = typer.Option(None, "--model-name", help="model_name_or_path (default: model/method/...)"),
    db: str = DB_OPTION,
) -> None:
    """SWE-bench predictions JSONL (instance_id, model_name_or_path, model_patch) for the official harness.

    One line per latest attempt that left a patch; episodes of several methods get distinct model names."""
    from db import store as db_store

    database = open_db(db)
    try:
        with database.session() as s:
            the_job = db_store.get_job(s, job)
            model = ((the_job.config or {}).get("model") or {}).get("name") or (the_job.config or {}).get("backend")
            rows = [
                (r.task_id, r.method, r.scope, r.protocol, r.seed, r.patch)
                for r in db_store.latest_attempts(s, [the_job.id])
                if r.patch is not None
            ]
    except LookupError as exc:
        fail(str(exc))
    lines = []
    for task_id, method, scope, protocol, seed, patch in rows:
        name = model_name or f"{model}__{method}__{scope}__{protocol}__seed{seed}"
        lines.append(json.dumps({"instance_id": task_id, "model_name_or_path": name, "model_patch": patch}))
    text = "".join(line + "\n" for line in lines)
    if output:
        output.write_text(text, encoding="utf-8")
        typer.echo(f"wrote {len(lines)} predictions to {output}", err=True)
    else:
        typer.echo(text, nl=False)


def regrade(job: str = typer.Argument(..., help="job id (prefix)"), db: str = DB_OPTION) -> None:
    """Re-derive every verdict from the stored test logs (no agent, no container); print what changed."""
    from rich.console import Console
    from rich.table import Table

    from workers.execution import regrade_job

    database = open_db(db)
    try:
        changes = regrade_job(database, job)
    except LookupError as exc:
        fail(str(exc))
    table = Table(title=f"regraded {len(changes)} episodes")
    for col in ("episode", "before", "after"):
        table.add_column(col)
    for episode_id, old, new in changes:
        table.add_row(episode_id, old or "-", new if new == old else f"[bold]{new}[/bold]")
    Console().print(table)


def register(app: typer.Typer) -> None:
    for verb in (compare, inspect, export, regrade):
        app.command(verb.__name__)(verb)
