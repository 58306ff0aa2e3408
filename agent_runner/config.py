"""The runner's configs, defined once and importable without torch.

`ModelSpec` (which model the host loads), `SamplingConfig` (how a turn is decoded), `AgentConfig` (the agent
loop's limits), and `EpisodeSpec`, which composes them with a ``nexus.EvictionConfig`` into one episode.
The service's job spec (``jobs.spec.JobSpec``) composes the same classes, and the episode config it stores
with every row is an ``EpisodeSpec`` dump, so a worker runs exactly what was submitted.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationInfo,
    field_serializer,
    field_validator,
    model_validator,
)

from agent_runner.backend_settings import ExpertConfig
from nexus.config import EvictionConfig
from nexus.methods import check_method, check_scope

if TYPE_CHECKING:
    from agent_runner.scaffold import Scaffold
    from env.tasks.loading import Task

ProtocolName = Literal["true_eviction", "full_context"]
PROTOCOLS: tuple[str, ...] = ProtocolName.__args__  # type: ignore[attr-defined]


def check_protocol(name: str) -> str:
    """`name` if it is a protocol; ValueError naming the choices otherwise."""
    if name not in PROTOCOLS:
        raise ValueError(f"unknown protocol {name!r}; use one of {', '.join(PROTOCOLS)}")
    return name


BackendName = Literal["expert", "hf", "openai", "oracle"]
#: a method / scope name, validated against ``nexus.methods`` (pydantic field types)
MethodName = Annotated[str, AfterValidator(lambda name: check_method(name, noun="method"))]
ScopeName = Annotated[str, AfterValidator(check_scope)]
TINY = "tiny"
#: a real trained model preset (agent_runner/real_models.py), fetched once by `nexus-eval setup`
SMOLLM2 = "smollm2-135m"

#: does a history render alike under both protocols (``agent_runner.dense_reuse.dense_rendering``, at planning)
DenseRendering = Literal["identical", "no_model", "differs", "unknown"]
#: the answers under which one dense episode stands for every protocol
SHARED_DENSE: frozenset[str] = frozenset({"identical", "no_model"})
#: backends with no model: what they do does not depend on how a history is rendered
NO_MODEL_BACKENDS: frozenset[str] = frozenset({"oracle", "expert"})
#: backends that run dense reference runs only: they hold no cache an eviction method could act on (``expert``
#: derives each action from the gold patch, ``openai``'s server keeps its own cache), and a run labelled with a
#: method would be a dense run under a false name. ``oracle`` and ``hf`` run every method (the oracle ignores it:
#: a pipeline check).
DENSE_ONLY_BACKENDS: frozenset[str] = frozenset({"expert", "openai"})


def check_backend_method(backend: str, method: str) -> None:
    """The one rule of which backend runs which method: ValueError naming both and what would run, when
    ``backend`` is dense-only (:data:`DENSE_ONLY_BACKENDS`) and ``method`` evicts. A job is refused at submit
    (``jobs.spec.JobSpec.check_backend_methods``); a run is refused before any container
    (``agent_runner.loaded_models.backend_for``)."""
    if backend in DENSE_ONLY_BACKENDS and method != "dense":
        raise ValueError(
            f"backend {backend!r} runs dense reference runs only, not {method!r}: use methods [dense] with it (its "
            "dense runs can be replayed under each method: nexus-eval replay), or backend hf for eviction methods"
        )


class _Config(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", protected_namespaces=())


class ModelSpec(_Config):
    """Which model to host and how."""

    name: str = Field(
        TINY,
        min_length=1,
        description=f"'{TINY}' (random weights), '{SMOLLM2}' (real, CPU-sized; `nexus-eval setup` fetches it), "
        "a Hugging Face id or a local path",
    )
    revision: str | None = Field(None, description="commit/tag of the weights; recorded with the results")
    dtype: str = Field("auto", description="auto (bf16 on GPU, fp32 on CPU) | bfloat16 | float16 | float32")
    device: str = Field("auto", description="auto | cpu | cuda | cuda:N")
    attn: str = Field("auto", description="auto (flash_attention_2 if installed on GPU, else sdpa) | sdpa | eager")
    weights_seed: int = Field(
        0, description="tiny preset: the random weights' init seed (part of the model, never the episode's seed)"
    )
    tiny_layers: int = Field(2, ge=1, description="tiny preset: number of decoder layers")

    @model_validator(mode="before")
    @classmethod
    def _legacy_seed(cls, data: Any) -> Any:
        """Stored configs before the rename called ``weights_seed`` ``seed``; read them, never write them."""
        if isinstance(data, dict) and "seed" in data:
            data = dict(data)
            data.setdefault("weights_seed", data.pop("seed"))
        return data


class SamplingConfig(_Config):
    """DeepSWE's evaluation used temperature 1.0 and a 64K context; top_p/top_k were left to the server."""

    temperature: float = Field(1.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=0, description="0 = off")
    max_new_tokens: int | None = Field(
        None, ge=1, description="per-turn generation cap, every backend; None (DeepSWE): the rest of the window"
    )


