"""The `nexus-eval` CLI root. Each area registers its verbs from `nexus_eval.commands.<area>`.

Heavy imports (torch, docker, celery) happen inside the commands, so `nexus-eval --help` stays fast.
"""

from __future__ import annotations

import typer

from nexus_eval.commands import (
    agent_case,
    demo,
    episode,
    images,
    probe,
    replay,
    service,
    service_episodes,
    service_rerun,
    service_results,
    setup,
    tasks,
    tasks_convert,
    web,
)

app = typer.Typer(
    name="nexus-eval",
    help="Measure how KV-cache eviction changes what a coding agent can do.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)


def _version_text() -> str:
    from importlib.metadata import version as _v

    return _v("nexus-eval")


@app.command()
def version() -> None:
    """Print the installed nexus-eval version."""
    typer.echo(_version_text())


def _print_version(value: bool) -> None:
    if value:
        typer.echo(_version_text())
        raise typer.Exit()


@app.callback()
def _root(
    show_version: bool = typer.Option(
        False, "--version", is_eager=True, callback=_print_version, help="Print the installed version and exit."
    ),
) -> None:
    pass


_AREAS = (
    demo,
    setup,
    images,
    tasks,
    tasks_convert,
    episode,
    service,
    service_results,
    service_episodes,
    service_rerun,
    replay,
    agent_case,
    probe,
    web,
)
for _area in _AREAS:
    _area.register(app)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
