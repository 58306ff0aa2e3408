"""``nexus-eval serve`` (the dashboard over the results database) and ``nexus-eval report`` (one HTML file).

Both read the database read-only (``dashboard.readonly``). ``serve`` on a loopback address shows pages to
anyone on this machine and takes the token only for the write actions; on any other address every request
needs the token, so it refuses to start without one. Rules and pages: docs/dashboard.md.
"""

from __future__ import annotations

import os
from pathlib import Path

import typer

from nexus_eval.commands._common import DB_OPTION, db_url, fail

TOKEN_ENV = "NEXUS_EVAL_TOKEN"


def serve(
    db: str = DB_OPTION,
    host: str = typer.Option("127.0.0.1", "--host", help="address to listen on; beyond loopback needs --token"),
    port: int = typer.Option(8800, "--port", min=1, max=65535),
    token: str = typer.Option(
        None, "--token", help=f"the token for write actions (and for every request off loopback); default ${TOKEN_ENV}"
    ),
) -> None:
    """Serve the results dashboard: jobs, live progress, compare tables and charts, trajectories, cache telemetry."""
    from dashboard.auth import is_loopback

    token = token or os.environ.get(TOKEN_ENV) or None
    public = not is_loopback(host)
    if public and not token:
        fail(
            f"--host {host} is reachable from other machines: give --token T (or set ${TOKEN_ENV}); "
            "every request will need it. Or listen on 127.0.0.1 only."
        )
    import uvicorn

    from dashboard.app import create_app
    from dashboard.readonly import DatabaseUnavailable

    url = db_url(db)
    try:
        app = create_app(url, token=token, public=public)
    except DatabaseUnavailable as exc:
        fail(str(exc))
    shown = f"[{host}]" if ":" in host else host
    typer.echo(f"nexus-eval dashboard on http://{shown}:{port}/ (results: {_hidden(url)})")
    if token:
        typer.echo(f"open http://{shown}:{port}/jobs?token=<your token> once to sign this browser in")
    else:
        typer.echo(f"read-only: cancel / rerun need a token (--token or ${TOKEN_ENV})")
    uvicorn.run(app, host=host, port=port, log_level="warning")


def report(
    jobs: list[str] = typer.Argument(..., help="one or more job ids (a sweep), or one probe run id (prefixes)"),
    output: Path = typer.Option(Path("report.html"), "--output", "-o", help="the HTML file to write"),
    include_interactive: bool = typer.Option(
        False, "--include-interactive", help="count interactive attempts (steered or not) as results, marked *"
    ),
    db: str = DB_OPTION,
) -> None:
    """Write one job's (or a sweep of jobs') compare table, quality-against-cost charts, settings and versions (or
    one probe run's tables and charts) as a single self-contained HTML file."""
    from dashboard.readonly import DatabaseUnavailable
    from dashboard.report import write_report

    if not output.parent.is_dir():  # before reading anything: a typo in -o is found at once
        fail(f"cannot write {output}: the folder {output.parent} does not exist")
    try:
        written = write_report(db_url(db), jobs, output, include_interactive=include_interactive)
    except (DatabaseUnavailable, LookupError) as exc:
        fail(str(exc))
    except OSError as exc:
        fail(f"cannot write {output}: {exc.strerror or exc}", 1)
    typer.echo(f"wrote {written}")


def _hidden(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)
    app.command("report")(report)
