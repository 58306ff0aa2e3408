"""``nexus-eval probe run | show | list``: quality probes of KV-cache eviction, stored with the other results.

``run`` checks everything it can before the model loads (the settings, every variant's settings by building
its cache config, the filler corpus, the output format and file): bad input is exit 2 with nothing stored.
Then the run is stored, the model loads, and each result is stored as it arrives, so a crash keeps what
finished; the run ends ``failed`` with the first cause (exit 1) or ``done``, and the table printed is read back
from the database: what is shown is what is stored. Every settings flag is an override on ``ProbeSettings``
(``measure.probes``), where the defaults live; ``--help`` shows them. docs/probes.md reads the table.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import typer
from typer.core import TyperCommand

from nexus_eval.commands._common import (
    DB_OPTION,
    DTYPE_OPTION,
    PROCESSES,
    choose_measuring_dtype,
    csv_list,
    fail,
    open_db,
    read_db,
)
from nexus_eval.commands._flag_group import flag, takes_flags
from results.table_formats import FORMAT_HELP

FORMAT = typer.Option("table", "--format", help=FORMAT_HELP)


@dataclass(frozen=True)
class SettingsFlags:
    """The flags of ``probe run`` that are ``ProbeSettings`` fields, each named as its field (``None``: not given,
    the field's default holds; ``_SettingsHelp`` adds it to the help). A list is one comma-separated text."""

    model: str | None = flag(
        typer.Option(None, help="'tiny' (random weights), 'smollm2-135m', a Hugging Face id or a path")
    )
    probes: str | None = flag(typer.Option(None, help="comma-separated: needle, later_turn, nll"))
    variants: str | None = flag(
        typer.Option(None, help="comma-separated methods, each optionally with settings: nexus(lam=0)")
    )
    scopes: str | None = flag(typer.Option(None, help="comma-separated: prefill_only, prefill_decode"))
    protocols: str | None = flag(
        typer.Option(None, help="comma-separated, later_turn only: true_eviction, full_context")
    )
    densities: str | None = flag(typer.Option(None, help="comma-separated kept fractions in (0, 1]"))
    samples: int | None = flag(typer.Option(None, help="samples per cell; sample i is the same text in every cell"))
    lengths: str | None = flag(typer.Option(None, help="comma-separated filler tokens per sample (>= 256)"))
    depths: str | None = flag(typer.Option(None, help="comma-separated depths of the fact in the filler, in (0, 1]"))
    continuation: int | None = flag(typer.Option(None, help="nll: scored continuation tokens per document"))
    preset: str | None = flag(
        typer.Option(None, help="the methods' named settings: paper | reference | kvcache_factory")
    )
    seed: int | None = flag(typer.Option(None, help="texts, facts and every method's random choices"))


class _SettingsHelp(TyperCommand):
    """``probe run --help`` names each settings flag's ``ProbeSettings`` default. They are read when the help
    is shown, not when the CLI starts: importing ``measure.probes`` loads torch, seconds on every verb."""

    def format_help(self, ctx: Any, formatter: Any) -> None:
        from measure.probes import ProbeSettings

        for param in self.params:
            info = ProbeSettings.model_fields.get(param.name or "")
            if info is not None and "(default:" not in (param.help or ""):
                default = info.default
                shown = ", ".join(map(str, default)) if isinstance(default, tuple) else default
                param.help = f"{param.help} (default: {shown})"  # type: ignore[attr-defined]
        super().format_help(ctx, formatter)


def split_variants(text: str) -> list[str]:
    """``"dense,nexus(lam=0,window=32)"`` -> ``["dense", "nexus(lam=0,window=32)"]``: commas inside a
    variant's parentheses are its own."""
    parts, depth, current = [], 0, ""
    for char in text:
        depth += (char == "(") - (char == ")")
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    return [p.strip() for p in [*parts, current] if p.strip()]


def _numbers(flag: str, text: str, kind: type) -> list[Any]:
    try:
        return [kind(part) for part in csv_list(text)]
    except ValueError:
        noun = "whole numbers" if kind is int else "numbers"
        fail(f"{flag} takes comma-separated {noun}, got {text!r}; nothing was run")


def settings_from_flags(flags: SettingsFlags) -> Any:
    """``ProbeSettings`` with each flag given set on its defaults; exit 2 naming every bad field."""
    from pydantic import ValidationError

    from measure.probes import ProbeSettings, check_probe_settings

    lists = {"probes": csv_list, "scopes": csv_list, "protocols": csv_list, "variants": split_variants}
    numbers = {"densities": float, "depths": float, "lengths": int}
    given: dict[str, Any] = {}
    for name, value in asdict(flags).items():
        if value is None:
            continue
        if name in lists:
            value = lists[name](value)
        elif name in numbers:
            value = _numbers(f"--{name}", value, numbers[name])
        given[name] = value
    try:
        settings = ProbeSettings(**given)
        check_probe_settings(settings)  # every variant's cache config, built once: a bad setting fails here
    except ValidationError as exc:
        problems = "; ".join(
            f"--{'.'.join(map(str, e['loc']))}: {e['msg'].removeprefix('Value error, ')}" for e in exc.errors()
        )
        fail(f"{problems}\nnothing was run")
    except ValueError as exc:
        fail(f"{exc}\nnothing was run")
    return settings


@takes_flags
def run(
    flags: SettingsFlags,
    threads: int = typer.Option(
        1, min=1, help="torch CPU threads per process (on a small shared CPU 1 is the fastest)"
    ),
    processes: int = PROCESSES,
    db: str = DB_OPTION,
    fmt: str = FORMAT,
    output: Path = typer.Option(None, "--output", "-o", help="write the table here instead of stdout"),
    dtype: str = DTYPE_OPTION,
) -> None:
    """Run quality probes on a model; store every result as it arrives; print the table."""
    from results.compare_render import FORMATS

    if fmt not in FORMATS:
        fail(f"unknown --format {fmt!r}; use one of {', '.join(FORMATS)}; nothing was run")
    if output is not None and not output.parent.is_dir():
        fail(f"cannot write {output}: the folder {output.parent} does not exist; nothing was run")
    settings = settings_from_flags(flags)
    _check_model(settings.model)
    from rich.console import Console

    try:  # stored in the run's settings: a probe table says what it was measured in
        settings = settings.model_copy(update={"dtype": choose_measuring_dtype(Console(stderr=True), dtype, None)})
    except ValueError as exc:
        fail(f"{exc}; nothing was run")
    from measure.processes import resolve_processes

    processes = resolve_processes(processes)
    provenance = _provenance(threads, processes)  # reads the filler corpus: exit 2 if a source is missing here
    import torch

    torch.set_num_threads(threads)  # more threads than free cores makes this small-matrix work slower, not faster
    from db.probes import create_probe_run

    database = open_db(db)
    sweep_orphans(database)
    n_planned = sum(len(settings.cells(p)) for p in settings.probes) * settings.samples
    with database.session() as s:
        run_id = create_probe_run(
            s, settings=settings.model_dump(mode="json"), provenance=provenance, n_planned=n_planned
        ).id
    _measure(database, run_id, settings, n_planned, processes=processes, threads=threads)
    show_table(database, run_id, fmt, output)


def _check_model(name: str) -> None:
    """Exit 2 for a model that cannot load here whatever happens next: a preset `nexus-eval setup` has not
    fetched yet, a local path that does not exist. (Anything else is only known by loading it.)"""
    from agent_runner.model_host import weights_source

    try:
        path, _ = weights_source(name)
    except ValueError as exc:
        fail(f"{exc}; nothing was run")
    if path.startswith(("/", ".")) and not Path(path).exists():
        fail(f"model path {name!r} does not exist; nothing was run")


def _provenance(threads: int, processes: int) -> dict[str, Any]:
    from measure.probes.stored_run import provenance

    try:
        return provenance(threads, processes)
    except ValueError as exc:
        fail(f"{exc}; nothing was run")


def _measure(database: Any, run_id: str, settings: Any, n_planned: int, *, processes: int, threads: int) -> None:
    """Run the probes (``measure.probes.stored_run``) with progress on stderr; a failed run is exit 1."""
    from rich.console import Console

    from measure.probes.stored_run import ProbeRunFailed, measure_and_store
    from nexus_eval.commands._probe_progress import progress

    console = Console(stderr=True, highlight=False)
    where = f"{processes} processes" if processes > 1 else "this process"
    console.print(f"probe run {run_id}: {n_planned} results planned; loading {settings.model} in {where}")
    try:
        with progress(console, n_planned) as advance:
            measure_and_store(
                database, run_id, settings, n_planned, processes=processes, threads=threads, advance=advance
            )
    except ProbeRunFailed as exc:
        fail(f"{exc}\n`nexus-eval probe show {run_id}` shows what finished", 1)


def sweep_orphans(database: Any) -> None:
    """Mark failed the runs of this host whose process died without saying why (``db.probes.fail_orphaned_probe_runs``),
    and say so on stderr."""
    from db.probes import fail_orphaned_probe_runs

    with database.session() as s:
        orphans = fail_orphaned_probe_runs(s)
    for run_id in orphans:
        typer.echo(
            f"probe run {run_id}: its process is gone; marked failed (`nexus-eval probe show {run_id}`)", err=True
        )


#: what ``probe show`` / ``list`` say of a run whose process is gone (they read; ``probe run`` marks it failed)
GONE = "its process is gone; the next `nexus-eval probe run` here marks it failed"


def orphans(database: Any) -> list[str]:
    """The ids of this host's open runs whose process is gone (``db.probes.orphaned_probe_runs``), read only."""
    from db.probes import orphaned_probe_runs

    with database.session() as s:
        return [r.id for r in orphaned_probe_runs(s)]


def show_table(database: Any, ident: str, fmt: str, output: Path | None = None) -> None:
    """Print (or write to ``output``) the table of probe run ``ident`` as stored; exit 2 for an unknown id."""
    from results.probe_render import render
    from results.probe_stats import load_probe_table

    try:
        with database.session() as s:
            table = load_probe_table(s, ident)
    except LookupError as exc:
        fail(str(exc))
    text = render(table, fmt)
    if output is None:
        typer.echo(text, nl=False)
        return
    try:
        output.write_text(text, encoding="utf-8")
    except OSError as exc:
        fail(f"cannot write {output}: {exc.strerror or exc}", 1)
    typer.echo(f"wrote {output}", err=True)


def show(
    run_id: str = typer.Argument(..., help="probe run id (prefix)"), fmt: str = FORMAT, db: str = DB_OPTION
) -> None:
    """A stored probe run's table: accuracy with Wilson intervals, McNemar vs dense and snapkv, ΔNLL vs dense."""
    from results.compare_render import FORMATS

    if fmt not in FORMATS:
        fail(f"unknown --format {fmt!r}; use one of {', '.join(FORMATS)}")
    database = read_db(db)
    gone = orphans(database)  # said, not written: a read never writes (`probe run` marks them failed)
    show_table(database, run_id, fmt)
    for orphan in gone:
        typer.echo(f"probe run {orphan}: {GONE}", err=True)


def list_runs(limit: int = typer.Option(20, min=1, help="how many, newest first"), db: str = DB_OPTION) -> None:
    """The newest probe runs: id, status, model, probes, variants, results stored of planned."""
    from rich.console import Console
    from rich.table import Table

    from db.probes import list_probe_runs

    table = Table(title="probe runs")
    for col in ("run", "created", "status", "model", "probes", "variants", "results"):
        table.add_column(col, overflow="fold")
    database = read_db(db)
    gone = set(orphans(database))  # said, not written: a read never writes (`probe run` marks them failed)
    with database.session() as s:
        for r in list_probe_runs(s, limit=limit):
            settings = r.settings or {}
            status = f"{r.status} ({GONE})" if r.id in gone else r.status
            table.add_row(
                r.id, f"{r.created_at:%Y-%m-%d %H:%M}", status, r.model, ",".join(settings.get("probes", [])),
                ",".join(settings.get("variants", [])), f"{r.n_results}/{r.n_planned}",
            )  # fmt: skip
    Console(width=140).print(table)


def register(app: typer.Typer) -> None:
    probe_app = typer.Typer(help="Quality probes: what a method's kept cache still answers (docs/probes.md).")
    probe_app.command("run", cls=_SettingsHelp)(run)
    probe_app.command("show")(show)
    probe_app.command("list")(list_runs)
    app.add_typer(probe_app, name="probe", no_args_is_help=True)
