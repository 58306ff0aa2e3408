"""The local Docker daemon: is one answering, and getting one started on a fresh machine.

Every backend drives its episodes in containers, so nothing runs without a daemon. A fresh Debian box
(root, nothing installed) is the case `nexus-eval setup` must handle alone: install Debian's `docker.io`
(and `debootstrap`, which the offline base image needs), start `dockerd` detached with no bridge, iptables
or masquerading (sandboxes only ever use `network_mode="none"`, and a container host often may not touch
iptables), and wait for it to answer. Anything else (not root, not Debian, a daemon on another host)
is a `NeedsManualSetup` whose message is the paragraph a person needs: what to install, how to start it.

This module stands alone (docker-py and the standard library only) so the CLI and CI share one path.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

DOCKERD_ARGS = ["--bridge=none", "--iptables=false", "--ip-masq=false"]
DOCKERD_LOG = Path("/var/log/dockerd.log")
DOCKERD_PIDFILE = Path("/var/run/docker.pid")
DEFAULT_HOSTS = {"", "unix:///var/run/docker.sock", "unix:///run/docker.sock"}
APT_PACKAGES = {"dockerd": "docker.io", "debootstrap": "debootstrap"}
START_COMMAND = f"dockerd {' '.join(DOCKERD_ARGS)} >>{DOCKERD_LOG} 2>&1 &"

Say = Callable[[str], None]
_started: list[subprocess.Popen] = []  # daemons this process started; kept so they are never collected


class DaemonError(RuntimeError):
    """The daemon could not be made to answer; the message says why and what to run."""


class NeedsManualSetup(DaemonError):
    """Nothing this process may do here gets a daemon (not root, not Debian, a remote DOCKER_HOST)."""


class DaemonStartFailed(DaemonError):
    """dockerd (or apt-get) was run and failed; the message carries the tail of its log."""


@dataclass(frozen=True)
class DaemonState:
    """What `daemon_state()` found: whether a daemon answers at `host`, its version, else why not."""

    answering: bool
    host: str
    version: str | None = None
    reason: str | None = None

    @property
    def local(self) -> bool:
        """The default local socket: the only place `ensure_daemon` can start a daemon for."""
        return self.host in DEFAULT_HOSTS


@dataclass(frozen=True)
class DaemonReady:
    """`ensure_daemon`'s result: what it had to do (`running`: nothing) and the daemon's version."""

    action: Literal["running", "started", "installed"]
    version: str
    host: str


def docker_host() -> str:
    """Where docker-py (and the docker CLI) connect: ``$DOCKER_HOST``, else the default local socket."""
    return os.environ.get("DOCKER_HOST", "").strip() or "unix:///var/run/docker.sock"


def _why(exc: BaseException) -> str:
    """A one-line reason from docker-py's chain of wrapped errors (the innermost OS error says most)."""
    pending, seen = [exc], set()
    while pending:
        err = pending.pop(0)
        if id(err) in seen:
            continue
        seen.add(id(err))
        if isinstance(err, FileNotFoundError):
            return "no socket at that path, so no daemon runs there"
        if isinstance(err, ConnectionRefusedError):
            return "connection refused, so no daemon listens there"
        if isinstance(err, PermissionError):
            return "permission denied on the socket: run as root, or join the `docker` group"
        pending += [e for e in (err.__cause__, err.__context__, *err.args) if isinstance(e, BaseException)]
    return str(exc).splitlines()[0][:300]


def daemon_state(timeout: float = 5.0) -> DaemonState:
    """Ping the daemon at `docker_host()` (at most `timeout` seconds); never raises."""
    import docker

    host = docker_host()
    try:
        client = docker.from_env(timeout=timeout)
        try:
            client.ping()
            version = str(client.version().get("Version", "?"))
        finally:
            client.close()
    except Exception as exc:  # docker-py raises several unrelated types for "no daemon"
        return DaemonState(answering=False, host=host, reason=_why(exc))
    return DaemonState(answering=True, host=host, version=version)


def can_apt_install() -> bool:
    """Root on Debian (or a derivative) with apt-get: the one place setup installs packages itself."""
    return os.geteuid() == 0 and Path("/etc/debian_version").exists() and shutil.which("apt-get") is not None


def find_dockerd() -> str | None:
    """dockerd's path; /usr/sbin is searched too, since a non-login root shell may not have it on PATH."""
    return shutil.which("dockerd") or next(
        (p for p in ("/usr/sbin/dockerd", "/usr/bin/dockerd") if os.access(p, os.X_OK)), None
    )


def apt_install(packages: list[str], say: Say) -> None:
    """``apt-get update && apt-get install -y PACKAGES`` non-interactively; DaemonStartFailed on failure."""
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", *packages]):
        say(" ".join(cmd))
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            tail = (proc.stdout + proc.stderr).strip()[-2000:]
            raise DaemonStartFailed(f"`{' '.join(cmd)}` failed (exit {proc.returncode}):\n{tail}")


