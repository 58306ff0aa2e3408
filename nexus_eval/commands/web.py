"""``nexus-eval serve`` (the dashboard over the results database) and ``nexus-eval report`` (one HTML file).

Both read the database read-only (``dashboard.readonly``). ``serve`` on a loopback address shows pages to
anyone on this machine and takes the token only for the write actions; on any other address every request
needs the token, so it refuses to start without one. The token (16+ characters) comes from ``--token-file``,
``--token`` (visible in ``ps``: a warning says so) or ``$NEXUS_EVAL_TOKEN``. Requests must name the server in
``Host``: a loopback name, ``--host``, or an ``--allowed-host`` (required with ``--host 0.0.0.0`` / ``::``).
Rules and pages: docs/dashboard.md.
"""

from __future__ import annotations

import os
from pathlib import Path

import typer

from nexus_eval.commands._common import DB_OPTION, db_url, fail

TOKEN_ENV = "NEXUS_EVAL_TOKEN"


def serve(
    db: str = DB_OPTION,
    host: str = typer.Option("127.0.0.1", "--host", help="address to listen on; beyond loopback needs a token"),
    port: int = typer.Option(8800, "--port", min=1, max=65535),
    token: str = typer.Option(
        None,
        "--token",
        help="the token for write actions (and for every request off loopback); visible to other users in `ps`: "
        f"prefer ${TOKEN_ENV} or --token-file",
    ),
    token_file: Path = typer.Option(
        None, "--token-file", help="read the token from the first line of this file (instead of --token)"
    ),
    allowed_host: list[str] = typer.Option(
        None,
        "--allowed-host",
        help="a host name (or address) browsers reach this server by, besides --host and the loopback names "
        "(a proxy's public name; repeatable; one beyond loopback makes every request need the token); needed "
        "with --host 0.0.0.0 / ::",
    ),
) -> None:
    """Serve the results dashboard: jobs, live progress, compare tables and charts, trajectories, cache telemetry."""
    from dashboard.auth import MIN_TOKEN_LENGTH, allowed_hosts_for, host_name, is_loopback, is_wildcard

    if token is not None and token_file is not None:
        fail("give the token once: --token or --token-file, not both")
    source = "--token"
    if token_file is not None:
        token, source = _read_token_file(token_file), f"--token-file {token_file}"
    elif token:
        typer.echo(
            f"warning: --token is visible to other users of this machine (`ps`); set ${TOKEN_ENV} or use "
            "--token-file PATH instead",
            err=True,
        )
    if not token:
        token, source = os.environ.get(TOKEN_ENV) or None, f"${TOKEN_ENV}"
    if token is not None and len(token) < MIN_TOKEN_LENGTH:
        fail(
            f"the token ({source}) has {len(token)} characters; it needs at least {MIN_TOKEN_LENGTH}, "
            'e.g. "$(openssl rand -hex 16)"'
        )
    # a non-loopback --allowed-host (a proxy's public name) means requests come from elsewhere: a public server
    remote = [name for name in allowed_host or () if not is_loopback(host_name(name))]
    public = not is_loopback(host) or bool(remote)
    if public and not token:
        reached = f"--host {host}" if not is_loopback(host) else f"--allowed-host {remote[0]}"
        fail(
            f"{reached} is reachable from other machines: give --token-file PATH (or set ${TOKEN_ENV}); "
            "every request will need the token. Or listen on 127.0.0.1 only."
        )
    if is_wildcard(host) and not allowed_host:
        fail(
            f"--host {host} listens on every address of this machine: name each host name or address browsers "
            "will reach it by with --allowed-host NAME (repeatable, e.g. --allowed-host 192.168.1.5 "
            "--allowed-host dash.example); requests naming any other host are refused (DNS rebinding)"
        )
    try:
        hosts = allowed_hosts_for(host, allowed_host or ())
    except ValueError as exc:
        fail(f"--allowed-host: {exc}")
    import uvicorn

    from dashboard.app import create_app
    from dashboard.readonly import DatabaseUnavailable
    from db.urls import masked

    url = db_url(db)
    try:
        app = create_app(url, token=token, public=public, allowed_hosts=hosts)
    except DatabaseUnavailable as exc:
        fail(str(exc))
    shown = f"[{host}]" if ":" in host else host
    typer.echo(f"nexus-eval dashboard on http://{shown}:{port}/ (results: {masked(url)})")
    if token:
        typer.echo(f"open http://{shown}:{port}/jobs?token=<your token> once to sign this browser in")
    else:
        typer.echo(f"read-only: cancel / rerun need a token (${TOKEN_ENV} or --token-file)")
    typer.echo(f"answers to the host names {', '.join(sorted(hosts))} (any port); --allowed-host adds one")
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


def _read_token_file(path: Path) -> str:
    """The first line of ``path``, stripped; exit 2 when it cannot be read or that line is empty."""
    try:
        with path.open(encoding="utf-8") as f:
            first = f.readline().strip()
    except (OSError, UnicodeDecodeError) as exc:
        fail(f"cannot read --token-file {path}: {getattr(exc, 'strerror', None) or exc}")
    if not first:
        fail(f"--token-file {path} is empty: its first line must be the token")
    return first


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)
    app.command("report")(report)
