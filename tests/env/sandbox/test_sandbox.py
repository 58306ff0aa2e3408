"""The sandbox against the real engine: limits, timeouts that kill, capped output, no network, files, reaper."""

from __future__ import annotations

import time

import pytest

from env.sandbox.command_exec import kill_tagged
from env.sandbox.config import SandboxConfig, SandboxError
from env.sandbox.container import Sandbox
from env.sandbox.output import CappedBuffer
from env.sandbox.reaping import reap
from tests.conftest import TEST_JOB

pytestmark = pytest.mark.docker


def test_run_merges_streams_and_returns_exit_code(sandbox):
    result = sandbox.run("echo out; echo err >&2; echo out2; exit 7", workdir="/")
    assert result.output == "out\nerr\nout2\n"
    assert result.exit_code == 7
    assert not result.timed_out and not result.truncated


def test_workdir_and_python_tooling(sandbox):
    result = sandbox.run("pwd; python --version; python -m pytest --version", workdir="/testbed")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == "/testbed"
    assert lines[1].startswith("Python 3.")
    assert "pytest" in result.output


def test_git_commit_works_with_dropped_capabilities(sandbox):
    script = (
        "cd /testbed && git init -q && echo x > f.txt && git add -A && git commit -qm base && "
        "chown 1000:1000 f.txt && git log --format=%an"
    )
    result = sandbox.run(script, workdir="/")
    assert result.exit_code == 0, result.output
    assert result.output.strip() == "nexus-eval"
    # NET_RAW / SYS_ADMIN / MKNOD are dropped: the effective set is the small allow-list only
    caps = int(sandbox.run("grep CapEff /proc/self/status | cut -f2", workdir="/").output.strip(), 16)
    assert caps & (1 << 13) == 0  # CAP_NET_RAW
    assert caps & (1 << 21) == 0  # CAP_SYS_ADMIN
    assert caps & (1 << 27) == 0  # CAP_MKNOD


def test_sleep_is_killed_at_timeout_and_container_stays_usable(sandbox):
    started = time.monotonic()
    result = sandbox.run("sleep 1000", timeout=1.5, workdir="/")
    assert result.timed_out
    assert time.monotonic() - started < 10
    assert sandbox.run("echo alive", workdir="/").output == "alive\n"
    assert "sleep 1000" not in sandbox.run("ps -eo args", workdir="/").output


def test_timeout_kills_children_that_left_the_process_group(sandbox):
    result = sandbox.run("setsid sleep 997 >/dev/null 2>&1 & sleep 998 & sleep 999", timeout=1.5, workdir="/")
    assert result.timed_out
    processes = sandbox.run("ps -eo args", workdir="/").output
    assert "sleep 997" not in processes and "sleep 998" not in processes and "sleep 999" not in processes


def test_fork_bomb_stays_bounded(docker_client, base_image):
    config = SandboxConfig(pids=64, max_output_bytes=4096)
    with Sandbox.start(base_image, config=config, job=TEST_JOB, client=docker_client) as box:
        result = box.run("bomb() { bomb | bomb & }; bomb; sleep 5", timeout=4, workdir="/")
        assert result.timed_out or result.exit_code != 0
        kill_tagged(box.container, "x")  # harmless no-op; the container must still answer
        count = int(box.run("ls -d /proc/[0-9]* | wc -l", timeout=30, workdir="/").output.strip())
        assert count <= 64
        assert box.run("echo ok", timeout=30, workdir="/").output == "ok\n"


def test_memory_hog_is_killed_and_container_survives(docker_client, base_image):
    config = SandboxConfig(memory="256m")
    with Sandbox.start(base_image, config=config, job=TEST_JOB, client=docker_client) as box:
        result = box.run(
            "python3 -c \"x = bytearray(1024 * 1024 * 1024); print('allocated')\"", timeout=60, workdir="/"
        )
        assert result.exit_code != 0
        assert "allocated" not in result.output
        assert box.run("echo ok", workdir="/").output == "ok\n"


def test_large_diff_is_not_truncated(sandbox):
    sandbox.check("cd /testbed && git init -q && git commit -q --allow-empty -m base", workdir="/")
    sandbox.check("seq 1 200000 > /testbed/big.txt", workdir="/")
    patch = sandbox.diff()
    assert len(patch) > sandbox.config.max_output_bytes
    assert patch.rstrip().endswith("+200000")


@pytest.mark.slow
def test_one_gigabyte_print_is_capped(sandbox):
    result = sandbox.run("head -c 1000000000 /dev/zero | tr '\\0' a", timeout=120, workdir="/")
    assert result.truncated
    assert len(result.output) < sandbox.config.max_output_bytes + 200
    assert "bytes omitted from the middle" in result.output
    assert result.output.startswith("a" * 1000) and result.output.endswith("a" * 1000)