def _install_paragraph(state: DaemonState) -> str:
    return (
        f"No Docker daemon answers at {state.host} ({state.reason}) and dockerd is not installed here. "
        "nexus-eval runs every episode in a Docker container, so it needs one. This command installs it by "
        "itself only as root on Debian; here, install Docker Daemon yourself (Debian/Ubuntu: "
        "`sudo apt-get install -y docker.io debootstrap`; elsewhere: https://docs.docker.com/engine/install/ "
        "and your distribution's debootstrap), start it (`sudo systemctl start docker`, or without systemd "
        f"`sudo {START_COMMAND}`), make sure your user may use it (`sudo usermod -aG docker $USER`, then log in "
        "again) and run `nexus-eval setup` again."
    )


def dockerd_pid() -> int | None:
    """The pid in dockerd's pidfile when that process is alive and is dockerd (a daemon still starting, or
    hung); a stale pidfile whose pid now belongs to another process is None."""
    try:
        pid = int(DOCKERD_PIDFILE.read_text().strip())
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
    except (OSError, ValueError):
        return None
    return pid if comm == "dockerd" else None


def _log_tail(log: Path, n: int = 20) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


def start_dockerd(*, wait_s: float = 60.0, log: Path = DOCKERD_LOG, say: Say = lambda _m: None) -> str:
    """Start dockerd detached (its own session, output appended to `log`) unless one is already starting,
    and wait up to `wait_s` seconds for it to answer; returns its version."""
    dockerd = find_dockerd()
    if dockerd is None:
        raise DaemonStartFailed("dockerd is not installed")
    process = None
    pid = dockerd_pid()
    if pid is not None:
        say(f"dockerd (pid {pid}) is already running; waiting for it to answer")
    else:
        log.parent.mkdir(parents=True, exist_ok=True)
        say(f"starting {START_COMMAND}")
        # its own session (no terminal's hangup reaches it), cwd / (it pins no checkout), and the sbin folders on
        # PATH, where Debian keeps runc and containerd's helpers even when this shell's PATH lacks them
        path = os.pathsep.join(
            [os.environ.get("PATH", ""), "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]
        )
        with open(log, "ab") as out:
            process = subprocess.Popen(
                [dockerd, *DOCKERD_ARGS],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd="/",
                env={**os.environ, "PATH": path.strip(os.pathsep)},
            )
        _started.append(process)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        state = daemon_state(timeout=3)
        if state.answering:
            say(f"Docker daemon {state.version} answers at {state.host}")
            return state.version or "?"
        if process is not None and process.poll() is not None:
            raise DaemonStartFailed(f"dockerd exited with code {process.returncode}; {log}:\n{_log_tail(log)}")
        time.sleep(0.5)
    raise DaemonStartFailed(f"dockerd did not answer within {wait_s:.0f} s; {log}:\n{_log_tail(log)}")


def ensure_daemon(
    *, install: bool = True, wait_s: float = 60.0, log: Path = DOCKERD_LOG, say: Say = lambda _m: None
) -> DaemonReady:
    """Get a Docker daemon answering: nothing if one does; start an installed dockerd (root); on Debian as root
    install docker.io + debootstrap first (`install=False` forbids that). NeedsManualSetup otherwise."""
    state = daemon_state()
    if state.answering:
        return DaemonReady("running", state.version or "?", state.host)
    if not state.local:
        raise NeedsManualSetup(
            f"DOCKER_HOST={state.host} does not answer ({state.reason}). nexus-eval starts a daemon only on this "
            "machine's default socket: start the daemon that DOCKER_HOST names, or unset DOCKER_HOST and run "
            "`nexus-eval setup` again."
        )
    if "permission denied" in (state.reason or ""):
        raise NeedsManualSetup(
            f"A Docker daemon runs at {state.host} but this user may not use it. Add the user to the `docker` "
            "group (`sudo usermod -aG docker $USER`, then log in again) or run nexus-eval as root."
        )
    action: Literal["started", "installed"] = "started"
    if find_dockerd() is None:
        if not (install and can_apt_install()):
            raise NeedsManualSetup(_install_paragraph(state))
        apt_install([APT_PACKAGES["dockerd"], APT_PACKAGES["debootstrap"]], say)
        action = "installed"
    if os.geteuid() != 0:
        raise NeedsManualSetup(
            f"dockerd is installed but no daemon answers at {state.host} ({state.reason}), and starting it needs "
            f"root: `sudo systemctl start docker`, or without systemd `sudo {START_COMMAND}`, or `sudo nexus-eval "
            "setup`."
        )
    return DaemonReady(action, start_dockerd(wait_s=wait_s, log=log, say=say), state.host)


def ensure_debootstrap(*, install: bool = True, say: Say = lambda _m: None) -> str:
    """debootstrap's path (the offline base image is built with it); installed with apt on Debian as root."""
    found = shutil.which("debootstrap")  # on PATH, as `build_base_image` looks for it
    if found:
        return found
    if not (install and can_apt_install()):
        raise NeedsManualSetup(
            "debootstrap is not installed, and the offline base image is built with it: install it (Debian/Ubuntu: "
            "`sudo apt-get install -y debootstrap`) and run `nexus-eval setup` again, or build the base image from a "
            "registry image on a machine that can pull: `nexus-eval images build-base --from python:3.11-slim`."
        )
    apt_install([APT_PACKAGES["debootstrap"]], say)
    return shutil.which("debootstrap") or "/usr/sbin/debootstrap"
