"""A sandbox's settings: what a container may use (`SandboxConfig`), the agent's PATH, the labels that name an
episode's containers, and the one per-file bound every container runs under (`MAX_FILE_BYTES`).

Isolation (`SandboxConfig`): `network_mode="none"`, memory / pids / CPU limits, no privileged mode, every
capability dropped but the few a root user needs to manage files it does not own (`cap_add`),
`no-new-privileges`. Disk: `max_file_bytes` is RLIMIT_FSIZE on every process in the container (a ulimit, so it
holds on every storage driver); `disk_size` asks Docker for a total quota on the writable layer (`storage_opt
size`), which only some storage drivers support. Environment (`path`, `user`): by default every command gets
SANDBOX_PATH (the agent's) on top of the image's other ENV, in `/testbed`, as the image's USER; `path="image"`
keeps the image's environment untouched, as SWE-bench's harness does. See docs/sandbox.md.
"""

from __future__ import annotations

import time

from pydantic import BaseModel, ConfigDict, Field, field_validator

# Repo interpreters first, as in R2E-Gym's DOCKER_PATH: R2E images keep a uv venv at /testbed/.venv
# (linked to /root/.venv), SWE-bench images a conda env `testbed`; directories that do not exist are skipped.
SANDBOX_PATH = ":".join(
    [
        "/testbed/.venv/bin",
        "/root/.venv/bin",
        "/opt/miniconda3/envs/testbed/bin",
        "/opt/miniconda3/bin",
        "/root/.local/bin",
        "/usr/local/sbin",
        "/usr/local/bin",
        "/usr/sbin",
        "/usr/bin",
        "/sbin",
        "/bin",
    ]
)
IMAGE_ENV = "image"  # SandboxConfig.path: keep the image's own environment
LABEL_PREFIX = "nexus-eval"
#: the episode a container serves (``episode_labels``), and the process whose claim it serves: the service's
#: ``hostname/pid/kernel`` identity (``db.process_identity``). A host reaps a container whose episode another
#: process holds now, or nobody (``workers.faults.recovery.reap_lost_containers``).
EPISODE_LABEL = f"{LABEL_PREFIX}.episode"
WORKER_LABEL = f"{LABEL_PREFIX}.worker"
# No file in a container grows past this (ulimit fsize): a runaway print or write cannot fill the engine's disk
# on a storage driver without per-container quotas (overlay2 on ext4). SWE-bench repositories and their test
# artifacts stay far below it.
MAX_FILE_BYTES = 1024**3


class SandboxError(RuntimeError):
    """The container could not be started, or died / stopped answering."""


class SandboxConfig(BaseModel):
    """Limits and defaults for one sandbox container."""

    model_config = ConfigDict(extra="forbid")

    memory: str = Field("2g", description="memory limit (docker syntax); swap is not allowed beyond it")
    pids: int = Field(512, ge=16, description="max processes/threads in the container (fork bombs stop here)")
    cpus: float = Field(1.0, gt=0, description="CPU quota in cores")
    ttl_s: int = Field(4 * 3600, ge=10, description="the container exits by itself after this many seconds")
    max_output_bytes: int = Field(256 * 1024, ge=1024, description="captured output cap per command")
    default_timeout_s: float = Field(120.0, gt=0, description="per-command timeout when none is given")
    host_grace_s: float = Field(15.0, ge=1, description="host-side guard beyond the in-container timeout")
    # root inside needs these to chown/chmod files of other owners (git checkout, pip, tests using tmp
    # dirs) and to signal its own processes; everything else (NET_RAW, MKNOD, SYS_CHROOT, ...) stays off.
    cap_add: list[str] = ["CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "SETUID", "SETGID"]
    env: dict[str, str] = Field(default_factory=dict, description="extra environment for every command")
    path: str | None = Field(
        None,
        description=(
            "PATH for every command. None: SANDBOX_PATH (repo interpreters first, for the agent); "
            f"'{IMAGE_ENV}': the image's own environment, set by nothing of ours (its ENV, PATH included, and its "
            "WORKDIR as the container's working directory), as SWE-bench's harness runs; "
            "else a PATH of absolute directories, set on top of the image's other ENV"
        ),
    )
    user: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9_.-]+(:[A-Za-z0-9_.-]+)?$",
        description="user[:group] of the container and so of every command; None: the image's USER",
    )
    network: bool = Field(
        False, description="attach the engine's default bridge network; off by default (network_mode none)"
    )
    max_file_bytes: int | None = Field(
        MAX_FILE_BYTES,
        ge=1024**2,
        description=(
            "RLIMIT_FSIZE (ulimit fsize) of every process in the container: no file can grow past it (the writer "
            "gets SIGXFSZ); holds on every storage driver, agent and grading containers alike. None: no limit"
        ),
    )
    disk_size: str | None = Field(
        None,
        pattern=r"^[0-9]+(\.[0-9]+)?[bkmgtBKMGT]?[bB]?$",
        description=(
            "a total quota on the container's writable layer (docker `--storage-opt size=`); needs a storage "
            "driver that supports it (overlay2 on xfs with pquota, btrfs, zfs, devicemapper). None: no quota"
        ),
    )

    @field_validator("path")
    @classmethod
    def _image_or_absolute_dirs(cls, value: str | None) -> str | None:
        if value is None or value == IMAGE_ENV:
            return value
        if not all(part.startswith("/") for part in value.split(":")):
            raise ValueError(f"path must be None, {IMAGE_ENV!r} or absolute directories joined by ':', not {value!r}")
        return value

    @property
    def image_env(self) -> bool:
        return self.path == IMAGE_ENV

    @property
    def command_path(self) -> str | None:
        """The PATH we set on every command; None when the image's own is kept."""
        return None if self.image_env else self.path or SANDBOX_PATH

    def command_env(self) -> dict[str, str]:
        """What we set in every command's environment (on top of the image's ENV), the kill tag aside."""
        path = self.command_path
        return {**({"PATH": path} if path else {}), **self.env}


def episode_labels(job: str, episode: str, ttl_s: int) -> dict[str, str]:
    return {
        f"{LABEL_PREFIX}.job": job,
        EPISODE_LABEL: episode,
        f"{LABEL_PREFIX}.created": str(int(time.time())),
        f"{LABEL_PREFIX}.ttl": str(ttl_s),
    }
