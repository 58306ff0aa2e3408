"""Private PostgreSQL, Redis and dockerd for fault tests, which stop, kill and restart them mid-job.

The shared instances other tests use (127.0.0.1:5432, 127.0.0.1:6379, /var/run/docker.sock) are never touched:
each helper runs its own process, on 127.0.0.1 only, with its own port, data and sockets in a short temp folder
(unix socket paths max ~107 bytes). ``close()`` kills all it started and removes the folder, also after a
failure; each class is a context manager that starts on enter and closes on exit.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from env.sandbox.docker_daemon import docker_host
from tests.conftest import require
from tests.support.worker_fixtures import redis_ping, wait_until

PG_ROOT = Path("/usr/lib/postgresql")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def kill_processes_mentioning(text: str) -> None:
    """SIGKILL every process whose command line contains ``text`` (a helper's unique temp folder)."""
    for proc in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError):  # gone meanwhile
            if text in (proc / "cmdline").read_bytes().decode(errors="replace") and int(proc.name) != os.getpid():
                os.kill(int(proc.name), signal.SIGKILL)


def _alive(pid: int) -> bool:
    """A running process (not a zombie: this box's init reaps orphans only every few seconds)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _stop_process(process: subprocess.Popen | None, sig: int, timeout: float = 30) -> None:
    if process is not None and process.poll() is None:
        process.send_signal(sig)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


class _Own:
    """Start on ``with``, close on leaving it (and when ``start`` itself fails)."""

    def __enter__(self):
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class OwnPostgres(_Own):
    """A private cluster, run as the ``postgres`` user (initdb refuses root); trust auth on 127.0.0.1. With ``netns``
    it runs inside that network namespace listening on ``address``, where clients log in with the role's password
    (``tests.support.hosts``)."""

    def __init__(
        self,
        user: str = "nexus",
        password: str = "nexus",
        database: str = "nexus",
        *,
        netns: str | None = None,
        address: str = "127.0.0.1",
        server_settings: dict[str, str] | None = None,
    ) -> None:
        versions = sorted((p.parent for p in PG_ROOT.glob("*/bin/initdb")), key=lambda p: int(p.parent.name))
        require(os.geteuid() == 0 and bool(versions), f"OwnPostgres needs root and binaries under {PG_ROOT}")
        self.bin = versions[-1]
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="/tmp/nxpg"))
        self.data = self.dir / "data"
        shutil.chown(self.dir, "postgres", "postgres")
        self.url = f"postgresql+psycopg://{user}:{password}@{address}:{self.port}/{database}"
        self._role = (user, password, database)
        self.netns, self.address = netns, address
        self.server_settings = dict(server_settings or {})  # server-wide, as compose.yaml's `postgres -c ...`

    def _pg(self, tool: str, *args: str, timeout: float = 60) -> None:
        inside = ["ip", "netns", "exec", self.netns] if self.netns else []
        cmd = [*inside, "runuser", "-u", "postgres", "--", str(self.bin / tool), *args]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=self.dir)
        if done.returncode != 0:
            log = self.dir / "postgres.log"
            raise RuntimeError(f"{tool} failed: {done.stderr}{done.stdout}\n{log.read_text() if log.exists() else ''}")

    def start(self) -> None:
        """Start (initdb and create the role and database the first time); waits until it accepts connections."""
        first = not self.data.exists()
        if first:
            self._pg("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "--no-sync", "-E", "UTF8")
            settings = {"listen_addresses": self.address, "port": self.port, "unix_socket_directories": self.dir}
            settings |= self.server_settings
            with open(self.data / "postgresql.conf", "a") as conf:
                conf.writelines(f"{key} = '{value}'\n" for key, value in settings.items())
                conf.write("fsync = off\n")  # a test cluster: only an OS crash could lose data
            if self.address != "127.0.0.1":  # the other hosts of a test bed: with the role's password
                with open(self.data / "pg_hba.conf", "a") as hba:
                    hba.write(f"host all all {self.address.rsplit('.', 1)[0]}.0/24 scram-sha-256\n")
        self._pg("pg_ctl", "-D", str(self.data), "-l", str(self.dir / "postgres.log"), "-w", "-t", "30", "start")
        if first:
            import psycopg

            user, password, database = self._role
            # through the unix socket in our folder: it reaches the cluster from any network namespace
            with psycopg.connect(host=str(self.dir), port=self.port, user="postgres", autocommit=True) as conn:
                conn.execute(f"CREATE ROLE {user} LOGIN PASSWORD '{password}'")
                conn.execute(f"CREATE DATABASE {database} OWNER {user}")

    def stop(self, mode: str = "fast") -> None:
        """``pg_ctl stop -m fast|smart|immediate`` (immediate is a crash: recovery runs on the next start)."""
        self._pg("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "30", "stop")

    def restart(self) -> None:
        self.stop()
        self.start()

    def close(self) -> None:
        if (self.data / "postmaster.pid").exists():
            with contextlib.suppress(Exception):  # killed below whatever happens
                self.stop("immediate")
        kill_processes_mentioning(f"{self.dir}/")  # the postmaster runs with -D <dir>/data
        shutil.rmtree(self.dir, ignore_errors=True)


class OwnRedis(_Own):
    """``redis-server`` with an append-only file, so a clean ``shutdown()`` keeps every key across restarts. With
    ``netns`` it runs inside that network namespace on ``address``; with ``password`` clients must give it."""

    def __init__(self, *, netns: str | None = None, address: str = "127.0.0.1", password: str | None = None) -> None:
        require(shutil.which("redis-server") is not None, "redis-server not installed")
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="/tmp/nxredis"))
        self.url = f"redis://{f':{password}@' if password else ''}{address}:{self.port}/0"
        self.netns, self.address, self.password = netns, address, password
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        inside = ["ip", "netns", "exec", self.netns] if self.netns else []
        settings = {"bind": self.address, "port": self.port, "dir": self.dir, "appendonly": "yes", "save": '""'}
        settings |= {"requirepass": self.password} if self.password else {}
        with open(self.dir / "redis.log", "ab") as log:
            self.process = subprocess.Popen(
                [*inside, "redis-server", "-"],
                stdin=subprocess.PIPE,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            # the settings on stdin (a config file read from "-"), so the password never shows in ps
            self.process.stdin.write("".join(f"{key} {value}\n" for key, value in settings.items()).encode())
            self.process.stdin.close()
        wait_until(lambda: redis_ping(self.url), 20, f"redis-server on port {self.port}")

    def shutdown(self) -> None:
        """A clean ``SHUTDOWN`` (the AOF is synced first)."""
        import redis

        with contextlib.suppress(redis.exceptions.ConnectionError):  # the server closes the link as it goes
            redis.Redis.from_url(self.url, socket_timeout=20).shutdown()
        _stop_process(self.process, signal.SIGTERM, timeout=20)

    def kill(self) -> None:
        _stop_process(self.process, signal.SIGKILL)

    def close(self) -> None:
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


class OwnDockerd(_Own):
    """A second dockerd with its own socket, data root, exec root and containerd; no bridge, no iptables."""

    def __init__(self) -> None:
        import docker

        require(os.geteuid() == 0 and shutil.which("dockerd") is not None, "OwnDockerd needs root and dockerd")
        try:  # the shared daemon is only ever read: its storage driver here, its images in load_images
            with contextlib.closing(docker.DockerClient(base_url=docker_host())) as shared:
                self.storage_driver = shared.info()["Driver"]  # overlay2 here; /tmp is on the same filesystem
        except docker.errors.DockerException as exc:
            require(False, f"the shared Docker daemon does not answer: {exc}")
        self.dir = Path(tempfile.mkdtemp(prefix="/tmp/nxd"))
        self.host = f"unix://{self.dir}/docker.sock"
        self.pidfile = self.dir / "docker.pid"
        self.cgroup_parent = self.dir.name  # its containers' cgroups, apart from the shared daemon's /docker
        (self.dir / "daemon.json").write_text("{}")  # never /etc/docker/daemon.json
        self.process: subprocess.Popen | None = None

    def start(self, timeout: float = 60) -> None:
        d = self.dir
        # after kill() the old containerd is a zombie until init reaps it (seconds here), and dockerd would wait
        # on that "still running" pid for good: forget it, so a fresh containerd starts
        stale = d / "exec/containerd/containerd.pid"
        if stale.exists() and not _alive(int(stale.read_text() or 0)):
            stale.unlink()
        cmd = ["dockerd", "-H", self.host, "--config-file", f"{d}/daemon.json", "--data-root", f"{d}/data"]
        cmd += ["--exec-root", f"{d}/exec", "--pidfile", str(self.pidfile), "--storage-driver", self.storage_driver]
        cmd += ["--cgroup-parent", self.cgroup_parent, "--bridge=none", "--iptables=false", "--ip-masq=false"]
        with open(d / "dockerd.log", "ab") as log:
            self.process = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd="/"
            )
        wait_until(self._up, timeout, f"dockerd at {self.host}", self.log_tail)

    def _up(self) -> bool:
        if self.process.poll() is not None:  # fail at once, not after the timeout
            raise RuntimeError(f"dockerd exited with {self.process.returncode}:\n{self.log_tail()}")
        return self.answers()

    def answers(self) -> bool:
        return subprocess.run(["docker", "-H", self.host, "info"], capture_output=True, timeout=20).returncode == 0

    def log_tail(self, n: int = 3000) -> str:
        return (self.dir / "dockerd.log").read_text(errors="replace")[-n:]

    def stop(self, timeout: float = 60) -> None:
        """SIGTERM (via the pidfile) and wait until dockerd is gone; it stops its containerd itself."""
        if self.process is None or self.process.poll() is not None:
            return
        pid = int(self.pidfile.read_text()) if self.pidfile.exists() else self.process.pid
        os.kill(pid, signal.SIGTERM)
        self.process.wait(timeout)

    def kill(self) -> None:
        """SIGKILL dockerd, as a crash would: its containerd dies with it (parent-death signal), while
        container shims live on until the next start cleans them up."""
        _stop_process(self.process, signal.SIGKILL)

    def restart(self, down_s: float = 0) -> None:
        self.stop()
        time.sleep(down_s)
        self.start()

    def load_images(self, tags: list[str]) -> float:
        """Copy ``tags`` from the shared daemon in one ``docker save | docker load`` (shared layers travel
        once); returns the seconds it took."""
        started = time.monotonic()
        source = docker_host()  # the shared daemon (or $DOCKER_HOST's), never this one
        assert source != self.host
        save = subprocess.Popen(["docker", "-H", source, "save", *tags], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        load = subprocess.run(["docker", "-H", self.host, "load", "-q"], stdin=save.stdout, capture_output=True)
        save.stdout.close()
        save_err = save.stderr.read()
        if save.wait() != 0 or load.returncode != 0:
            raise RuntimeError(f"copying {tags} failed: {save_err.decode()} {load.stderr.decode()}")
        return time.monotonic() - started

    def close(self) -> None:
        with contextlib.suppress(Exception):  # a stuck daemon is killed below with everything else
            self.stop(timeout=30)
        self.kill()
        kill_processes_mentioning(f"{self.dir}/")  # containerd and the shims name their sockets here
        self._kill_containers()
        self._unmount()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _kill_containers(self) -> None:
        """SIGKILL container processes a dead daemon left behind, and remove their cgroups (deepest first)."""
        groups = sorted(Path("/sys/fs/cgroup").glob(f"*/{self.cgroup_parent}/**/"), key=lambda p: -len(p.parts))
        for group in groups:
            with contextlib.suppress(OSError, ValueError):
                for pid in (group / "cgroup.procs").read_text().split():
                    os.kill(int(pid), signal.SIGKILL)
        time.sleep(0.2 if groups else 0)
        for group in groups:
            with contextlib.suppress(OSError):
                group.rmdir()

    def _unmount(self) -> None:
        """Unmount (lazily, deepest first) overlays, shm and netns mounts dockerd left under its folder."""
        mounts = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
        for mount in sorted((m for m in mounts if m.startswith(f"{self.dir}/")), key=len, reverse=True):
            subprocess.run(["umount", "-l", mount], capture_output=True)


def mini_task_images(task_ids: list[str]) -> list[str]:
    """The base image and the local image tags of these ``mini`` suite tasks, as the project computes them
    (``ensure_task_image``, which builds a missing one on the shared daemon)."""
    from env.tasks.images import BASE_IMAGE_TAG, docker_client, ensure_task_image
    from env.tasks.loading import load_suite, pick_task

    tasks = load_suite("mini")
    client = docker_client()
    return [BASE_IMAGE_TAG, *(ensure_task_image(pick_task(tasks, t, source="mini"), client) for t in task_ids)]
