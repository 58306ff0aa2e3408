"""What the service verbs share: the ``--db`` option, opening the database, the Celery app, and errors.

Heavy imports (SQLAlchemy, Celery) happen inside the functions, so ``nexus-eval --help`` stays fast.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NoReturn

import typer

if TYPE_CHECKING:
    from celery import Celery

    from db import Database

DB_OPTION = typer.Option(None, "--db", help="results database URL or SQLite path (default $NEXUS_EVAL_DB)")
#: how many measuring processes (``measure.processes``) a replay or probe run uses; ``--workers`` is its older
#: spelling, still accepted so existing scripts keep working (a "worker" is otherwise a Celery worker)
PROCESSES = typer.Option(
    0,
    "--processes",
    "--workers",
    min=0,
    help="measuring processes, each loading the model with --threads torch threads (0: one per CPU core, at most "
    "4; 1 on a GPU; --workers is an older spelling)",
)


def fail(message: str, code: int = 2) -> NoReturn:
    """Print ``error: message`` on stderr and exit with ``code`` (2: bad input, 1: the work failed)."""
    from rich.console import Console
    from rich.markup import escape

    # the message quotes user data (ids, paths, file text): '[/x]' in it is text, not rich markup
    Console(stderr=True).print(f"[red]error:[/red] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def csv_list(text: str) -> list[str]:
    """``"a, b,,c"`` -> ``["a", "b", "c"]``."""
    return [part.strip() for part in text.split(",") if part.strip()]


def db_url(db: str | None) -> str:
    """``--db`` as a URL: a URL as given, a path as a SQLite URL, nothing as ``$NEXUS_EVAL_DB`` or the default."""
    from db.connection import default_url, sqlite_url

    if db is None:
        return default_url()
    return db if "://" in db else sqlite_url(db)


def open_db(db: str | None = None) -> Database:
    """The results database (``--db``, else ``$NEXUS_EVAL_DB``, else ./runs/nexus-eval.db), created when it is not
    there yet and migrated: for the verbs that store new work (submit, run, worker, probe run). Exit 2 with one line
    when it does not answer (:func:`read_db`'s words)."""
    from db import connect
    from db.availability import DatabaseUnavailable, check_reachable

    url = db_url(db)
    try:
        check_reachable(url)  # a down database is one line, not the traceback of the migration that met it
    except DatabaseUnavailable as exc:
        fail(str(exc))
    return connect(url)


def read_db(db: str | None = None) -> Database:
    """The results database for a verb that reads what is stored (status, compare, episodes, cancel, ...): it must
    exist at this version's schema. Never creates a file, a folder or a table and never migrates; exit 2 with one
    message naming the database (password masked) and what to do when it is missing, down or at another schema."""
    from db.availability import DatabaseUnavailable, open_existing

    try:
        return open_existing(db_url(db))
    except DatabaseUnavailable as exc:
        fail(str(exc))


def service_settings(db: str | None = None, *, embedded: bool = False, **worker: Any):
    """The service's one settings object (``jobs.settings.ServiceSettings``): the environment's, with ``--db`` and
    a worker's own flags (``episodes_per_gpu``, ``device``) on top; ``embedded`` uses the SQLite broker beside
    the results database whatever ``$NEXUS_EVAL_BROKER`` says. Exit 2 naming a bad setting."""
    from jobs.settings import ServiceSettings

    overrides: dict[str, Any] = {"db_url": db_url(db), **worker}
    if embedded:
        overrides.update(broker_url=None, result_backend=None)
    try:
        return ServiceSettings.from_env(**overrides)
    except ValueError as exc:
        fail(f"service settings: {exc}")


def celery_app(db: str | None = None, *, embedded: bool = False, **worker: Any) -> Celery:
    """This process's Celery app, built from :func:`service_settings` (the same arguments)."""
    from jobs.queue import get_app

    return get_app(service_settings(db, embedded=embedded, **worker))


def job_id_of(database: Database, job: str) -> str:
    """The full id of the job ``job`` (an id or a unique prefix); exit 2 naming the problem otherwise."""
    from db import job_rows

    try:
        with database.session() as s:
            return job_rows.get_job(s, job).id
    except LookupError as exc:
        fail(str(exc))


DTYPE_OPTION = typer.Option(
    "auto",
    "--dtype",
    help="what the model measures in: float32 | bfloat16 | auto (bfloat16 on a GPU, or on a CPU whose bfloat16 "
    "units measure faster here; float32 elsewhere). Stored with every row; cells of two dtypes are never paired",
)


def choose_measuring_dtype(console, requested: str, device: str | None) -> str:  # type: ignore[no-untyped-def]
    """The measuring dtype for ``--dtype`` on ``--device`` (``measure.measuring_dtype``), said on the console with
    why; ValueError for an unknown name."""
    from measure.measuring_dtype import check_dtype, choose_dtype

    check_dtype(requested)  # before anything else runs
    cuda = None if device in (None, "auto") else device.startswith("cuda")
    choice = choose_dtype(requested, cuda=cuda)
    console.print(f"measuring in [bold]{choice.dtype}[/bold] ({choice.why})", soft_wrap=True)
    return choice.dtype
