"""Removing sandbox containers nobody will use again: those past their TTL (or older than asked), or exited.

A container's owner may die without closing it (a killed worker, a restarted Docker engine); its keep-alive
ends at its TTL, and these sweeps remove what is left, by the labels `env.sandbox.config.episode_labels` set.
"""

from __future__ import annotations

import time

from env.sandbox.config import LABEL_PREFIX


def reap(older_than_s: float | None = None, label_filter: dict[str, str] | None = None, *, client=None) -> int:
    """Remove nexus-eval containers that are past their TTL (or older than `older_than_s`), or exited.

    `label_filter` narrows to e.g. `{"nexus-eval.job": "42"}`. Returns how many were removed.
    """
    import docker

    client = client or docker.from_env(timeout=120)
    filters = [f"{LABEL_PREFIX}.created"] + [f"{k}={v}" for k, v in (label_filter or {}).items()]
    expired = []
    now = time.time()
    for container in client.containers.list(all=True, ignore_removed=True, filters={"label": filters}):
        labels = container.labels
        try:
            age = now - float(labels.get(f"{LABEL_PREFIX}.created", "0"))
            ttl = float(labels.get(f"{LABEL_PREFIX}.ttl", "0"))
        except ValueError:
            age, ttl = float("inf"), 0.0
        limit = older_than_s if older_than_s is not None else ttl
        if age >= limit or container.status in ("exited", "dead"):
            expired.append(container)
    return remove_containers(expired)


def remove_containers(containers) -> int:
    """Force-remove `containers`; one already gone (another sweep got there first) is not counted. Returns how
    many were removed."""
    import docker

    removed = 0
    for container in containers:
        try:
            container.remove(force=True)
            removed += 1
        except docker.errors.NotFound:
            pass
    return removed
