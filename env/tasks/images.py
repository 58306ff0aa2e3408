"""Container images: the offline base image and the per-task images built on it.

* Base image (`BASE_IMAGE_TAG`): Debian bookworm from `debootstrap --variant=minbase` with python3 (and
  `python`), pytest, git (system identity + global ignores for caches) and patch, imported with
  `docker import`. No registry is needed. `from_image=` builds it instead from a registry image (e.g.
  `python:3.11-slim`) on machines that can pull.
* Local task image: base + `/testbed` holding the task's `repo/` as a git repository with exactly one
  commit, after the task's `setup` lines. Built with docker-py from a generated context with
  `network_mode="none"`; the tag carries a content hash of everything that goes in, so editing the task
  rebuilds it and an unchanged task is never rebuilt.
* SWE-bench / R2E tasks use their own `docker_image`, which must already be present locally.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    import docker
    from env.tasks.loading import Task

BASE_IMAGE_TAG = "nexus-eval/base:bookworm-1"
BASE_PACKAGES = ["python3", "python3-pytest", "python-is-python3", "git", "patch", "procps"]
DEBIAN_SUITE = "bookworm"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
DEBIAN_SOURCES = Path("/etc/apt/sources.list.d/debian.sources")
# Bump when the way task images are assembled changes, so old caches are not reused.
TASK_RECIPE_VERSION = "1"
# What of a task's repo/ never goes into its image (and so is not packed into a suite: env.tasks.suite_data).
CONTEXT_IGNORE = (".git", "__pycache__", "*.pyc", ".pytest_cache")

# git identity + ignores written to /etc/gitconfig, so `git commit` works and byte-code / pytest caches
# never end up in an episode's patch.
_GITCONFIG = """[user]
\tname = nexus-eval
\temail = nexus-eval@localhost
[safe]
\tdirectory = *
[init]
\tdefaultBranch = main
[core]
\texcludesFile = /etc/gitignore-nexus
[advice]
\tdetachedHead = false
"""
_GITIGNORE = "__pycache__/\n*.pyc\n.pytest_cache/\n*.egg-info/\n"
_IMPORT_CHANGES = [
    "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "ENV LANG=C.UTF-8",
    "ENV PYTHONDONTWRITEBYTECODE=1",
    "WORKDIR /",
    'CMD ["/bin/bash"]',
]

Progress = Callable[[str], None]


class ImageError(RuntimeError):
    """Base class for image problems (the message says what to run)."""


class ImageMissing(ImageError):
    """A required image is not present in the local engine."""


class ImageBuildFailed(ImageError):
    """Building an image failed; the message carries the tail of the build log."""


def docker_client() -> docker.DockerClient:
    """A docker-py client for the local engine, with a clear error when none is reachable."""
    import docker

    try:
        client = docker.from_env(timeout=300)
        client.ping()
    except Exception as exc:  # docker raises several unrelated types here
        raise ImageError(f"cannot reach the Docker daemon ({exc}); start it with `nexus-eval setup`") from exc
    return client


def image_exists(client: docker.DockerClient, tag: str) -> bool:
    import docker

    try:
        client.images.get(tag)
    except docker.errors.ImageNotFound:
        return False
    return True


def debian_mirror(sources: Path = DEBIAN_SOURCES) -> str:
    """The first `URIs:` entry of the deb822 sources file that serves `bookworm`; else deb.debian.org."""
    if not sources.exists():
        return DEFAULT_MIRROR
    for stanza in sources.read_text().split("\n\n"):
        fields = dict(line.split(":", 1) for line in stanza.splitlines() if ":" in line and not line.startswith("#"))
        suites = fields.get("Suites", "").split()
        uris = fields.get("URIs", "").split()
        if DEBIAN_SUITE in suites and uris:
            return uris[0].strip()
    return DEFAULT_MIRROR


def build_base_image(
    tag: str = BASE_IMAGE_TAG,
    *,
    from_image: str | None = None,
    force: bool = False,
    progress: Progress | None = None,
    client: docker.DockerClient | None = None,
) -> str:
    """Build the base image unless `tag` already exists (or `force`); return the tag."""
    say = progress or (lambda _msg: None)
    client = client or docker_client()
    if image_exists(client, tag) and not force:
        say(f"{tag} already present")
        return tag
    if from_image:
        _build_from_registry_image(client, tag, from_image, say)
    else:
        _build_with_debootstrap(tag, say)
    if not image_exists(client, tag):
        raise ImageBuildFailed(f"building {tag} finished but the engine does not list the tag")
    return tag


def _build_with_debootstrap(tag: str, say: Progress) -> None:
    if shutil.which("debootstrap") is None:
        raise ImageBuildFailed("debootstrap is not installed: `apt-get install -y debootstrap`")
    mirror = debian_mirror()
    with tempfile.TemporaryDirectory(prefix="nexus-base-", dir="/var/tmp") as tmp:
        rootfs = Path(tmp) / "rootfs"
        say(f"debootstrap {DEBIAN_SUITE} from {mirror} (about a minute)")
        cmd = [
            "debootstrap",
            "--variant=minbase",
            f"--include={','.join(BASE_PACKAGES)}",
            DEBIAN_SUITE,
            str(rootfs),
            mirror,
        ]
        _run_or_fail(cmd, "debootstrap")
        (rootfs / "etc/gitconfig").write_text(_GITCONFIG)
        (rootfs / "etc/gitignore-nexus").write_text(_GITIGNORE)
        (rootfs / "testbed").mkdir(exist_ok=True)
        for cache in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for item in (rootfs / cache).glob("*"):
                if item.is_file():
                    item.unlink()
        say(f"docker import -> {tag}")
        changes = [arg for change in _IMPORT_CHANGES for arg in ("--change", change)]
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        imp = subprocess.run(["docker", "import", *changes, "-", tag], stdin=tar.stdout, capture_output=True, text=True)
        tar.stdout.close()
        tar.wait()
        if tar.returncode != 0 or imp.returncode != 0:
            raise ImageBuildFailed(f"docker import of {rootfs} failed: {imp.stderr.strip()[-2000:]}")


def _build_from_registry_image(client: docker.DockerClient, tag: str, from_image: str, say: Progress) -> None:
    """For machines with registry access: FROM the image, add git + pytest + our git config."""
    dockerfile = f"""FROM {from_image}