class AgentConfig(_Config):
    """Limits and formatting of one agent run (DeepSWE's evaluation values by default).

    It has no seed and no per-turn token cap: the episode's one ``seed`` (``EpisodeSpec.seed``) and the one
    ``SamplingConfig.max_new_tokens`` are those. Stored configs that still carry ``seed`` / ``max_new_tokens``
    (written before they were removed) are read by ``EpisodeSpec``, which drops or moves them."""

    max_steps: int = Field(100, ge=1, description="absolute turn limit (R2E max_steps_absolute)")
    soft_step_limit: int = Field(40, ge=1, description="the step budget shown as 'Steps Remaining'")
    max_context_tokens: int = Field(65536, ge=1, description="logical tokens (prompt + generated)")
    wall_time_s: float = Field(50_000.0, gt=0, description="model + env time for the whole run")
    max_format_errors: int | None = Field(10, ge=1, description="consecutive turns without a call; None: off")
    history: Literal["raw", "resynthesized"] = Field(
        "raw", description="assistant messages as generated (rLLM default) or R2E's thought + canonical call"
    )
    duplicate_params: Literal["last", "first"] = "last"
    prompts: str | None = Field(
        None,
        description="R2E-Gym's own prompt YAML, loaded at run time: a path, or 'r2egym:<name>' (a config of the "
        "installed r2egym package, or of r2egym_root); None: our own prompts. See docs/agent.md",
    )
    r2egym_root: str | None = Field(
        None,
        description="an R2E-Gym checkout's src/r2egym (or the checkout): 'r2egym:<name>' configs and the texts "
        "R2E-Gym keeps in Python are read from it first",
    )

    @field_validator("prompts", "r2egym_root")
    @classmethod
    def _not_blank(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is not None and not value.strip():
            raise ValueError(f"{info.field_name} is blank; leave it unset for the default")
        if info.field_name == "prompts" and value is not None and value.strip() == "r2egym:":
            raise ValueError("prompts='r2egym:' names no config; e.g. 'r2egym:edit_non_fn_calling'")
        return value

    def scaffold(self) -> Scaffold:
        """The prompts this config sends (``agent_runner.scaffold.load_scaffold``): loads and checks the R2E-Gym
        YAML when ``prompts`` is set (``agent_runner.scaffold.ScaffoldError``, a ValueError, names what is
        wrong). The files are read when an agent starts, not when the config is built, so a stored config stays
        valid where they are absent; call this early to fail before any container starts."""
        from agent_runner.scaffold import load_scaffold

        return load_scaffold(self.prompts, self.r2egym_root)


#: keys of the flat episode config stored before the eviction settings were nested (read, never written)
_LEGACY_EVICTION_KEYS = ("method", "scope", "density", "budget_tokens", "block_size", "window", "method_params")


#: OpenAIConfig fields that the episode already says once: they come from ``sampling`` and ``seed``
_OPENAI_FROM_EPISODE = {"max_tokens": "sampling.max_new_tokens", "temperature": "sampling.temperature", "seed": "seeds"}


def check_openai_fields(openai: dict[str, Any]) -> dict[str, Any]:
    """``openai`` unless it sets what the episode already says once (ValueError naming where it goes)."""
    doubled = sorted(set(openai) & set(_OPENAI_FROM_EPISODE))
    if doubled:
        where = ", ".join(f"openai.{k} -> {_OPENAI_FROM_EPISODE[k]}" for k in doubled)
        raise ValueError(f"openai sets {doubled}, which the job sets once elsewhere: {where}")
    return openai


def legacy_agent_fields(agent: dict[str, Any], sampling: Any) -> tuple[dict[str, Any], Any]:
    """A stored ``agent`` from before the seed and the token cap left it: its ``seed`` is dropped (what sampled
    then was this value, always 0, and the stored row keeps it), its ``max_new_tokens`` moves to ``sampling``
    when that has none (the smaller cap applied then)."""
    agent = dict(agent)
    agent.pop("seed", None)
    cap = agent.pop("max_new_tokens", None)
    if cap is not None and isinstance(sampling, dict | None):
        sampling = dict(sampling or {})
        own = sampling.get("max_new_tokens")
        sampling["max_new_tokens"] = cap if own is None else min(own, cap)
    return agent, sampling


class EpisodeSpec(_Config):
    """Everything that determines one episode (stored whole with its result).

    ``seed`` is the episode's one seed, stored once: the runner (``agent_runner.episode.run_episode``) resets the
    backend's sampler with it, and the eviction policy draws from it. The library's ``EvictionConfig`` carries a
    seed of its own, so ``eviction.seed`` is filled from ``seed`` when a spec is built or read back, never stored
    (a stored ``eviction`` leaves it out; one stored before this held the same number and still reads).

    An episode is built from a job (``jobs.spec.JobSpec.episode_config``), which holds the defaults: the fields a
    job sets (``suite``, ``backend``, ``protocol``, ``seed``, ``grade``) have none here, so none can drift from
    the job's. ``split`` and ``grade_route`` keep the value an episode stored before the field existed ran with.
    """

    suite: str | None = Field(description="a bundled suite name or a folder of local tasks; None with tasks_file")
    tasks_file: str | None = Field(None, description="a JSON/JSONL/parquet file or HF dataset instead of a suite")
    split: str = Field("test", description="the dataset split, for tasks_file")
    task_id: str
    backend: BackendName
    model: ModelSpec = ModelSpec()
    eviction: EvictionConfig = Field(description="the method and its settings; {}: the library's defaults")
    protocol: ProtocolName
    seed: int
    sampling: SamplingConfig = SamplingConfig()
    agent: AgentConfig = AgentConfig()
    openai: dict[str, Any] = Field(default_factory=dict, description="OpenAIConfig fields for backend=openai")
    expert: ExpertConfig = Field(
        ExpertConfig(), description="backend=expert: how much it explores (agent_runner.backends.expert)"
    )
    grade: bool
    grade_route: Literal["swebench", "r2e"] = Field(
        "swebench", description="R2E's SWE-bench rows: graded by swebench (official) or by R2E-Gym's in-loop reward"
    )

    @model_validator(mode="before")
    @classmethod
    def _seeded_eviction(cls, data: Any) -> Any:
        """Fill ``eviction`` with the episode's seed (its other fields: the library's defaults); read the older
        stored layouts too."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        legacy = {key: data.pop(key) for key in _LEGACY_EVICTION_KEYS if key in data}
        eviction = data.get("eviction", {})
        if isinstance(eviction, dict):  # without the episode's seed, the field's "required" error says so
            seeded = {"seed": data["seed"]} if "seed" in data else {}
            data["eviction"] = {**legacy, **seeded, **eviction}
        agent = data.get("agent")
        if isinstance(agent, dict) and ("seed" in agent or "max_new_tokens" in agent):
            data["agent"], sampling = legacy_agent_fields(agent, data.get("sampling"))
            if sampling is not None:
                data["sampling"] = sampling
        return data

    @field_serializer("eviction", mode="wrap")
    def _eviction_without_the_seed(self, eviction: EvictionConfig, handler: SerializerFunctionWrapHandler) -> Any:
        dumped = handler(eviction)
        dumped.pop("seed", None)  # the episode's ``seed`` is it: stored once, filled back by _seeded_eviction
        return dumped

    @model_validator(mode="after")
    def _consistent(self) -> EpisodeSpec:
        if self.suite is None and not self.tasks_file:
            raise ValueError("give suite or tasks_file: where the task comes from")
        if self.eviction.seed != self.seed:
            raise ValueError(f"eviction.seed ({self.eviction.seed}) must equal the episode's seed ({self.seed})")
        check_openai_fields(self.openai)
        return self

    def grade_config(self, job: str = "grade", episode: str | None = None, ceilings=None, worker: str | None = None):
        """The grading settings this episode asks for (``grading.GradeConfig``); ``job``, ``episode`` and ``worker``
        (the grade claim's holder) label the grading container (the service's ids, so a gone or superseded
        grader's container can be found and reaped); ``ceilings``: the operator's
        ``env.tasks.ceilings.GradingCeilings`` (None: the defaults)."""
        from env.grading import GradeConfig

        config = GradeConfig(r2e_swebench_route=self.grade_route, job=job, episode=episode, worker=worker)
        return config if ceilings is None else config.model_copy(update={"ceilings": ceilings})

    def task_source(self) -> dict[str, str | None]:
        """Where the task comes from, as ``env.tasks.loading.load_source``'s keywords (a file, else a suite)."""
        if self.tasks_file:
            return {"suite": None, "file": self.tasks_file, "split": self.split}
        return {"suite": self.suite, "file": None, "split": self.split}

    def load_task(self) -> Task:
        """This episode's task, its source loaded for it alone (a process that runs many episodes keeps the
        sources it loaded: ``env.tasks.task_cache.TaskCache``). ``env.tasks.loading.TaskNotFound`` (a ValueError) names
        the source and the known ids."""
        from env.tasks.loading import find_task

        return find_task(self.task_id, **self.task_source())
