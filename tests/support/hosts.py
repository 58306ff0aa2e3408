"""Separate hosts on one machine: network namespaces joined by veth pairs, for the multi-host tests and bench.

The bed is what ``docs/service.md`` ("Workers on several hosts") tells an operator to run, with each host a
network namespace this module creates and removes:

    S (server)    Redis with a password, PostgreSQL with password logins; the grader
    A, B          one ``nexus-eval worker --queues gpu`` each, its own hostname, pid namespace and Docker daemon
    the test      in the machine's own namespace, on a link of its own to S (submit, read the database)

Every link is a veth pair with one end on a bridge in S, so ``cut(host)`` (its S end down) leaves the host
running but unreachable, as a pulled cable does (packets vanish: no reset reaches either end), and ``join(host)``
plugs it back. Traffic goes only to loopback and these namespaces. A worker host runs its processes in their own
UTS, mount and pid namespaces (``unshare``), so each has its own hostname and pids and reads as another machine to
the service (``db.process_identity``: a pid of another pid namespace is never checked locally). Every process this
starts is stopped by its pid, every loop is bounded (``wait_until``), and ``close()`` removes what ``start()`` made,
also after a failure.
"""

from __future__ import annotations

import contextlib
import os
import random
import secrets
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from db.session_bounds import CONNECTION_BOUNDS
from tests.conftest import require
from tests.support.own_services import OwnDockerd, OwnPostgres, OwnRedis, mini_task_images
from tests.support.worker_fixtures import ROOT, wait_until


def _ip(*args: str, netns: str | None = None) -> None:
    cmd = ["ip", *(["-n", netns] if netns else []), *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {done.stderr.strip()}")


@dataclass
class HostProcess:
    """A process started on a host (in its namespaces); ``pid`` is the ``unshare`` that leads its process group."""

    name: str
    process: subprocess.Popen
    log: Path

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL the whole group: the host's process dies at once, as in a power cut."""
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)

    def stop(self, timeout: float = 30) -> None:
        """SIGTERM to the service process (pid 1 of its pid namespace: Celery's warm shutdown), then SIGKILL.
        Not to ``unshare`` itself: it would die and take its child with SIGKILL (``--kill-child``)."""
        if not self.alive():
            return
        children = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children")
        for pid in children.read_text().split() if children.exists() else []:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGTERM)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()

    def tail(self, n: int = 3000) -> str:
        return f"--- {self.name} ---\n" + (self.log.read_text(errors="replace")[-n:] if self.log.exists() else "")


@dataclass
class Host:
    """One namespace: ``name`` (also its hostname), ``netns``, its address on the bed's subnet, its S-side link."""

    name: str
    netns: str
    address: str
    link: str  # the veth end on S's bridge: down = this host is cut off
    dockerd: OwnDockerd | None = None
    processes: list[HostProcess] = field(default_factory=list)


