"""What a job needs before it runs, as typed checks: one list for `nexus-eval doctor`, and the subset a verb
needs for the preflight of `run`, `submit` and `episode`.

Why a preflight at all: an episode that cannot reach Docker fails inside the worker as ``infra_failure``,
so a job on a machine without a daemon used to "finish" in seconds with a table of ``!`` cells and the
reason only in the database. Checking first costs a ping and a few image lookups, and a refused job stores
and enqueues nothing.

Every check returns a :class:`Check` and never raises; heavy imports stay inside the functions.

The checks themselves are in `nexus_eval.host_readiness` (this machine: packages, Docker, images, model, GPU)
and `nexus_eval.service_readiness` (broker, database, workers); each row is a `nexus_eval.readiness_check.Check`.
The lists here call the checks by their names in this module, so a test can stub one row.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from nexus_eval.host_readiness import (
    base_image_check,
    daemon_check,
    flash_attn_check,
    gpu_check,
    lookup_client,
    model_check,
    package_checks,
    task_images_check,
)
from nexus_eval.readiness_check import Check
from nexus_eval.service_readiness import (
    broker_check,
    database_and_reader,
    database_check,
    settings_broker_check,
    workers_after_database,
)

if TYPE_CHECKING:
    from env.tasks.loading import Task


@dataclass
class Preflight:
    """The checks one verb needs, and the images a run builds before starting (base, then local tasks)."""

    checks: list[Check]
    build_base: bool = False
    build_tasks: list[Task] = field(default_factory=list)

    @property
    def failures(self) -> list[Check]:
        return [c for c in self.checks if c.required and not c.ok]


def container_checks(tasks: list[Task]) -> Preflight:
    """Daemon, base image (when a task is local) and the tasks' images."""
    daemon = daemon_check()
    client = lookup_client() if daemon.ok else None
    checks = [daemon]
    base = Check("base image", True, True, "not needed (no local task)")
    if any(t.kind == "local" for t in tasks):
        base = base_image_check(client)
        checks.append(base)
    images, build = task_images_check(tasks, client, base)
    checks.append(images)
    return Preflight(checks, build_base=base.build, build_tasks=build)


def preflight(
    tasks: list[Task] | None, *, db_url: str | None = None, broker: str | None = None, check_broker: bool = False
) -> Preflight:
    """The preflight of a verb: containers for ``tasks`` (None: not run here), the database at ``db_url``
    (None: not used), and the broker when ``check_broker``."""
    result = container_checks(tasks) if tasks is not None else Preflight([])
    if check_broker:
        result.checks.append(broker_check(broker))
    if db_url is not None:
        result.checks.append(database_check(db_url))
    return result


def doctor_checks(db_url: str, suite: str) -> list[Check]:
    """Everything `nexus-eval doctor` shows: packages, the containers of ``suite``, broker, database, the workers
    that reported to it, the real CPU model, GPU."""
    from env.tasks.loading import load_suite

    checks = package_checks()
    checks += container_checks(load_suite(suite)).checks
    checks.append(settings_broker_check(db_url))
    database, readable = database_and_reader(db_url)
    checks += [database, workers_after_database(database, readable, within_s=None, now=None)]
    return [*checks, model_check(), gpu_check(), flash_attn_check()]