RUN (command -v git >/dev/null && command -v patch >/dev/null) || \\
    (apt-get update && apt-get install -y --no-install-recommends git patch procps \\
     && rm -rf /var/lib/apt/lists/*)
RUN python3 -m pip install --no-cache-dir pytest && (command -v python >/dev/null || \\
    ln -s "$(command -v python3)" /usr/local/bin/python)
COPY gitconfig /etc/gitconfig
COPY gitignore /etc/gitignore-nexus
ENV PYTHONDONTWRITEBYTECODE=1 LANG=C.UTF-8
RUN mkdir -p /testbed
"""
    with tempfile.TemporaryDirectory(prefix="nexus-base-ctx-") as ctx:
        Path(ctx, "Dockerfile").write_text(dockerfile)
        Path(ctx, "gitconfig").write_text(_GITCONFIG)
        Path(ctx, "gitignore").write_text(_GITIGNORE)
        say(f"docker build FROM {from_image} -> {tag} (needs registry access)")
        _docker_build(client, ctx, tag, network_mode=None, what=f"base image from {from_image}")


def _run_or_fail(cmd: list[str], what: str) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr).strip()[-3000:]
        raise ImageBuildFailed(f"{what} failed (exit {proc.returncode}):\n{tail}")


def _docker_build(client, context: str, tag: str, *, network_mode: str | None, what: str, labels=None) -> None:
    import docker

    try:
        client.images.build(
            path=context,
            tag=tag,
            rm=True,
            forcerm=True,
            network_mode=network_mode,
            labels=labels or {},
            pull=False,
        )
    except docker.errors.BuildError as exc:
        lines = [chunk.get("stream", "") or chunk.get("error", "") for chunk in exc.build_log]
        tail = "".join(lines).strip()[-3000:]
        raise ImageBuildFailed(f"building {what} failed: {exc.msg}\n{tail}") from exc
    except docker.errors.APIError as exc:
        raise ImageBuildFailed(f"building {what} failed: {exc}") from exc


# ----------------------------------------------------------------------------------------- task images


def _task_dockerfile(base: str, setup: list[str], *, task_id: str = "?") -> str:
    # setup runs before the commit so its products are part of the base state, not of the agent's diff. Each
    # line is one RUN instruction: a line break in it would add instructions of its own (an `ADD https://...`
    # the daemon fetches outside network_mode none, a new `FROM`), so such a line is refused here too, not only
    # when the task is loaded.
    from env.tasks.task_model import setup_problem

    problem = setup_problem(task_id, setup)
    if problem:
        raise ImageBuildFailed(problem)
    setup_runs = "".join(f"RUN {line}\n" for line in setup)
    return (
        f"FROM {base}\n"
        "COPY repo/ /testbed/\n"
        "WORKDIR /testbed\n"
        f"{setup_runs}"
        "RUN rm -rf .git && git init -q && git add -A && git commit -q -m 'base state' "
        "&& git rev-parse HEAD > /.nexus-base-commit\n"
    )


def _tree_digest(root: Path) -> str:
    """sha256 over (relative path, executable bit, bytes) of every file under `root`, in sorted order."""
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file() or p.is_symlink()):
        rel = path.relative_to(root).as_posix()
        if "/.git/" in f"/{rel}" or "__pycache__" in rel or rel.endswith(".pyc"):
            continue
        digest.update(rel.encode() + b"\0")
        if path.is_symlink():
            digest.update(b"L" + os.readlink(path).encode())
        else:
            digest.update(b"X" if os.access(path, os.X_OK) else b"F")
            digest.update(path.read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()


def task_image_tag(task: Task, base_id: str) -> str:
    """`nexus-eval/task-<id>:<hash>`; the hash covers the base image id, recipe, setup lines and repo/."""
    repo_dir = Path(task.local_dir) / "repo"
    digest = hashlib.sha256()
    for part in (TASK_RECIPE_VERSION, base_id, "\n".join(task.setup), _tree_digest(repo_dir)):
        digest.update(part.encode() + b"\0")
    name = re.sub(r"[^a-z0-9._-]+", "-", task.instance_id.lower()).strip("-._")[:100] or "task"
    return f"nexus-eval/task-{name}:{digest.hexdigest()[:16]}"


def swebench_image_name(instance_id: str, *, namespace: str = "swebench", arch: str = "x86_64") -> str:
    """The instance image swebench 4.x's `make_test_spec` names for a row without `image` (Docker Hub's
    spelling: lower-cased, `__` written `_1776_`; test_swebench_legacy checks it against 4.1.0 itself)."""
    return f"{namespace}/sweb.eval.{arch}.{instance_id.lower()}:latest".replace("__", "_1776_")


def task_image_name(task: Task) -> str | None:
    """The image a non-local task runs in: its own `docker_image` / `image`, else the name swebench derives."""
    if task.docker_image:
        return task.docker_image
    if task.kind == "swebench":
        return swebench_image_name(task.instance_id)
    return None


def ensure_task_image(task: Task, client: docker.DockerClient | None = None, *, base_tag: str = BASE_IMAGE_TAG) -> str:
    """Return a local image tag for `task`, building local-task images when needed (cached by hash)."""
    client = client or docker_client()
    if task.kind != "local":
        image = task_image_name(task)
        if not image:
            raise ImageMissing(f"task {task.instance_id} ({task.kind}) has no docker_image field")
        if not image_exists(client, image):
            raise ImageMissing(
                f"image {image} for task {task.instance_id} is not present locally and images are never "
                f"pulled here; on a machine with registry access run `docker pull {image}` and "
                f"`docker save {image} | gzip > img.tar.gz`, then `docker load < img.tar.gz` here"
            )
        return image
    if task.local_dir is None or not (Path(task.local_dir) / "repo").is_dir():
        raise ImageBuildFailed(f"local task {task.instance_id}: {task.local_dir}/repo is not a directory")
    if not image_exists(client, base_tag):
        raise ImageMissing(f"base image {base_tag} is missing; build it with `nexus-eval images build-base`")
    dockerfile = _task_dockerfile(base_tag, list(task.setup), task_id=task.instance_id)  # refuses a bad setup line
    base_id = client.images.get(base_tag).id
    tag = task_image_tag(task, base_id)
    if image_exists(client, tag):
        return tag
    with tempfile.TemporaryDirectory(prefix="nexus-task-ctx-") as ctx:
        shutil.copytree(
            Path(task.local_dir) / "repo",
            Path(ctx) / "repo",
            symlinks=True,
            ignore=shutil.ignore_patterns(*CONTEXT_IGNORE),
        )
        Path(ctx, "Dockerfile").write_text(dockerfile)
        Path(ctx, ".dockerignore").write_text("repo/**/.git\n")
        _docker_build(
            client,
            ctx,
            tag,
            network_mode="none",
            what=f"image for task {task.instance_id}",
            labels={"nexus-eval.task": task.instance_id},
        )
    return tag


@dataclass(frozen=True)
class TaskImage:
    """One task's image as the local engine has it (see `task_images`)."""

    task_id: str
    image: str | None  # the tag or name; None for a local task while the base image (part of its hash) is missing
    present: bool
    buildable: bool  # a local task, built here from the base image; registry images never are


def task_images(
    tasks: Iterable[Task], client: docker.DockerClient | None = None, *, base_tag: str = BASE_IMAGE_TAG
) -> list[TaskImage]:
    """Which of `tasks`' images exist locally, without building anything (preflight and `doctor`)."""
    client = client or docker_client()
    base_id = client.images.get(base_tag).id if image_exists(client, base_tag) else None
    found = []
    for task in tasks:
        if task.kind == "local":
            tag = task_image_tag(task, base_id) if base_id else None
            found.append(TaskImage(task.instance_id, tag, bool(tag) and image_exists(client, tag), True))
        else:
            name = task_image_name(task)
            found.append(TaskImage(task.instance_id, name, bool(name) and image_exists(client, name), False))
    return found
