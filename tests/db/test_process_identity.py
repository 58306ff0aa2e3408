"""``db.process_identity``: a claim holder's identity is unique per process across hosts, and "that pid is gone" is
trusted only in the checker's own pid namespace (same kernel boot, same namespace). Hosts that share a hostname
(containers, network namespaces, cloned VMs) never judge each other dead by it; a gone process of this namespace is
dead at once, through the claim's own default check."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
from datetime import timedelta

import pytest

from db import store as st
from db.claims import claim_episode
from db.liveness import holder_gone
from db.models import Episode, utcnow
from db.process_identity import kernel_instance, local_pid, local_worker_is_dead, worker_identity
from tests.db.test_liveness import _job
from tests.support.db_fixtures import sqlite_db_fixture  # noqa: F401  (fixtures)

PRINT_IDENTITY = "from db.process_identity import worker_identity; print(worker_identity())"


def _gone_identity() -> str:
    """The identity of a process of this namespace that has exited (its pid is free now)."""
    done = subprocess.run([sys.executable, "-c", PRINT_IDENTITY], capture_output=True, text=True, check=True)
    return done.stdout.strip()


def _other_kernel(identity: str, kernel: str) -> str:
    host, pid, _ = identity.split("/")
    return f"{host}/{pid}/{kernel}"


def test_the_identity_is_readable_and_names_the_pid_namespace():
    host, pid, kernel = worker_identity().split("/")
    assert host == socket.gethostname()[:160] and pid.isdigit() and kernel == kernel_instance()
    assert len(worker_identity()) <= 200  # episodes.worker
    gone = _gone_identity()  # a child process: same host, same namespace, its own pid
    assert gone.split("/")[0] == host and gone.split("/")[2] == kernel and gone != worker_identity()


def test_a_gone_process_of_this_namespace_is_dead_and_this_one_is_alive():
    gone = _gone_identity()
    assert local_pid(gone) is not None
    assert local_worker_is_dead(gone) is True
    assert local_worker_is_dead(worker_identity()) is False


def test_the_same_hostname_on_another_boot_or_pid_namespace_is_never_dead_by_its_pid():
    """Hosts sharing a hostname (a cloned VM: another boot id; a container: another pid namespace) hold pids that
    say nothing here: the pid is gone in this namespace, yet the holder is not judged dead."""
    gone = _gone_identity()
    boot, _, namespace = kernel_instance().partition("-")
    other_boot = _other_kernel(gone, f"{'1' * 12 if boot == '0' * 12 else '0' * 12}-{namespace or 1}")
    other_namespace = _other_kernel(gone, f"{boot}-{int(namespace or 0) + 1}")
    for holder in (other_boot, other_namespace):
        assert local_pid(holder) is None and local_worker_is_dead(holder) is False, holder


def test_an_identity_stored_before_the_kernel_part_is_never_dead_by_its_pid():
    """``hostname/pid`` (rows of an earlier release, or of a host still running one) cannot say which host of that
    name it was: its heartbeat decides, never this host's process table."""
    host, pid, _ = _gone_identity().split("/")
    assert local_worker_is_dead(f"{host}/{pid}") is False
    assert local_worker_is_dead("garbage") is False and local_worker_is_dead(f"{host}/x/{kernel_instance()}") is False


def test_a_process_in_another_pid_namespace_of_this_machine_is_told_apart():
    """A real second pid namespace (``unshare --pid``: what a container has): same boot, same hostname, its own
    namespace. Its pid (1 there) is not this namespace's pid 1, and once it has exited it is still not judged
    dead from here (nothing here can see its process table)."""
    if shutil.which("unshare") is None:
        pytest.skip("no unshare(1) here")
    command = ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", PRINT_IDENTITY]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        pytest.skip(f"cannot make a pid namespace here: {done.stderr.strip()[-200:]}")
    inside = done.stdout.strip()
    host, pid, kernel = inside.split("/")
    assert host == worker_identity().split("/")[0] and kernel != kernel_instance()
    assert kernel.split("-")[0] == kernel_instance().split("-")[0]  # the same boot
    assert local_worker_is_dead(inside) is False


def test_a_claim_is_taken_over_at_once_only_from_a_gone_process_of_this_namespace(sqlite_db):
    """The claim's own default check (no ``is_dead`` given): a fresh heartbeat of a gone pid of this namespace is
    taken over at once; the same pid and hostname under another boot is left to its heartbeat."""
    gone = _gone_identity()
    elsewhere = _other_kernel(gone, "0" * 12 + "-1")
    _, (here_ep, far_ep) = _job(sqlite_db, 2)
    with sqlite_db.session() as s:
        assert claim_episode(s, here_ep, worker=gone) is not None
        assert claim_episode(s, far_ep, worker=elsewhere) is not None
    with sqlite_db.session() as s:
        taken = claim_episode(s, here_ep, stale_after_s=3600)
        assert taken is not None and taken.took_over_from == gone
        assert claim_episode(s, far_ep, stale_after_s=3600) is None  # alive as far as this host can tell
        row = st.get_episode(s, far_ep)
        assert not holder_gone(row, stale_after_s=3600, now=utcnow())
        assert holder_gone(row, stale_after_s=3600, now=utcnow() + timedelta(hours=2))  # its heartbeat decides
    assert Episode.__table__.c.worker.type.length >= len(worker_identity())
