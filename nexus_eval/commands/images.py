"""CLI verbs for container images and sandboxes: `images build-base`, `images reap`."""

from __future__ import annotations

import typer

images_app = typer.Typer(help="Container images and sandbox housekeeping.", no_args_is_help=True)


@images_app.command("build-base")
def build_base(
    tag: str = typer.Option(None, "--tag", help="image tag (default nexus-eval/base:bookworm-1)"),
    from_image: str = typer.Option(
        None, "--from", help="build FROM this registry image (e.g. python:3.11-slim) instead of debootstrap"
    ),
    force: bool = typer.Option(False, "--force", help="rebuild even if the tag exists"),
) -> None:
    """Build the base image offline (debootstrap + docker import); does nothing if the tag exists."""
    from rich.console import Console

    from env.tasks.images import BASE_IMAGE_TAG, ImageError, build_base_image
    from nexus_eval.commands._common import fail

    console = Console(stderr=True)
    try:
        with console.status("building the base image") as status:
            built = build_base_image(
                tag or BASE_IMAGE_TAG,
                from_image=from_image,
                force=force,
                progress=lambda msg: (status.update(msg), console.log(msg)),
            )
    except ImageError as exc:
        fail(str(exc), 1)
    typer.echo(built)


@images_app.command("reap")
def reap_cmd(
    older_than: float = typer.Option(None, "--older-than", help="seconds; default: each container's TTL"),
    job: str = typer.Option(None, "--job", help="only containers of this job label"),
) -> None:
    """Remove nexus-eval sandbox containers past their TTL (or older than --older-than), or exited."""
    from env.sandbox.reaping import reap

    removed = reap(older_than_s=older_than, label_filter={"nexus-eval.job": job} if job else None)
    typer.echo(f"removed {removed} container(s)")


def register(app: typer.Typer) -> None:
    """Attach this area's verbs to the root app."""
    app.add_typer(images_app, name="images")
