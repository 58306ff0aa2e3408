"""``nexus-eval rerun``: new attempts (new rows, never overwrites) for chosen statuses, or one episode live."""

from __future__ import annotations

import typer

from nexus_eval.commands._common import DB_OPTION, celery_app, csv_list, fail, read_db, service_settings


def rerun(
    target: str = typer.Argument(..., help="a job id (with --status/--failed) or an episode id (--interactive)"),
    statuses: str = typer.Option(
        None, "--status", help="comma-separated statuses to rerun, e.g. infra_failure,timeout"
    ),
    failed: bool = typer.Option(
        False,
        "--failed",
        help="rerun the runs that broke (timeout, infra_failure): each new attempt replaces its broken run. "
        "A verdict is not rerun: a second try at an unresolved task is a resample (--status), never Pass@1",
    ),
    interactive: bool = typer.Option(False, "--interactive", "-i", help="run one episode live in this terminal"),
    from_turn: int = typer.Option(0, "--from-turn", min=0, help="force the stored turns before K, then go live"),
    db: str = DB_OPTION,
) -> None:
    """Rerun a job's episodes with the chosen statuses (enqueued), or one episode interactively."""
    database = read_db(db)
    if interactive:
        _interactive(database, target, from_turn, service_settings(db).openai_allowed)
        return
    if from_turn:
        fail("--from-turn needs --interactive")
    if failed == bool(statuses):
        fail("give exactly one of --status a,b or --failed")
    from db.models import RUN_FAILURE_STATUSES, SERVICE_FAILURE_STATUSES
    from jobs.control import NotEnqueued, rerun

    wanted = sorted(RUN_FAILURE_STATUSES) if failed else csv_list(statuses)
    try:
        new_ids = rerun(database, target, wanted, app=celery_app(db))
    except (LookupError, ValueError) as exc:
        fail(str(exc))
    except NotEnqueued as exc:
        fail(str(exc), 1)
    typer.echo(f"{len(new_ids)} new attempts enqueued ({', '.join(wanted)})")
    resampled = sorted(set(wanted) - SERVICE_FAILURE_STATUSES)
    if new_ids and resampled:
        typer.echo(
            f"note: the attempts of {', '.join(resampled)} episodes are resamples (new samples of keys that already "
            "have one): compare keeps them apart and shows them as best of n, never as Pass@1 (docs/numbers.md)"
        )


def _interactive(database, episode: str, from_turn: int, allowed) -> None:
    from rich.console import Console

    from agent_runner.backends.forced_prefix import ForcedPrefix
    from agent_runner.environment import DockerEnvironment
    from db import store as db_store
    from workers.execution import EpisodeHooks, WorkerContext, execute_episode
    from workers.grade_stored import grade_stored_episode
    from workers.interactive import Operator, start_rerun

    console = Console(highlight=False)
    try:
        with database.session() as s:
            start = start_rerun(s, episode, from_turn)
    except (LookupError, ValueError) as exc:
        fail(str(exc))
    new_id, attempt, recorded, edits = start.new_id, start.attempt, start.recorded, start.edits
    console.print(f"episode {episode} -> new attempt {attempt} ({new_id}); forcing {from_turn} stored turns")
    if start.unrepeated_shells:
        console.print(
            f"note: the source's operator opened a shell at turn(s) {', '.join(map(str, start.unrepeated_shells))}; "
            "a shell session is not repeated, so this container lacks whatever it changed, and this attempt is "
            "steered (its forced turns were written against it)",
            style="yellow",
            markup=False,
        )
    operator = Operator(forced_turns=from_turn, forced_actions=edits, console=console)
    prefixes: list[ForcedPrefix] = []

    def force_prefix(model):
        prefixes.append(ForcedPrefix(recorded, model))
        return prefixes[-1]

    hooks = EpisodeHooks(
        wrap_model=force_prefix if from_turn else None,
        on_turn=operator.show,
        intervene=operator.intervene,
        open_environment=operator.open_environment(DockerEnvironment.open),
    )
    outcome = execute_episode(database, new_id, worker=WorkerContext(allowed=allowed), hooks=hooks)
    if not outcome.ran:
        fail(f"could not run {new_id}: {outcome.reason}", 1)
    for note in (line for prefix in prefixes for line in prefix.notes):
        console.print(f"forced prefix: {note}", style="yellow", markup=False)
    verdict = grade_stored_episode(database, new_id) if outcome.needs_grade else outcome.status
    with database.session() as s:
        driver = db_store.get_episode(s, new_id).driver
    console.print(
        f"attempt {attempt} ({new_id}) finished: agent {outcome.status}, final [bold]{verdict}[/bold]; "
        f"recorded as {driver} (kept apart from the job's results; compare --include-interactive counts it)",
        markup=True,
    )
    typer.echo(f"RESULT {new_id} {verdict}")


def register(app: typer.Typer) -> None:
    app.command("rerun")(rerun)
