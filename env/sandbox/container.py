"""One Docker container per episode, on docker-py against the local Docker daemon (settings: `env.sandbox.config`).

The keep-alive command is `sleep <ttl_s>` under tini as PID 1 (reaps orphans), so a container whose owner died
exits by itself at its TTL; `env.sandbox.reaping.reap()` removes exited or expired ones.

Commands (`Sandbox.run`) run under an in-container timeout with a host-side guard, their output streamed and
capped (`env.sandbox.command_exec`); files go in and out as tar archives.
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
import tarfile
import time
import uuid
from pathlib import Path, PurePosixPath

from env.sandbox.command_exec import exec_command
from env.sandbox.config import SandboxConfig, SandboxError, episode_labels
from env.sandbox.output import (
    FILE_OUTPUT_HEAD_BYTES,
    FILE_OUTPUT_TAIL_BYTES,
    CappedBuffer,
    ChunkReader,
    ExecResult,
)


class Sandbox:
    """A running container. Use as a context manager (or call `close()`); `start()` makes one."""

    def __init__(self, client, container, config: SandboxConfig) -> None:
        self.client = client
        self.container = container
        self.config = config
        self._closed = False
        self._snapshots: dict[str, str] = {}

    # ------------------------------------------------------------------------------------ lifecycle
    @classmethod
    def start(
        cls,
        image: str,
        *,
        config: SandboxConfig | None = None,
        labels: dict[str, str] | None = None,
        job: str = "adhoc",
        episode: str | None = None,
        client=None,
    ) -> Sandbox:
        """Create and start a container from `image`; raise SandboxError if it cannot run a command."""
        import docker

        config = config or SandboxConfig()
        if client is None:
            try:
                client = docker.from_env(timeout=300)
            except docker.errors.DockerException as exc:
                raise SandboxError(f"cannot reach the Docker daemon: {exc}") from exc
        all_labels = episode_labels(job, episode or uuid.uuid4().hex[:12], config.ttl_s)
        all_labels.update(labels or {})
        try:
            client.images.get(image)  # containers.run would try to pull a missing image: never pull
        except docker.errors.ImageNotFound as exc:
            raise SandboxError(f"image {image} is not present locally (images are never pulled): {exc}") from exc
        except docker.errors.DockerException as exc:
            raise SandboxError(f"cannot inspect image {image}: {exc}") from exc
        # image_env: neither environment nor working directory is set, so both are the image's, as in
        # swebench's create_container; otherwise our PATH replaces the image's (its other ENV stays) and the
        # keep-alive runs in "/". A user set here is every exec's default.
        own = {} if config.image_env else {"working_dir": "/", "environment": {"PATH": config.command_path}}
        if config.user is not None:
            own["user"] = config.user
        if config.max_file_bytes is not None:
            own["ulimits"] = [docker.types.Ulimit(name="fsize", soft=config.max_file_bytes, hard=config.max_file_bytes)]
        if config.disk_size is not None:
            own["storage_opt"] = {"size": config.disk_size}
        container = None
        try:
            container = client.containers.create(
                image,
                entrypoint=["sleep", str(config.ttl_s)],
                command=[],
                init=True,
                network_mode="bridge" if config.network else "none",
                mem_limit=config.memory,
                memswap_limit=config.memory,
                pids_limit=config.pids,
                nano_cpus=int(config.cpus * 1e9),
                cap_drop=["ALL"],
                cap_add=config.cap_add,
                security_opt=["no-new-privileges"],
                privileged=False,
                labels=all_labels,
                **own,
            )
            container.start()
        except docker.errors.DockerException as exc:
            if container is not None:
                with contextlib.suppress(docker.errors.DockerException):
                    container.remove(force=True)
            if config.disk_size is not None and re.search(r"storage[- _]?opt", str(exc), flags=re.I):
                raise SandboxError(
                    f"SandboxConfig.disk_size={config.disk_size!r} (a per-container disk quota, docker --storage-opt "
                    "size) needs a storage driver that supports it: overlay2 on an xfs backing file system mounted "
                    "with pquota, or btrfs, zfs, devicemapper; this engine refused it, so leave disk_size unset "
                    f"(max_file_bytes bounds each file on every driver). The engine said: {exc}"
                ) from exc
            raise SandboxError(f"container from {image} failed to start: {exc}") from exc
        box = cls(client, container, config)
        try:
            probe = box.run("true", timeout=30, workdir="/")
            if probe.exit_code != 0:
                raise SandboxError(f"container from {image} cannot run commands: {probe.output[-500:]}")
        except BaseException:
            box.close()
            raise
        return box

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def close(self) -> None:
        """Remove the container (idempotent; a container already gone is fine)."""
        if self._closed:
            return
        self._closed = True
        import docker

        with contextlib.suppress(docker.errors.NotFound):
            self.container.remove(force=True)

    @property
    def id(self) -> str:
        return self.container.id

    # ------------------------------------------------------------------------------------ commands
    def run(self, cmd: str, *, timeout: float | None = None, workdir: str | None = "/testbed") -> ExecResult:
        """Run `cmd` with `/bin/sh -c` in `workdir` (None: the container's working directory, the image's
        WORKDIR under `path="image"`); the timeout is enforced inside the container."""
        if self._closed:
            raise SandboxError("sandbox is closed")
        timeout = float(timeout if timeout is not None else self.config.default_timeout_s)
        return exec_command(self.client, self.container, self.config, cmd, timeout=timeout, workdir=workdir)

    def run_to_file(
        self,
        cmd: str,
        *,
        timeout: float | None = None,
        workdir: str | None = "/testbed",
        head_bytes: int = FILE_OUTPUT_HEAD_BYTES,
        tail_bytes: int = FILE_OUTPUT_TAIL_BYTES,
    ) -> ExecResult:
        """`run`, with the output written to a file in the container and streamed back keeping its first
        `head_bytes` and last `tail_bytes` (a marker says how many bytes were dropped between them): for logs
        that are evidence, such as a grading run's, whose results are at the end. The file can grow only to
        `max_file_bytes` (then the writer gets SIGXFSZ). The shell's own messages, if any, follow it."""
        out = f"/tmp/.nexus-output-{uuid.uuid4().hex}.log"
        result = self.run(f"( {cmd} ) > {out} 2>&1", timeout=timeout, workdir=workdir)
        try:
            text, cut = self.read_file_capped(out, head_bytes=head_bytes, tail_bytes=tail_bytes)
        except FileNotFoundError:
            text, cut = "", False
        finally:
            self.run(f"rm -f {out}", timeout=30, workdir="/")
        return result.model_copy(update={"output": text + result.output, "truncated": result.truncated or cut})

    def read_file_capped(self, path: str, *, head_bytes: int, tail_bytes: int) -> tuple[str, bool]:
        """One regular file as text (UTF-8, bad bytes replaced), streamed through `get_archive` keeping its
        first `head_bytes` and last `tail_bytes` with TRUNCATION_MARK between them; True when some was
        dropped. Host memory stays within the two caps whatever the file's size. FileNotFoundError if absent."""
        import docker

        try:
            chunks, _stat = self.container.get_archive(path)
        except docker.errors.NotFound:
            raise FileNotFoundError(f"{path} does not exist in container {self.container.short_id}") from None
        buffer = CappedBuffer(head_bytes + tail_bytes, head=head_bytes)
        with tarfile.open(fileobj=io.BufferedReader(ChunkReader(chunks), 1024**2), mode="r|") as tar:
            member = tar.next()
            if member is None or not member.isfile():
                raise IsADirectoryError(f"{path} is not a regular file")
            handle = tar.extractfile(member)
            while block := handle.read(1024**2):
                buffer.add(block)
        return buffer.text()

    def check(self, cmd: str, *, timeout: float | None = None, workdir: str | None = "/testbed") -> str:
        """`run`, but a non-zero exit or a timeout raises SandboxError (for our own plumbing commands)."""
        result = self.run(cmd, timeout=timeout, workdir=workdir)
        if result.exit_code != 0 or result.timed_out:
            raise SandboxError(f"`{cmd[:200]}` failed (exit {result.exit_code}): {result.output[-1500:]}")
        return result.output

    # ------------------------------------------------------------------------------------ files
    def write_file(self, path: str, data: bytes | str, *, mode: int = 0o644) -> None:
        """Write one file (parents are created) through a tar archive."""
        raw = data.encode() if isinstance(data, str) else data
        target = PurePosixPath(path)
        self.check(f"mkdir -p {shlex.quote(str(target.parent))}", workdir="/")
        self.write_files(str(target.parent), {target.name: raw}, mode=mode)

    def write_files(self, directory: str, files: dict[str, bytes | str], *, mode: int = 0o644) -> None:
        """Write several files into one existing directory with a single archive (no extra exec)."""
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for name, data in files.items():
                raw = data.encode() if isinstance(data, str) else data
                info = tarfile.TarInfo(name)
                info.size, info.mode, info.mtime = len(raw), mode, int(time.time())
                tar.addfile(info, io.BytesIO(raw))
        if not self.container.put_archive(directory, buf.getvalue()):
            raise SandboxError(f"writing {sorted(files)} into {directory} failed")

    def read_file(self, path: str) -> bytes:
        """Read one regular file through `get_archive`; FileNotFoundError if it does not exist."""
        import docker

        try:
            chunks, _stat = self.container.get_archive(path)
        except docker.errors.NotFound:
            raise FileNotFoundError(f"{path} does not exist in container {self.container.short_id}") from None
        with tarfile.open(fileobj=io.BytesIO(b"".join(chunks))) as tar:
            member = tar.next()
            if member is None or not member.isfile():
                raise IsADirectoryError(f"{path} is not a regular file")
            return tar.extractfile(member).read()

    def exists(self, path: str) -> bool:
        return self.run(f"test -e {shlex.quote(path)}", timeout=30, workdir="/").exit_code == 0

    def copy_in(self, host_path: str | Path, container_dir: str) -> None:
        """Copy a host file or directory into `container_dir` (created if needed)."""
        host_path = Path(host_path)
        if not host_path.exists():
            raise FileNotFoundError(host_path)
        self.check(f"mkdir -p {shlex.quote(container_dir)}", workdir="/")
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            tar.add(str(host_path), arcname=host_path.name)
        if not self.container.put_archive(container_dir, buf.getvalue()):
            raise SandboxError(f"copying {host_path} into {container_dir} failed")

    def copy_out(self, container_path: str, host_dir: str | Path) -> Path:
        """Copy a container file or directory into `host_dir`; return the host path of the copy."""
        import docker

        host_dir = Path(host_dir)
        host_dir.mkdir(parents=True, exist_ok=True)
        try:
            chunks, _stat = self.container.get_archive(container_path)
        except docker.errors.NotFound:
            raise FileNotFoundError(f"{container_path} does not exist in the container") from None
        with tarfile.open(fileobj=io.BytesIO(b"".join(chunks))) as tar:
            tar.extractall(host_dir, filter="data")
        return host_dir / PurePosixPath(container_path).name

    # ------------------------------------------------------------------------------------ git
    def snapshot(self, repo: str = "/testbed") -> str:
        """Record `repo`'s tree as it is now (tracked and untracked files, not ignored ones) as a git tree
        object, through a private index: HEAD, the index and the work tree stay as they are. `diff()` is
        then taken against it, so files the image left in the tree (build scripts, install-modified
        configs) never enter the episode's patch."""
        index = "/tmp/.nexus-snapshot.index"
        cmd = (
            f"rm -f {index} && export GIT_INDEX_FILE={index} && "
            "(git read-tree HEAD 2>/dev/null || git read-tree --empty) && git add -A && git write-tree"
        )
        result = self.run(cmd, timeout=300, workdir=repo)
        tree = result.output.strip().splitlines()[-1] if result.output.strip() else ""
        if result.exit_code != 0 or result.timed_out or not re.fullmatch(r"[0-9a-f]{40,64}", tree):
            raise SandboxError(f"snapshot of {repo} failed (exit {result.exit_code}): {result.output[-800:]}")
        self._snapshots[repo] = tree
        return tree

    def diff(self, repo: str = "/testbed") -> str:
        """The episode's patch, binary-safe and without colour: against the `snapshot()` of `repo` when one
        was taken, else `git add -A && git diff --cached` (against HEAD).

        The diff goes to a file and comes back as an archive, so the output cap never truncates it.
        """
        out = "/tmp/.nexus-episode.diff"
        base = self._snapshots.get(repo)
        if base:
            index = "/tmp/.nexus-diff.index"
            cmd = (
                f"rm -f {index} && export GIT_INDEX_FILE={index} && git read-tree {base} && git add -A && "
                f"git -c core.quotepath=off diff --cached --binary --no-color {base} > {out}"
            )
        else:
            cmd = f"git add -A && git -c core.quotepath=off diff --cached --binary --no-color > {out}"
        result = self.run(cmd, timeout=300, workdir=repo)
        if result.exit_code != 0 or result.timed_out:
            raise SandboxError(f"git diff in {repo} failed (exit {result.exit_code}): {result.output[-800:]}")
        try:
            return self.read_file(out).decode("utf-8", errors="replace")
        finally:
            self.run(f"rm -f {out}", timeout=30, workdir="/")
