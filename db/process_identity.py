"""Who holds a claim: a process's identity, unique across hosts, and the one local check that it is gone.

A claim (``db.claims``), a grade claim (``db.liveness``), a worker's row and a probe run record the process that
holds them as ``hostname/pid/kernel``. ``kernel`` names the pid namespace the pid is valid in: the first 12 hex
digits of the kernel's boot id (``/proc/sys/kernel/random/boot_id``, new at every boot, so two machines or two
boots of a cloned VM differ) and the inode of the pid namespace (``/proc/self/ns/pid``, which two containers of
one machine do not share while both live). Where ``/proc`` does not tell, a random token drawn once per process
stands in (its forked children inherit it, and share its pid namespace); then only that process tree trusts the
pid check.

The hostname is there to be read by people (``doctor``, the dashboard, an episode's ``took_over_from``); it decides
nothing. Hosts may share a hostname (containers, network namespaces, cloned VMs): what tells them apart is the
kernel part. An operator sets nothing for it; the pid check is skipped where it cannot be trusted, and a holder
elsewhere is judged by its heartbeat alone (``stale_after_s``).

:func:`local_worker_is_dead` trusts "that pid is gone" only when the holder's kernel part equals this process's:
same boot, same pid namespace, so the pid names the same process table. Identities stored before the kernel part
existed (``hostname/pid``) are never judged dead by it: their host cannot be told from another of that name.
"""

from __future__ import annotations

import os
import socket
import uuid
from functools import lru_cache

BOOT_ID = "/proc/sys/kernel/random/boot_id"
PID_NAMESPACE = "/proc/self/ns/pid"
#: the hostname is cut here so that an identity fits ``episodes.worker`` (200 characters) whatever the host's name
HOST_CHARS = 160


@lru_cache(maxsize=1)
def kernel_instance() -> str:
    """This process's pid namespace as ``<boot id, 12 hex digits>-<pid namespace inode>``, or ``u<random>`` where
    ``/proc`` does not tell (drawn once per process, inherited by its forks)."""
    try:
        with open(BOOT_ID, encoding="ascii") as handle:
            boot = handle.read().strip().replace("-", "")[:12]
        namespace = os.stat(PID_NAMESPACE).st_ino
    except (OSError, ValueError):
        return f"u{uuid.uuid4().hex[:12]}"
    if len(boot) != 12:
        return f"u{uuid.uuid4().hex[:12]}"
    return f"{boot}-{namespace}"


def worker_identity() -> str:
    """``hostname/pid/kernel`` of this process (see the module docstring): what ``episodes.worker``, a worker's
    row and a probe run record."""
    host = socket.gethostname().replace("/", "_")[:HOST_CHARS]  # a "/" would split the identity wrongly
    return f"{host}/{os.getpid()}/{kernel_instance()}"


def local_pid(worker: str) -> int | None:
    """The pid of ``worker`` when it lives in this process's pid namespace (same boot, same namespace), else None:
    another host, another container, or an identity stored without its kernel part (``hostname/pid``)."""
    parts = worker.split("/")
    if len(parts) != 3 or not parts[1].isdigit() or parts[2] != kernel_instance():
        return None
    return int(parts[1])


def local_worker_is_dead(worker: str) -> bool:
    """True only when ``worker`` ran in this process's pid namespace (:func:`local_pid`) and that pid is gone.

    Every other holder is alive as far as this check knows (its heartbeat decides: ``stale_after_s``). A reused pid
    reads as alive, which errs on the side of not taking over.
    """
    pid = local_pid(worker)
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # a process of another user holds the pid: alive
        return False
    return False
