"""One episode from its config: `build_model` turns an `EpisodeSpec` into a backend, `run` is the whole episode.

`EpisodeSpec` (``agent_runner.config``) is what the CLI builds from flags and the service stores with every
episode row. `build_model` loads the model once per process and reuses the host. Every bad input (unknown
method, model path, suite, task) raises ValueError here, before any container starts.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from agent_runner.backends import Model, make_backend
from agent_runner.config import EpisodeSpec, ModelSpec
from agent_runner.episode_core import run_episode
from agent_runner.model_host import ModelHost, load_host
from agent_runner.records import EpisodeResult
from env.tasks import Task

if TYPE_CHECKING:
    from agent_runner.engine import DecodeEngine

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


def engine_for(host: ModelHost, rows: int) -> DecodeEngine:
    """The process's decode engine for `host`, decoding up to `rows` episodes together."""
    from agent_runner.engine import DecodeEngine

    with _LOCK:
        engine = _ENGINES.get(id(host.model))
        if engine is None or engine.max_rows != rows:
            if engine is not None:
                engine.close()
            engine = _ENGINES[id(host.model)] = DecodeEngine(host.model, host.device, max_rows=rows)
        return engine


def build_model(spec: EpisodeSpec, task: Task | None = None, *, batch_rows: int = 1) -> Model:
    """The backend for `spec`, validated (eviction config, model, endpoint) before any container starts.

    batch_rows > 1: the hf backend's turns go through the process's `DecodeEngine`, decoded together with
    up to `batch_rows` - 1 other episodes' turns (a multi-episode worker; see agent_runner/engine.py)."""
    _ = spec.eviction.policy  # the method's own parameters, even for backends that ignore the cache
    if spec.backend == "oracle":
        return make_backend("oracle", task=task)
    if spec.backend == "openai":
        if spec.eviction.method != "dense":
            raise ValueError("the openai backend serves dense reference runs only (method=dense)")
        settings = {"max_tokens": spec.sampling.max_new_tokens, "temperature": spec.sampling.temperature}
        return make_backend("openai", **{**settings, **spec.openai})
    from agent_runner.backends.hf import HFBackend

    if batch_rows < 1:
        raise ValueError(f"batch_rows must be >= 1, got {batch_rows}")
    host = host_for(spec.model)
    return HFBackend(
        host,
        engine=engine_for(host, batch_rows) if batch_rows > 1 else None,
        eviction=spec.eviction,
        protocol=spec.protocol,
        sampling=spec.sampling,
        max_context_tokens=spec.agent.max_context_tokens,
    )


def run(spec: EpisodeSpec, **kwargs: Any) -> EpisodeResult:
    """Run one episode end to end (see agent_runner.episode_core.run_episode for the keyword hooks)."""
    task = spec.load_task()
    model = build_model(spec, task)
    model.reset(seed=spec.seed)
    agent = spec.agent.model_copy(update={"seed": spec.seed})
    result = run_episode(task, model, agent_config=agent, grade=spec.grade, **kwargs)
    result.config = {**result.config, "episode": spec.model_dump(mode="json")}
    return result
