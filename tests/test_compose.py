"""compose.yaml checked statically (it is never started here): services, queues, GPU, socket, networking."""

from __future__ import annotations

from pathlib import Path

import yaml

from jobs.queue import QUEUES

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = yaml.safe_load((ROOT / "compose.yaml").read_text())
SERVICES = COMPOSE["services"]


def _queues(service: dict) -> set[str]:
    command = service["command"]
    return set(command[command.index("--queues") + 1].split(","))


def test_every_part_of_the_deployment_is_there():
    assert set(SERVICES) == {"redis", "postgres", "gpu-worker", "grade-worker", "flower"}


def test_workers_cover_every_queue_and_gpu_is_alone_on_its_worker():
    assert _queues(SERVICES["gpu-worker"]) == {"gpu"}
    assert _queues(SERVICES["gpu-worker"]) | _queues(SERVICES["grade-worker"]) == set(QUEUES)
    gpu_cmd = SERVICES["gpu-worker"]["command"]
    assert gpu_cmd[gpu_cmd.index("--concurrency") + 1] == "1"  # one process per GPU


def test_gpu_worker_reserves_an_nvidia_device():
    gpu = SERVICES["gpu-worker"]
    assert gpu["runtime"] == "nvidia"
    devices = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert any(d["driver"] == "nvidia" and "gpu" in d["capabilities"] for d in devices)
    assert gpu["environment"]["NEXUS_EVAL_DEVICE"] == "cuda"


def test_workers_mount_the_docker_socket_and_use_redis_and_postgres():
    for name in ("gpu-worker", "grade-worker"):
        service = SERVICES[name]
        assert "/var/run/docker.sock:/var/run/docker.sock" in service["volumes"]
        env = service["environment"]
        assert env["NEXUS_EVAL_BROKER"].startswith("redis://:") and "@redis:6379/" in env["NEXUS_EVAL_BROKER"]
        assert env["NEXUS_EVAL_DB"].startswith("postgresql+psycopg://")
        assert float(env["NEXUS_EVAL_VISIBILITY_TIMEOUT"]) > float(env["NEXUS_EVAL_HARD_TIME_LIMIT"])
        assert float(env["NEXUS_EVAL_HARD_TIME_LIMIT"]) > float(env["NEXUS_EVAL_SOFT_TIME_LIMIT"])


def test_no_host_networking_and_published_ports_are_loopback_only():
    for name, service in SERVICES.items():
        assert service.get("network_mode") != "host", name
        assert not service.get("privileged", False), name
        for port in service.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), (name, port)


def test_redis_keeps_its_queue_across_restarts():
    assert "appendonly yes" in " ".join(SERVICES["redis"]["command"])


def test_the_worker_image_is_buildable_from_the_repo():
    dockerfile = ROOT / SERVICES["gpu-worker"]["build"]["dockerfile"]
    text = dockerfile.read_text()
    assert text.startswith("#") and "FROM " in text and "pip install" in text


def test_secrets_have_no_defaults_and_redis_needs_a_password():
    """compose refuses to start without REDIS_PASSWORD / POSTGRES_PASSWORD (``${VAR:?...}``); no default password."""
    text = (ROOT / "compose.yaml").read_text()
    assert "POSTGRES_PASSWORD:-" not in text and "REDIS_PASSWORD:-" not in text
    env = SERVICES["grade-worker"]["environment"]
    assert env["NEXUS_EVAL_BROKER"].startswith("redis://:${REDIS_PASSWORD:?")
    assert "${POSTGRES_PASSWORD:?" in env["NEXUS_EVAL_DB"]
    assert SERVICES["postgres"]["environment"]["POSTGRES_PASSWORD"].startswith("${POSTGRES_PASSWORD:?")
    redis = SERVICES["redis"]
    assert "requirepass" in " ".join(redis["command"]) and "REDIS_PASSWORD" not in redis["command"][-1].split("|")[-1]
    assert redis["environment"]["REDISCLI_AUTH"].startswith("${REDIS_PASSWORD:?")  # the healthcheck authenticates


def test_the_image_build_context_leaves_out_databases_history_and_secrets(tmp_path):
    """.dockerignore, read by docker-py's own matcher: `COPY . /app` must not bake these into the worker image."""
    from docker.utils import exclude_paths

    keep = ["jobs/settings.py", "docker/worker.Dockerfile", "pyproject.toml"]
    drop = [
        ".git/config",
        ".env",
        "deploy.env",
        "runs/results.db",
        "runs/celery-broker.db",
        "nested/x.db",
        "bench/out/table.json",
        "workers/__pycache__/app.cpython-311.pyc",
        ".venv/bin/python",
    ]
    for rel in keep + drop:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x")
    patterns = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()]
    patterns = [p for p in patterns if p and not p.startswith("#")]
    included = set(exclude_paths(str(tmp_path), patterns, dockerfile="docker/worker.Dockerfile"))
    assert set(keep) <= included
    assert not included & set(drop), sorted(included & set(drop))


def test_postgres_keepalives_match_every_connection_s_own():
    """The server-wide keepalives are the ones each of our connections sets for its session (defined once, in
    ``db.session_bounds.SessionBounds``); the session timeouts stay per worker connection, never server-wide (a reader
    streams rows inside a transaction while it prints them)."""
    from db.session_bounds import CONNECTION_BOUNDS

    command = SERVICES["postgres"]["command"]
    assert command[0] == "postgres" and command[1::2] == ["-c"] * (len(command) // 2)
    server = dict(setting.split("=", 1) for setting in command[2::2])
    assert server == CONNECTION_BOUNDS.server_settings()
    assert "idle_in_transaction_session_timeout" not in server and "statement_timeout" not in server


def test_workers_name_their_nodes_as_the_multi_host_recipe_does():
    """``QUEUE@%h`` (Celery expands ``%h`` to the host name), as the hosts of docs/service.md's recipe and of the test
    bed (``tests.support.hosts``) name theirs: Flower and the logs tell the hosts apart by it."""
    for service, queue in (("gpu-worker", "gpu"), ("grade-worker", "grade")):
        command = SERVICES[service]["command"]
        assert command[command.index("--hostname") + 1] == f"{queue}@%h"
