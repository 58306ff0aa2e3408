"""One episode as a config: task x method x scope x protocol x seed, with the model, sampling and limits.

`EpisodeSpec` is what the CLI builds from flags and the service stores with every episode row; `build_model`
turns it into a backend (loading the model once per process and reusing the host); `run` is the whole
episode. Every bad input (unknown method, model path, suite, task) raises ValueError here, before any
container starts.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

import nexus
from agent_runner.agent import AgentConfig
from agent_runner.backends import Model, make_backend
from agent_runner.episode_core import run_episode
from agent_runner.model_host import ModelHost, ModelSpec, load_host
from agent_runner.records import EpisodeResult
from agent_runner.sampling import SamplingConfig

Backend = Literal["hf", "oracle", "openai"]

_HOSTS: dict[ModelSpec, ModelHost] = {}  # one loaded model per process, keyed by its spec


class EpisodeSpec(BaseModel):
    """Everything that determines one episode (stored whole with its result)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    suite: str | None = Field("mini", description="a bundled suite name or a folder of local tasks")
    tasks_file: str | None = Field(None, description="a JSON/JSONL/parquet file or HF dataset instead of a suite")
    task_id: str
    backend: Backend = "hf"
    model: ModelSpec = ModelSpec()
    method: str = "nexus"
    scope: str = "prefill_decode"
    protocol: Literal["true_eviction", "full_context"] = "true_eviction"
    density: float = 0.2
    budget_tokens: int | None = None
    block_size: int = 32
    window: int = 16
    method_params: dict[str, Any] = Field(default_factory=dict)
    seed: int = 0
    sampling: SamplingConfig = SamplingConfig()
    agent: AgentConfig = AgentConfig()
    openai: dict[str, Any] = Field(default_factory=dict, description="OpenAIConfig fields for backend=openai")
    grade: bool = True

    def eviction(self) -> nexus.EvictionConfig:
        return nexus.EvictionConfig(
            method=self.method,
            scope=self.scope,
            density=self.density,
            budget_tokens=self.budget_tokens,
            block_size=self.block_size,
            window=self.window,
            seed=self.seed,
            **self.method_params,
        )


def load_task(spec: EpisodeSpec):
    """The spec's task; ValueError naming the suite and the known ids if it is not there."""
    from env.tasks import load_suite, load_tasks

    tasks = load_tasks(spec.tasks_file) if spec.tasks_file else load_suite(spec.suite or "mini")
    for task in tasks:
        if task.instance_id == spec.task_id:
            return task
    known = ", ".join(t.instance_id for t in tasks[:20])
    raise ValueError(f"no task {spec.task_id!r} in {spec.tasks_file or spec.suite}; known: {known}")


def host_for(model: ModelSpec) -> ModelHost:
    """Load the model once per process (a Celery worker hosts one model for all its episodes)."""
    if model not in _HOSTS:
        _HOSTS.clear()  # one model at a time: a worker never holds two on its GPU
        _HOSTS[model] = load_host(model)
    return _HOSTS[model]


def build_model(spec: EpisodeSpec, task=None) -> Model:
    """The backend for `spec`, validated (eviction config, model, endpoint) before any container starts."""
    eviction = spec.eviction()  # validates method/scope/density even for backends that ignore it
    if spec.backend == "oracle":
        return make_backend("oracle", task=task)
    if spec.backend == "openai":
        if eviction.method != "dense":
            raise ValueError("the openai backend serves dense reference runs only (method=dense)")
        return make_backend(
            "openai",
            **{"max_tokens": spec.sampling.max_new_tokens, "temperature": spec.sampling.temperature, **spec.openai},
        )
    from agent_runner.backends.hf import HFBackend

    return HFBackend(
        host_for(spec.model),
        eviction=eviction,
        protocol=spec.protocol,
        sampling=spec.sampling,
        max_context_tokens=spec.agent.max_context_tokens,
    )


def run(spec: EpisodeSpec, **kwargs: Any) -> EpisodeResult:
    """Run one episode end to end (see agent_runner.episode_core.run_episode for the keyword hooks)."""
    task = load_task(spec)
    model = build_model(spec, task)
    model.reset(seed=spec.seed)
    agent = spec.agent.model_copy(update={"seed": spec.seed})
    result = run_episode(task, model, agent_config=agent, grade=spec.grade, **kwargs)
    result.config = {**result.config, "episode": spec.model_dump(mode="json")}
    return result
