"""Shared test plumbing.

Markers: `docker` (a real engine), `services` (real Redis + PostgreSQL on 127.0.0.1), `slow`, `gpu`.
Tests that need an outside part skip with a reason when it is missing on a developer's machine,
but under CI (`CI=true`) a missing part is a failure: CI starts everything, so a skip there would
hide a broken install step.
"""

from __future__ import annotations

import os

import pytest
import torch

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
