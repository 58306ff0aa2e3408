"""The process's loaded model: one ``ModelHost`` (and its batched decode engine) per worker process.

A worker hosts one model for all its episodes: :func:`host_for` loads it on first use and reuses it, and
:func:`backend_for` turns an ``EpisodeSpec`` into the backend an episode talks to. Every bad input (unknown
method, model path, endpoint settings) raises ValueError here, before any container starts.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from agent_runner.backends import Model, make_backend
from agent_runner.config import EpisodeSpec, ModelSpec, check_backend_method
from agent_runner.model_host import ModelHost, load_host

if TYPE_CHECKING:
    from agent_runner.engine import DecodeEngine
    from env.tasks.loading import Task

_HOSTS: dict[ModelSpec, ModelHost] = {}  # one loaded model per process, keyed by its spec
_ENGINES: dict[int, DecodeEngine] = {}  # id(host.model) -> the engine batching that model's episodes
_LOCK = threading.Lock()  # episodes of a multi-episode worker ask for the host from several threads at once


def host_for(model: ModelSpec) -> ModelHost:
    """Load the model once per process (a Celery worker hosts one model for all its episodes)."""
    with _LOCK:
        if model not in _HOSTS:
            for engine in _ENGINES.values():
                engine.close()
            _ENGINES.clear()
            _HOSTS.clear()  # one model at a time: a worker never holds two on its GPU
            _HOSTS[model] = load_host(model)
        return _HOSTS[model]


def engine_for(host: ModelHost, episodes_per_gpu: int) -> DecodeEngine:
    """The process's decode engine for `host`, decoding up to `episodes_per_gpu` episodes together."""
    from agent_runner.engine import DecodeEngine

    with _LOCK:
        engine = _ENGINES.get(id(host.model))
        if engine is None or engine.max_rows != episodes_per_gpu:
            if engine is not None:
                engine.close()
            engine = _ENGINES[id(host.model)] = DecodeEngine(host.model, host.device, max_rows=episodes_per_gpu)
        return engine


def backend_for(spec: EpisodeSpec, task: Task | None = None, *, episodes_per_gpu: int = 1) -> Model:
    """The backend for `spec`, validated (eviction config, model, endpoint) before any container starts.

    episodes_per_gpu > 1: the hf backend's turns go through the process's `DecodeEngine`, decoded together
    with up to `episodes_per_gpu` - 1 other episodes' turns (a multi-episode worker; agent_runner/engine.py).
    The hf backend starts seeded with ``spec.seed``; the episode runner resets every backend with it too."""
    _ = spec.eviction.policy  # the method's own parameters, even for backends that ignore the cache
    check_backend_method(spec.backend, spec.eviction.method)  # a stored job from before submit refused it
    if spec.backend == "oracle":
        return make_backend("oracle", task=task)
    if spec.backend == "expert":
        return make_backend("expert", task=task, config=spec.expert)
    if spec.backend == "openai":
        settings = {"max_tokens": spec.sampling.max_new_tokens, "temperature": spec.sampling.temperature}
        return make_backend("openai", **{**spec.openai, **settings})
    from agent_runner.backends.hf import HFBackend

    if episodes_per_gpu < 1:
        raise ValueError(f"episodes_per_gpu must be >= 1, got {episodes_per_gpu}")
    host = host_for(spec.model)
    return HFBackend(
        host,
        engine=engine_for(host, episodes_per_gpu) if episodes_per_gpu > 1 else None,
        eviction=spec.eviction,
        protocol=spec.protocol,
        sampling=spec.sampling,
        max_context_tokens=spec.agent.max_context_tokens,
    )
