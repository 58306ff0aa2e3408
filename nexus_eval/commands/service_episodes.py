"""CLI verbs over one job's episode rows: ``episodes JOB`` lists them (the ids ``inspect`` and ``rerun`` take),
``inspect EPISODE`` shows one trajectory with its per-turn cache telemetry."""

from __future__ import annotations

import json

import typer

from nexus_eval.commands._common import DB_OPTION, csv_list, fail, open_db

EPISODE_COLUMNS = ("episode", "task", "method", "scope", "protocol", "seed", "attempt", "driver", "result", "status")
EPISODE_FORMATS = ("table", "tsv", "json")


def episodes(
    job: str = typer.Argument(..., help="job id (prefix)"),
    statuses: str = typer.Option(None, "--status", help="only these statuses (comma-separated)"),
    method: str = typer.Option(None, "--method", help="only this method"),
    results_only: bool = typer.Option(
        False, "--results", help="only each key's result attempt (its first the agent drove alone that did not break)"
    ),
    fmt: str = typer.Option(None, "--format", help="table | tsv | json (default: table on a terminal, tsv in a pipe)"),
    db: str = DB_OPTION,
) -> None:
    """Every attempt of a job: id, task, configuration, seed, attempt, who drove it and its status.

    `driver` is agent (the service ran it), interactive (rerun --interactive, the model's actions) or steered
    (an operator changed an action); `result` marks the attempt compare counts for its key."""
    import sys

    from db import store as db_store

    fmt = fmt or ("table" if sys.stdout.isatty() else "tsv")
    if fmt not in EPISODE_FORMATS:
        fail(f"unknown --format {fmt!r}; use one of {', '.join(EPISODE_FORMATS)}")
    wanted = set(csv_list(statuses)) if statuses else None
    database = open_db(db)
    try:
        with database.session() as s:
            the_job = db_store.get_job(s, job)
            results = {r.id for r in db_store.result_attempts(s, [the_job.id])}
            rows = [
                dict(
                    zip(
                        EPISODE_COLUMNS,
                        (r.id, r.task_id, r.method, r.scope, r.protocol, r.seed, r.attempt, r.driver)
                        + (r.id in results, r.status),
                        strict=True,
                    )
                )
                for r in db_store.episodes_for_job(s, the_job.id)
                if (wanted is None or r.status in wanted)
                and (method is None or r.method == method)
                and (not results_only or r.id in results)
            ]
    except LookupError as exc:
        fail(str(exc))
    if fmt == "json":
        typer.echo(json.dumps(rows, indent=1))
        return
    if fmt == "tsv":
        text = "\t".join(EPISODE_COLUMNS) + "\n"
        text += "".join("\t".join(_cell(row[c]) for c in EPISODE_COLUMNS) + "\n" for row in rows)
        typer.echo(text, nl=False)
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"job {the_job.id}: {len(rows)} attempts", caption="result: the attempt compare counts")
    for column in EPISODE_COLUMNS:
        table.add_column(column, justify="right" if column in ("seed", "attempt") else "left")
    for row in rows:
        table.add_row(*(_cell(row[c]) for c in EPISODE_COLUMNS))
    Console(highlight=False).print(table)


def _cell(value: object) -> str:
    return ("yes" if value else "") if isinstance(value, bool) else str(value)


def _fmt_stats(stats: dict | None) -> str:
    return "-" if not stats else f"{stats['min']:.0f}/{stats['mean']:.0f}/{stats['max']:.0f}"


TURN_COLUMNS = (
    *("turn", "action", "appended", "generated", "logical", "physical before", "physical after"),
    *("events", "KV held", "KV held peak", "KV alloc peak", "prefill s", "decode s", "env s"),
)