class HostBed:
    """``with HostBed(tmp_path) as bed:`` S, A and B up, Redis and PostgreSQL on S; ``bed.worker("A")`` starts a
    worker on A. ``images``: task ids whose images each worker host's own Docker daemon gets."""

    def __init__(self, folder: Path, *, images: list[str], worker_hosts: tuple[str, ...] = ("A", "B")) -> None:
        require(os.geteuid() == 0, "the host bed needs root (network namespaces)")
        self.folder = folder
        self.tag = f"nx{os.getpid() % 1000}{random.randint(0, 999)}"  # names of links and namespaces: <= 15 chars
        subnet = f"10.{random.randint(100, 250)}.{random.randint(0, 255)}"
        self.bridge = f"{self.tag}br"
        self.images = images
        names = ("S", *worker_hosts)
        self.hosts = {n: Host(n, f"{self.tag}{n}", f"{subnet}.{i + 1}", f"{self.tag}{n}s") for i, n in enumerate(names)}
        self.operator = Host("test", "", f"{subnet}.{len(names) + 1}", f"{self.tag}ts")  # this process's own link
        self.redis_password = secrets.token_urlsafe(16)
        self.redis: OwnRedis | None = None
        self.postgres: OwnPostgres | None = None
        self.started = 0

    # --- 1. the network ---------------------------------------------------------------------------------------------
    def _network(self) -> None:
        server = self.hosts["S"]
        _ip("netns", "add", server.netns)
        _ip("link", "set", "lo", "up", netns=server.netns)
        _ip("link", "add", self.bridge, "type", "bridge", netns=server.netns)
        _ip("addr", "add", f"{server.address}/24", "dev", self.bridge, netns=server.netns)
        _ip("link", "set", self.bridge, "up", netns=server.netns)
        for host in [*self.hosts.values(), self.operator]:
            if host is server:
                continue
            inner = f"{self.tag}{host.name}h"  # the host's own end
            if host.netns:
                _ip("netns", "add", host.netns)
                _ip("link", "set", "lo", "up", netns=host.netns)
            _ip("link", "add", inner, "type", "veth", "peer", "name", host.link)
            _ip("link", "set", host.link, "netns", server.netns)
            _ip("link", "set", host.link, "master", self.bridge, netns=server.netns)
            _ip("link", "set", host.link, "up", netns=server.netns)
            if host.netns:
                _ip("link", "set", inner, "netns", host.netns)
            _ip("addr", "add", f"{host.address}/24", "dev", inner, netns=host.netns or None)
            _ip("link", "set", inner, "up", netns=host.netns or None)

    def cut(self, name: str) -> None:
        """Pull the host's cable: its link to S goes down (its processes run on, their packets vanish)."""
        _ip("link", "set", self.hosts[name].link, "down", netns=self.hosts["S"].netns)

    def join(self, name: str) -> None:
        _ip("link", "set", self.hosts[name].link, "up", netns=self.hosts["S"].netns)

    # --- 2. the server's services -----------------------------------------------------------------------------------
    def start(self) -> HostBed:
        self._network()
        server = self.hosts["S"]
        self.redis = OwnRedis(netns=server.netns, address=server.address, password=self.redis_password)
        self.redis.start()
        self.postgres = OwnPostgres(
            password=secrets.token_urlsafe(16),
            netns=server.netns,
            address=server.address,
            server_settings=CONNECTION_BOUNDS.server_settings(),  # what compose.yaml starts postgres with
        )
        self.postgres.start()
        tags = mini_task_images(self.images)
        for host in self.worker_hosts():
            host.dockerd = OwnDockerd()
            host.dockerd.start()
            host.dockerd.load_images(tags)
        return self

    def worker_hosts(self) -> list[Host]:
        return [h for n, h in self.hosts.items() if n != "S"]

    def env(self, **extra: str) -> dict[str, str]:
        """What every host's worker and the operator's CLI read: the variables of docs/service.md's recipe."""
        env = {
            **os.environ,
            "NEXUS_EVAL_BROKER": self.redis.url,
            "NEXUS_EVAL_DB": self.postgres.url,
            "PYTHONUNBUFFERED": "1",
            "OMP_NUM_THREADS": "1",
            "NEXUS_EVAL_DEVICE": "cpu",
            **extra,
        }
        env.pop("NEXUS_EVAL_RESULT_BACKEND", None)
        return env

    # --- 3. processes on a host -------------------------------------------------------------------------------------
    def run(self, name: str, what: str, cmd: list[str], env: dict[str, str]) -> HostProcess:
        """Start ``cmd`` on host ``name``: its network namespace, and its own hostname, mount and pid namespaces."""
        host = self.hosts[name]
        if host.dockerd is not None:
            env = {**env, "DOCKER_HOST": host.dockerd.host}
        inside = ["ip", "netns", "exec", host.netns, "unshare", "--uts", "--mount", "--pid", "--fork"]
        inside += ["--mount-proc", "--kill-child", "sh", "-c", f'hostname {host.name.lower()}-host && exec "$@"', "sh"]
        self.started += 1  # a log of its own, never one an earlier process of the same name wrote
        log = self.folder / f"{self.started:03d}-{name}-{what}.log"
        process = subprocess.Popen(
            [*inside, *cmd],
            env=env,
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=open(log, "ab"),  # noqa: SIM115 - the child owns the file for its whole life
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        host.processes.append(HostProcess(f"{name} {what}", process, log))
        return host.processes[-1]

    def worker(self, name: str, env: dict[str, str], *, queues: str = "gpu") -> HostProcess:
        """``nexus-eval worker --queues QUEUES --hostname Q@%h`` on host ``name``, as in docs/service.md."""
        cmd = [sys.executable, "-m", "nexus_eval.cli", "worker", "--queues", queues, "--concurrency", "1"]
        return self.run(name, queues.replace(",", "+"), [*cmd, "--hostname", f"{queues.split(',')[0]}@%h"], env)

    def kill_host(self, name: str) -> None:
        """The host dies whole: every process on it, and its Docker daemon (its containers stay, as on a disk)."""
        host = self.hosts[name]
        for process in host.processes:
            process.kill()
        if host.dockerd is not None:
            host.dockerd.kill()

    def boot(self, name: str) -> None:
        """The host starts again after ``kill_host``: its Docker daemon first (a worker starts after it)."""
        host = self.hosts[name]
        if host.dockerd is not None:
            host.dockerd.start()

    def tails(self, n: int = 3000) -> str:
        return "\n".join(p.tail(n) for h in self.hosts.values() for p in h.processes)

    # --- 4. teardown ------------------------------------------------------------------------------------------------
    def close(self) -> None:
        for host in self.hosts.values():
            for process in host.processes:
                process.kill()
        for owned in [*(h.dockerd for h in self.hosts.values()), self.postgres, self.redis]:
            if owned is not None:
                with contextlib.suppress(Exception):  # each is closed whatever the others do
                    owned.close()
        with contextlib.suppress(RuntimeError):
            _ip("link", "del", f"{self.tag}testh")  # the operator's end (its peer goes with it)
        for host in self.hosts.values():
            with contextlib.suppress(RuntimeError):
                _ip("netns", "del", host.netns)

    def __enter__(self) -> HostBed:
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(self, *exc) -> None:
        self.close()


def wait_for(condition, timeout: float, what: str, bed: HostBed) -> None:
    """``wait_until`` that shows every host's log on a timeout."""
    wait_until(condition, timeout, what, bed.tails)
