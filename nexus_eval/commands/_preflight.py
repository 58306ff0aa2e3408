"""What `run`, `submit`, `episode` and `setup` share around readiness: refusing a job that cannot run here
(exit 2, every reason with its fix, nothing stored), building missing images with a progress bar, and
summing up why episodes failed at the end of a run.

The checks themselves live in :mod:`nexus_eval.readiness`; this module only prints and builds.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from nexus_eval.commands._common import fail

if TYPE_CHECKING:
    from rich.console import Console

    from db import Database
    from env.tasks.loading import Task
    from nexus_eval.readiness import Preflight


def refuse_unless_ready(pre: Preflight, what: str) -> None:
    """Exit 2 listing each failed required check with its fix, ending with ``what`` ("nothing was stored")."""
    from rich.markup import escape

    if not pre.failures:
        return
    lines = ["this machine is not ready for the job:"]
    lines += [f"  {check.name}: {check.detail}" for check in pre.failures]
    fixes = list(dict.fromkeys(check.fix for check in pre.failures if check.fix))  # one line per distinct fix
    lines += [f"fix: {fix}" for fix in fixes]
    lines.append(what)
    fail(escape("\n".join(lines)), 2)


def build_images(tasks: list[Task], *, base: bool, console: Console) -> list[str]:
    """Build the base image (when ``base``) and then ``tasks``' images, one progress step per image;
    returns the tags built. Raises env.tasks.images.ImageError (the caller decides the exit code)."""
    from rich.markup import escape
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from env.tasks.images import BASE_IMAGE_TAG, build_base_image, docker_client, ensure_task_image

    client = docker_client()
    built = []
    if base:
        with console.status(f"building {BASE_IMAGE_TAG} (debootstrap, about a minute)") as status:
            say = lambda msg: (status.update(msg), console.print(escape(msg), soft_wrap=True, highlight=False))  # noqa: E731
            build_base_image(BASE_IMAGE_TAG, client=client, progress=say)
        built.append(BASE_IMAGE_TAG)
    if not tasks:
        return built
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console) as progress:
        bar = progress.add_task("task images", total=len(tasks))
        for task in tasks:
            progress.update(bar, description=f"building the image of {task.instance_id}")
            tag = ensure_task_image(task, client)
            progress.console.print(f"built {escape(tag)}", soft_wrap=True, highlight=False)
            built.append(tag)
            progress.advance(bar)
        progress.update(bar, description=f"{len(tasks)} task image(s) built")
    return built


def build_or_fail(pre: Preflight, console: Console, what: str = "nothing was stored") -> None:
    """Build what the preflight found missing but buildable; exit 1 naming the image when a build fails."""
    from rich.markup import escape

    from env.tasks.images import ImageError

    if not (pre.build_base or pre.build_tasks):
        return
    try:
        build_images(pre.build_tasks, base=pre.build_base, console=console)
    except ImageError as exc:
        fail(escape(f"building the images this job needs failed: {exc}\n{what}"), 1)


def first_line(error: str | None) -> str:
    """An episode error normalised to one line: its first (``Type: message``), or "(no error recorded)"."""
    lines = [line.strip() for line in (error or "").splitlines() if line.strip()]
    return lines[0] if lines else "(no error recorded)"


def failure_reasons(database: Database, job_id: str) -> list[tuple[int, str]]:
    """(count, "status: reason") for the job's latest attempts that ended as infra_failure / timeout,
    most frequent first (ties: the reason of the first key first): the answer to "why is the compare table full of
    `!`". Read as one GROUP BY per distinct (status, error) (``db.progress.failure_groups``), not row by row."""
    from db import progress as db_progress
    from db.models import RUN_FAILURE_STATUSES

    counts: Counter[str] = Counter()
    with database.session() as s:
        for status, error, n in db_progress.failure_groups(s, job_id, RUN_FAILURE_STATUSES):
            counts[f"{status}: {first_line(error)}"] += n
    return [(n, reason) for reason, n in counts.most_common()]


def print_failure_reasons(database: Database, job_id: str, console: Console) -> None:
    from rich.markup import escape

    reasons = failure_reasons(database, job_id)
    if not reasons:
        return
    console.print(f"[yellow]{sum(n for n, _ in reasons)} episode(s) did not run to a verdict:[/yellow]")
    for n, reason in reasons:
        console.print(f"  {n} x {escape(reason)}", soft_wrap=True, highlight=False)
    console.print(f"  details: nexus-eval status {job_id}; nexus-eval inspect EPISODE; nexus-eval doctor")
