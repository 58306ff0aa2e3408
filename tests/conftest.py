"""Shared test plumbing.

Markers: `docker` (a real engine), `services` (real Redis + PostgreSQL on 127.0.0.1), `slow`, `gpu`.
Tests that need an outside part skip with a reason when it is missing on a developer's machine,
but under CI (`CI=true`) a missing part is a failure: CI starts everything, so a skip there would
hide a broken install step.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from agent_runner.config import SMOLLM2, ModelSpec
from agent_runner.model_host import load_host
from agent_runner.real_models import ensure_preset, is_ready, preset_path

IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}

# One intra-op thread: the tiny models gain nothing from more, and on a 2-core machine shared with Docker
# containers and services, OpenMP threads spinning against each other made single decode steps 100x slower.
torch.set_num_threads(1)


def require(condition: bool, reason: str) -> None:
    """Skip locally, fail under CI, when an outside part the test needs is missing."""
    if condition:
        return
    if IN_CI:
        pytest.fail(f"required in CI: {reason}")
    pytest.skip(reason)


def r2egym_peer() -> Path:
    """R2E-Gym's published files (the reference for differential tests): `$NEXUS_R2EGYM_PEER`, else
    `shared/peers/r2egym` beside the checkout, else the workplace's `/work/shared/peers/r2egym`. Tests that
    need it skip when it is absent, even in CI: it is reference material outside the repository, not an
    install step."""
    if os.environ.get("NEXUS_R2EGYM_PEER"):
        return Path(os.environ["NEXUS_R2EGYM_PEER"])
    candidates = [Path(__file__).resolve().parents[1].parent / "shared/peers/r2egym", Path("/work/shared/peers/r2egym")]
    return next((p for p in candidates if p.is_dir()), candidates[0])


def need_r2egym_peer() -> Path:
    peer = r2egym_peer()
    if not (peer / "src/r2egym").is_dir():
        pytest.skip(f"R2E-Gym peer snapshot not found at {peer} (set NEXUS_R2EGYM_PEER)")
    return peer


def docker_status() -> tuple[bool, str]:
    """(ready, reason): a Docker engine answers and the offline base image exists (sandboxes need both)."""
    try:
        from env.images import BASE_IMAGE_TAG, docker_client, image_exists

        client = docker_client()
        client.ping()
    except Exception as exc:  # any failure to reach the engine means "not ready", with its reason
        return False, f"no Docker engine: {exc}"
    if not image_exists(client, BASE_IMAGE_TAG):
        return False, f"base image {BASE_IMAGE_TAG} missing (nexus-eval images build-base)"
    return True, ""


def pytest_collection_modifyitems(config, items):
    has_gpu = torch.cuda.is_available()
    for item in items:
        if "gpu" in item.keywords and not has_gpu:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA device"))


def run_task_episode(task, model, *, agent=None, grade: bool = True, seed: int = 0, **kwargs):
    """The one episode runner (``agent_runner.episode.run_episode``) on an already-loaded ``task`` with a given
    backend (a test double: scripted, oracle), as every CLI and worker episode runs."""
    from agent_runner.config import AgentConfig, EpisodeSpec
    from agent_runner.episode import run_episode

    spec = EpisodeSpec(
        task_id=task.instance_id, agent=agent or AgentConfig(), grade=grade, seed=seed, eviction={"method": "dense"}
    )
    return run_episode(spec, task=task, model=model, **kwargs)


# -- the real model preset (smollm2-135m), loaded once per test session ------------------------------------------


@pytest.fixture(scope="session")
def smollm2_path():
    """The converted folder (torch runs on one thread in tests: the fast choice on 2 cores)."""
    if not is_ready(SMOLLM2):
        if IN_CI:
            pytest.fail(f"required in CI: model {SMOLLM2} is not set up (run .ci/parts/35-models.sh)")
        try:
            ensure_preset(SMOLLM2)
        except ValueError as exc:
            require(False, f"cannot set up model {SMOLLM2} here: {exc}")
    return preset_path(SMOLLM2)


@pytest.fixture(scope="session")
def smollm2_host(smollm2_path):
    """The model host as a worker loads it (float32 on CPU, `nexus.prepare`d)."""
    return load_host(ModelSpec(name=SMOLLM2, device="cpu"))


@pytest.fixture(scope="session")
def smollm2_plain(smollm2_path):
    """The same weights through plain transformers: not prepared, its own attention and caches."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(smollm2_path, dtype=torch.float32).eval()
