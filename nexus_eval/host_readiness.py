"""The readiness checks of this machine: the Python packages a job imports, the Docker daemon, the base and task
images, the real CPU model, the GPU and flash-attn.

Every check returns a `Check` (`nexus_eval.readiness_check`) and never raises; heavy imports stay inside the
functions, so `doctor` can report a broken install instead of dying of it.
"""

from __future__ import annotations

import importlib
import shutil
from typing import TYPE_CHECKING, Any

from nexus_eval.readiness_check import SETUP, Check, few

if TYPE_CHECKING:
    from env.tasks.loading import Task

# (distribution, module): the dependencies a job imports on its way through the worker
PACKAGES = [
    ("torch", "torch"),
    ("transformers", "transformers"),
    ("celery", "celery"),
    ("sqlalchemy", "sqlalchemy"),
    ("alembic", "alembic"),
    ("docker", "docker"),
    ("swebench", "swebench"),
    ("redis", "redis"),
    ("psycopg", "psycopg"),
    ("datasets", "datasets"),
]


def package_checks() -> list[Check]:
    """Each dependency imported for real (a broken install fails here, not in the worker), with its version."""
    from importlib.metadata import PackageNotFoundError, version

    checks = []
    for dist, module in PACKAGES:
        try:
            importlib.import_module(module)
            checks.append(Check(f"python: {dist}", True, True, version(dist)))
        except (ImportError, PackageNotFoundError, OSError) as exc:
            detail = f"{type(exc).__name__}: {exc}".splitlines()[0]
            checks.append(Check(f"python: {dist}", False, True, detail, "pip install -e ."))
    return checks


def daemon_check() -> Check:
    from env.sandbox.docker_daemon import daemon_state

    state = daemon_state()
    if state.answering:
        return Check("docker daemon", True, True, f"Docker {state.version} at {state.host}")
    return Check("docker daemon", False, True, f"no daemon answers at {state.host}: {state.reason}", SETUP)


def lookup_client() -> Any:
    """The daemon's docker-py client for image lookups (None when no daemon answers: the daemon check says why)."""
    from env.tasks.images import ImageError, docker_client

    try:
        return docker_client()
    except ImageError:
        return None


def base_image_check(client: Any, tag: str | None = None) -> Check:
    """Present, or buildable here (debootstrap on PATH), or neither."""
    from env.tasks.images import BASE_IMAGE_TAG, image_exists

    tag = tag or BASE_IMAGE_TAG
    name = "base image"
    if client is None:
        return Check(name, False, True, f"{tag}: unknown until a Docker daemon answers", SETUP)
    if image_exists(client, tag):
        return Check(name, True, True, f"{tag} ({client.images.get(tag).short_id.removeprefix('sha256:')})")
    if shutil.which("debootstrap"):
        return Check(name, True, True, f"{tag} not built yet; debootstrap is installed (about a minute)", SETUP, True)
    return Check(name, False, True, f"{tag} is missing and debootstrap (which builds it) is not on PATH", SETUP)


def task_images_check(tasks: list[Task], client: Any, base: Check) -> tuple[Check, list[Task]]:
    """One row for the tasks' images, and the local tasks whose image must be built first. A local task's
    image is built from the base image; a SWE-bench / R2E image must already be here (never pulled)."""
    from env.tasks.images import task_images

    name = f"task images ({len(tasks)})"
    if client is None:
        return Check(name, False, True, "unknown until a Docker daemon answers", SETUP), []
    states = task_images(tasks, client)
    by_id = {t.instance_id: t for t in tasks}
    build = [by_id[s.task_id] for s in states if s.buildable and not s.present]
    absent = [s for s in states if not s.buildable and not s.present]
    present = sum(s.present for s in states)
    parts = [f"{present}/{len(states)} present"]
    if build:
        parts.append(f"{len(build)} to build from the base image ({few([t.instance_id for t in build])})")
    if absent:
        names = few([s.image or f"{s.task_id} (no docker_image)" for s in absent])
        parts.append(f"{len(absent)} registry image(s) missing, never pulled here: {names}")
        fix = (
            "where it can be pulled: `docker pull IMAGE && docker save IMAGE | gzip > i.tgz`; here: "
            "`docker load < i.tgz`"
        )
        return Check(name, False, True, "; ".join(parts), fix), build
    if build and not base.ok:
        return Check(name, False, True, "; ".join(parts) + "; the base image cannot be built", base.fix), build
    return Check(name, True, True, "; ".join(parts), SETUP if build else "", bool(build)), build


def gpu_check() -> Check:
    try:
        import torch

        if torch.cuda.is_available():
            names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
            return Check("gpu", True, False, f"{len(names)} CUDA device(s): {few(names)}")
        detail = f"torch {torch.__version__} sees no CUDA device (the tiny model runs on CPU)"
    except Exception as exc:  # a broken torch is reported by the package rows
        detail = f"{type(exc).__name__}: {exc}".splitlines()[0]
    return Check("gpu", False, False, detail, "only for real models: a machine with an NVIDIA GPU and a CUDA torch")


def model_check() -> Check:
    """The real CPU model preset (informational: the quick job runs the tiny model, which needs no download)."""
    from agent_runner.config import SMOLLM2
    from agent_runner.real_models import is_ready, preset_path

    path = preset_path(SMOLLM2)
    if is_ready(SMOLLM2):
        return Check(f"model: {SMOLLM2}", True, False, f"ready at {path}")
    detail = f"not set up ({path} has no converted copy); only jobs with model.name={SMOLLM2} need it"
    return Check(f"model: {SMOLLM2}", False, False, detail, SETUP)


def flash_attn_check() -> Check:
    from importlib.metadata import PackageNotFoundError, version

    try:
        importlib.import_module("flash_attn")
        return Check("flash-attn", True, False, version("flash-attn"))
    except (ImportError, PackageNotFoundError, OSError) as exc:
        detail = f"not importable ({type(exc).__name__}); sdpa attention is used instead"
        return Check("flash-attn", False, False, detail, 'pip install -e ".[gpu]"  (needs CUDA to build)')