def test_capped_buffer_keeps_head_and_tail():
    buffer = CappedBuffer(10)
    for chunk in (b"01234", b"56789", b"abcdef"):
        buffer.add(chunk)
    text, truncated = buffer.text()
    assert truncated
    assert text.startswith("01234") and text.endswith("bcdef")
    assert "6 bytes omitted" in text


def test_no_network_inside(sandbox):
    assert sandbox.run("ls /sys/class/net", workdir="/").output.split() == ["lo"]
    probe = "python3 -c \"import socket; s=socket.socket(); s.settimeout(3); s.connect(('93.184.216.34', 80))\""
    result = sandbox.run(probe, timeout=20, workdir="/")
    assert result.exit_code != 0
    assert "unreachable" in result.output.lower() or "error" in result.output.lower()


def test_files_round_trip_through_archives(sandbox, tmp_path):
    sandbox.write_file("/testbed/deep/dir/a.txt", "héllo\n")
    assert sandbox.read_file("/testbed/deep/dir/a.txt") == "héllo\n".encode()
    with pytest.raises(FileNotFoundError):
        sandbox.read_file("/testbed/missing.txt")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text("X = 1\n")
    sandbox.copy_in(tmp_path / "pkg", "/testbed/src")
    assert sandbox.run("cat /testbed/src/pkg/m.py", workdir="/").output == "X = 1\n"
    copied = sandbox.copy_out("/testbed/src/pkg", tmp_path / "out")
    assert (copied / "m.py").read_text() == "X = 1\n"


def test_diff_is_staged_diff_including_new_files(sandbox):
    sandbox.check("cd /testbed && git init -q && echo a > a.txt && git add -A && git commit -qm base", workdir="/")
    sandbox.check(
        "cd /testbed && echo b >> a.txt && echo new > new.txt && mkdir -p __pycache__ && echo junk > __pycache__/x.pyc",
        workdir="/",
    )
    patch = sandbox.diff()
    assert "diff --git a/a.txt b/a.txt" in patch and "+b" in patch
    assert "diff --git a/new.txt b/new.txt" in patch
    assert "__pycache__" not in patch


def test_start_failure_is_infra_error(docker_client):
    with pytest.raises(SandboxError, match="not present locally"):
        Sandbox.start("nexus-eval/does-not-exist:nope", job=TEST_JOB, client=docker_client)


def test_close_is_idempotent_and_removes_container(docker_client, base_image):
    import docker

    box = Sandbox.start(base_image, job=TEST_JOB, client=docker_client)
    container_id = box.id
    box.close()
    box.close()
    with pytest.raises(docker.errors.NotFound):
        docker_client.containers.get(container_id)
    with pytest.raises(SandboxError):
        box.run("true")


def test_labels_and_limits(sandbox):
    sandbox.container.reload()
    labels = sandbox.container.labels
    assert labels["nexus-eval.job"] == TEST_JOB
    assert {"nexus-eval.episode", "nexus-eval.created", "nexus-eval.ttl"} <= set(labels)
    host = sandbox.container.attrs["HostConfig"]
    assert host["NetworkMode"] == "none"
    assert host["Privileged"] is False
    assert host["CapDrop"] == ["ALL"]
    assert host["PidsLimit"] == sandbox.config.pids
    assert host["Memory"] > 0 and host["NanoCpus"] > 0


def test_reaper_removes_expired_but_not_live_containers(docker_client, base_image):
    job = f"{TEST_JOB}-reap"
    live = Sandbox.start(base_image, config=SandboxConfig(ttl_s=3600), job=job, client=docker_client)
    try:
        assert reap(label_filter={"nexus-eval.job": job}, client=docker_client) == 0
        assert reap(older_than_s=0, label_filter={"nexus-eval.job": job}, client=docker_client) == 1
        assert not docker_client.containers.list(
            all=True, ignore_removed=True, filters={"label": f"nexus-eval.job={job}"}
        )
    finally:
        live.close()


@pytest.mark.slow
def test_container_exits_at_its_ttl_and_is_reaped(docker_client, base_image):
    job = f"{TEST_JOB}-ttl"
    box = Sandbox.start(base_image, config=SandboxConfig(ttl_s=10), job=job, client=docker_client)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            box.container.reload()
            if box.container.status == "exited":
                break
            time.sleep(1)
        assert box.container.status == "exited"
        assert reap(label_filter={"nexus-eval.job": job}, client=docker_client) == 1
    finally:
        box.close()
