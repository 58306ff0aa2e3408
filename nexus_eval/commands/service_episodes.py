"""CLI verbs over one job's episode rows: ``episodes JOB`` lists them (the ids ``inspect`` and ``rerun`` take),
``inspect EPISODE`` shows one trajectory with its per-turn cache telemetry.

``episodes`` reads one streamed query (``db.episode_lists.attempts``: the "result" mark computed in SQL) and prints
each row as it arrives in a pipe (tsv, json), so a 12,800-episode job prints at once in bounded memory."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Iterable

import typer

from nexus_eval.commands._common import DB_OPTION, csv_list, fail, read_db
from results.table_formats import FORMAT_HELP, delimited_line, markdown_line, unknown_format

EPISODE_COLUMNS = ("episode", "task", "method", "scope", "protocol", "seed", "attempt", "driver", "result", "status")


def episodes(
    job: str = typer.Argument(..., help="job id (prefix)"),
    statuses: str = typer.Option(None, "--status", help="only these statuses (comma-separated)"),
    method: str = typer.Option(None, "--method", help="only this method"),
    results_only: bool = typer.Option(
        False, "--results", help="only each key's result attempt (its first the agent drove alone that did not break)"
    ),
    fmt: str = typer.Option(None, "--format", help=f"{FORMAT_HELP} (default: table on a terminal, tsv in a pipe)"),
    db: str = DB_OPTION,
) -> None:
    """Every attempt of a job: id, task, configuration, seed, attempt, who drove it and its status.

    `driver` is agent (the service ran it), interactive (rerun --interactive, the model's actions) or steered
    (an operator changed an action); `result` marks the attempt compare counts for its key."""
    import sys

    from db import episode_lists, job_rows

    fmt = fmt or ("table" if sys.stdout.isatty() else "tsv")
    if message := unknown_format(fmt):
        fail(message)
    wanted = set(csv_list(statuses)) if statuses else None
    database = read_db(db)
    try:
        with database.session() as s:
            the_job = job_rows.get_job(s, job)
            # one query, read in chunks and printed as it comes: a 12,800-episode job starts printing at once and
            # never holds its rows (the rich table needs them all for its widths: a terminal only)
            listed = episode_lists.attempts(s, the_job.id, statuses=wanted, method=method, results_only=results_only)
            rows = (_row(r) for r in listed)
            if fmt == "table":
                _table(the_job.id, list(rows))
            elif fmt == "json":
                _json_array(rows)
            elif fmt == "markdown":
                _markdown(rows)
            else:
                _delimited(rows, fmt)
    except LookupError as exc:
        fail(str(exc))


ATTEMPT_FIELDS = ("id", "task_id", "method", "scope", "protocol", "seed", "attempt", "driver", "result", "status")


def _row(attempt: object) -> dict:
    """One ``episode_lists.attempts`` row under the printed column names."""
    return dict(zip(EPISODE_COLUMNS, (getattr(attempt, f) for f in ATTEMPT_FIELDS), strict=True))


def _delimited(rows: Iterable[dict], fmt: str) -> None:
    """csv or tsv (``results.table_formats``), a line as each row comes."""
    typer.echo(delimited_line(EPISODE_COLUMNS, fmt))
    for row in rows:
        typer.echo(delimited_line((_cell(row[c]) for c in EPISODE_COLUMNS), fmt))


def _markdown(rows: Iterable[dict]) -> None:
    typer.echo(markdown_line(EPISODE_COLUMNS))
    typer.echo(markdown_line("---" for _ in EPISODE_COLUMNS))
    for row in rows:
        typer.echo(markdown_line(_cell(row[c]) for c in EPISODE_COLUMNS))


def _json_array(rows: Iterable[dict]) -> None:
    """The same bytes as ``json.dumps(list(rows), indent=1)`` (and a newline), written a row at a time."""
    out = "["
    for row in rows:
        typer.echo(out + "\n" + textwrap.indent(json.dumps(row, indent=1), " "), nl=False)
        out = ","
    typer.echo("[]" if out == "[" else "\n]")


def _table(job_id: str, rows: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"job {job_id}: {len(rows)} attempts", caption="result: the attempt compare counts")
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

    database = read_db(db)
    try:
        with database.session() as s:
            row = db_store.get_episode(s, episode)
            info = {c.name: getattr(row, c.name) for c in row.__table__.columns}
            turn_rows = [{c.name: getattr(t, c.name) for c in t.__table__.columns} for t in row.turns]
    except LookupError as exc:
        fail(str(exc))
    if as_json:
        from env.grading.hostlog import unpack
        from results.turn_data import USER_MESSAGE_TAIL, TurnExtra

        info["test_log"] = unpack(info.get("test_log")) or None
        for t in turn_rows:  # the user message whole, as it was sent (stored after the observation)
            if USER_MESSAGE_TAIL in (t["extra"] or {}):
                message = TurnExtra.of_row(t).user_message
                t["extra"] = {k: v for k, v in t["extra"].items() if k != USER_MESSAGE_TAIL} | {"user_message": message}
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
    extras = [TurnExtra.of_row(t) for t in turn_rows]
    marks = {mark: any(test(e) for e in extras) for mark, (_, test) in TURN_MARKS.items()}
    caption = escape("; ".join(f"{mark} {legend}" for mark, (legend, _) in TURN_MARKS.items() if marks[mark]))
    table = Table(title="turns", caption=caption or None)
    for col in TURN_COLUMNS:
        table.add_column(col, justify="left" if col == "action" else "right")
    for t, extra in zip(turn_rows, extras, strict=True):
        action = (t["action"] or {}).get("name", "(no call)")
        action += "".join(f" {mark}" for mark, (_, test) in TURN_MARKS.items() if test(extra))
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
    elif any(e.operator is not None for e in extras):
        console.rule("operator")
        for t, extra in zip(turn_rows, extras, strict=True):
            for label, text in _operator_sections(t, extra, full=False):
                console.print(f"[bold]turn {t['index']}: {escape(label)}[/bold]")
                if text:
                    console.print(text, markup=False)


#: the marks after a turn's action in ``inspect``'s table, each with its legend (printed only when a turn has it)
TURN_MARKS = {
    "*": ("an operator replaced the action", lambda e: e.replaced),
    "[skipped]": ("the operator skipped the action: nothing ran", lambda e: e.skipped),
    "[shell]": ("the operator opened a shell in the container", lambda e: bool(e.operator and e.operator.shells)),
    "[forced]": ("forced from the stored attempt (rerun --from-turn)", lambda e: e.forced),
}
#: the characters of a shell transcript ``inspect`` prints without --full
SHELL_SHOWN_CHARS = 2000


def _operator_sections(t: dict, extra, *, full: bool) -> list[tuple[str, str]]:
    """What the operator did at one turn (``agent_runner.records.OperatorAct``): (label, text) sections."""
    act = extra.operator
    if act is None:
        return []
    proposed = json.dumps(act.proposed.model_dump(mode="json"), ensure_ascii=False) if act.proposed else "(no call)"
    repeated = " (a forced turn repeating the source attempt's act)" if act.forced else ""
    sections: list[tuple[str, str]] = []
    for number, shell in enumerate(act.shells, 1):
        text = shell.transcript
        if not full and len(text) > SHELL_SHOWN_CHARS:
            text = text[:SHELL_SHOWN_CHARS] + f"\n... ({len(text) - SHELL_SHOWN_CHARS} more characters: --full)"
        cut = f", {shell.cut} characters left out of its middle when stored" if shell.cut else ""
        label = f"operator shell session {number} ({shell.seconds:.0f}s, exit {shell.exit_code}{cut}): transcript"
        sections.append((label, text))
    if act.choice == "edit":
        sections.append((f"operator edited the action{repeated}; the model proposed", proposed))
    elif act.choice == "skip":
        sections.append((f"operator skipped the action{repeated}: nothing ran; the model proposed", proposed))
    elif act.choice == "stop":
        sections.append((f"operator stopped the run (submitted){repeated}; the model proposed", proposed))
    return sections


def _print_turn(console, t: dict) -> None:
    """One turn's texts: each label in bold (markup), each stored text verbatim (no markup, no highlighting)."""
    from rich.markup import escape

    from results.turn_data import TurnExtra

    extra = TurnExtra.of_row(t)
    forced = " (forced from the stored attempt)" if extra.forced else ""
    console.rule(f"turn {t['index']}{forced}")
    sections = [("thought", t["thought"] or ""), ("action", json.dumps(t["action"], ensure_ascii=False))]
    if t["action"] is None or extra.format_error or extra.replaced:
        why = "replaced by the operator" if extra.replaced else "no valid function call"
        sections.append((f"raw completion ({why})", t["completion"] or ""))
    sections += _operator_sections(t, extra, full=True)
    observation = "observation (the operator skipped the action: nothing ran)" if extra.skipped else "observation"
    sections.append((observation, (t["observation"] or "")[:4000]))
    for label, text in sections:
        console.print(f"[bold]{escape(label)}[/bold]")
        console.print(text, markup=False)


def register(app: typer.Typer) -> None:
    for verb in (episodes, inspect):
        app.command(verb.__name__)(verb)