def inspect(
    episode: str = typer.Argument(..., help="episode id (prefix)"),
    full: bool = typer.Option(False, "--full", help="print every turn's thought, action and observation"),
    as_json: bool = typer.Option(False, "--json", help="the episode and its turns as JSON"),
    db: str = DB_OPTION,
) -> None:
    """An episode's trajectory and per-turn cache telemetry (KV held after the turn, KV held / alloc peak during
    it: see nexus.memory). With --full, each turn's thought, action and observation, and the model's raw
    completion where the action is not its parse (a format error, or an action an operator replaced)."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from db import store as db_store

    database = open_db(db)
    try:
        with database.session() as s:
            row = db_store.get_episode(s, episode)
            info = {c.name: getattr(row, c.name) for c in row.__table__.columns}
            turn_rows = [{c.name: getattr(t, c.name) for c in t.__table__.columns} for t in row.turns]
    except LookupError as exc:
        fail(str(exc))
    if as_json:
        from grading.hostlog import unpack

        info["test_log"] = unpack(info.get("test_log")) or None
        typer.echo(json.dumps({"episode": info, "turns": turn_rows}, default=str))
        return
    from db.models import is_interactive
    from results.cost import human_bytes
    from results.turn_data import TurnExtra

    console = Console(highlight=False)
    driver = (
        f" [yellow]({info['driver']}: not counted as the result)[/yellow]" if is_interactive(info["driver"]) else ""
    )
    console.print(
        f"[bold]episode {info['id']}[/bold] job {info['job_id']} attempt {info['attempt']}{driver}: "
        + escape(f"{info['task_id']} {info['method']}/{info['scope']}/{info['protocol']} seed {info['seed']}")
    )
    console.print(
        f"status [bold]{info['status']}[/bold] (agent exit {info['exit_status']}), {info['n_turns']} turns,"
        f" generated {info['generated_tokens']} tokens, KV held peak {human_bytes(info['kv_peak_held_bytes'])},"
        f" KV alloc peak {human_bytes(info['kv_peak_allocated_bytes'])}"
    )
    if info["error"]:
        console.print(f"[yellow]{escape(info['error'].splitlines()[0])}[/yellow]")
    if info.get("grader"):
        grade = (info.get("result") or {}).get("grade") or {}
        offline = (
            " [yellow](the task needs the network; graded without it)[/yellow]" if grade.get("needs_network") else ""
        )
        console.print(escape(f"graded by {info['grader']} ({info['grader_version']})") + offline)
    table = Table(title="turns", caption="* an operator replaced the action")
    for col in TURN_COLUMNS:
        table.add_column(col, justify="left" if col == "action" else "right")
    for t in turn_rows:
        action = (t["action"] or {}).get("name", "(no call)")
        if TurnExtra.read(t["extra"]).intervened:
            action += " *"
        table.add_row(
            *(str(t["index"]), escape(action), str(t["tokens_appended"]), str(t["tokens_generated"])),
            *(str(t["logical_length"]), _fmt_stats(t["physical_before"]), _fmt_stats(t["physical_after"])),
            str(t["eviction_events"]),
            *(human_bytes(t[name]) for name in ("kv_held_bytes", "kv_peak_held_bytes", "kv_peak_allocated_bytes")),
            *(f"{t['prefill_s']:.2f}", f"{t['decode_s']:.2f}", f"{t['env_s']:.2f}"),
        )
    console.print(table)
    if full:
        for t in turn_rows:
            _print_turn(console, t)


def _print_turn(console, t: dict) -> None:
    """One turn's texts: each label in bold (markup), each stored text verbatim (no markup, no highlighting)."""
    from results.turn_data import TurnExtra

    extra = TurnExtra.read(t["extra"])
    console.rule(f"turn {t['index']}")
    sections = [("thought", t["thought"] or ""), ("action", json.dumps(t["action"], ensure_ascii=False))]
    if t["action"] is None or extra.format_error or extra.intervened:
        why = "replaced by the operator" if extra.intervened else "no valid function call"
        sections.append((f"raw completion ({why})", t["completion"] or ""))
    sections.append(("observation", (t["observation"] or "")[:4000]))
    for label, text in sections:
        console.print(f"[bold]{label}[/bold]")
        console.print(text, markup=False)


def register(app: typer.Typer) -> None:
    for verb in (episodes, inspect):
        app.command(verb.__name__)(verb)
