"""What a job records about the code that ran it: package versions and the service's git revision."""

from __future__ import annotations

import subprocess
from importlib import metadata
from pathlib import Path

# The packages whose versions change results or their grading.
TRACKED_PACKAGES = (
    "nexus-eval",
    "torch",
    "transformers",
    "numpy",
    "pydantic",
    "swebench",
    "docker",
    "celery",
    "redis",
    "sqlalchemy",
    "alembic",
    "psycopg",
)
SERVICE_ROOT = Path(__file__).resolve().parent.parent


def package_versions(names: tuple[str, ...] = TRACKED_PACKAGES) -> dict[str, str]:
    """``{distribution: version}``; a package that is not installed maps to ``"not installed"``."""
    versions = {}
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def git_revision(root: Path = SERVICE_ROOT) -> str | None:
    """The checkout's HEAD commit, with ``-dirty`` when tracked files are modified; ``None`` outside git."""
    try:
        head = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{head}-dirty" if dirty else head
