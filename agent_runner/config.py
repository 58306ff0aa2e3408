"""The runner's configs, defined once and importable without torch.

`ModelSpec` (which model the host loads), `SamplingConfig` (how a turn is decoded), `AgentConfig` (the agent
loop's limits), and `EpisodeSpec`, which composes them with a ``nexus.EvictionConfig`` into one episode.
The service's job spec (``workers.spec.JobSpec``) composes the same classes, and the episode config it stores
with every row is an ``EpisodeSpec`` dump, so a worker runs exactly what was submitted.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from nexus.config import EvictionConfig
from nexus.methods import check_method, check_scope

if TYPE_CHECKING:
    from agent_runner.scaffold import Scaffold
    from env.tasks import Task

ProtocolName = Literal["true_eviction", "full_context"]
PROTOCOLS: tuple[str, ...] = ProtocolName.__args__  # type: ignore[attr-defined]


def check_protocol(name: str) -> str:
    """`name` if it is a protocol; ValueError naming the choices otherwise."""
    if name not in PROTOCOLS:
        raise ValueError(f"unknown protocol {name!r}; use one of {', '.join(PROTOCOLS)}")
    return name


BackendName = Literal["hf", "openai", "oracle"]
#: a method / scope name, validated against ``nexus.methods`` (pydantic field types)
MethodName = Annotated[str, AfterValidator(lambda name: check_method(name, noun="method"))]
ScopeName = Annotated[str, AfterValidator(check_scope)]
TINY = "tiny"


class _Config(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", protected_namespaces=())


class ModelSpec(_Config):
    """Which model to host and how."""

    name: str = Field(TINY, min_length=1, description="'tiny', a Hugging Face id or a local path")
    revision: str | None = Field(None, description="commit/tag of the weights; recorded with the results")
    dtype: str = Field("auto", description="auto (bf16 on GPU, fp32 on CPU) | bfloat16 | float16 | float32")
    device: str = Field("auto", description="auto | cpu | cuda | cuda:N")
    attn: str = Field("auto", description="auto (flash_attention_2 if installed on GPU, else sdpa) | sdpa | eager")
    seed: int = Field(0, description="tiny preset: weight init seed")
    tiny_layers: int = Field(2, ge=1, description="tiny preset: number of decoder layers")


class SamplingConfig(_Config):
    """DeepSWE's evaluation used temperature 1.0 and a 64K context; top_p/top_k were left to the server."""

    temperature: float = Field(1.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=0, description="0 = off")
    max_new_tokens: int | None = Field(
        None, ge=1, description="per-turn generation cap of the hf backend; None: the rest of the context window"
    )


class AgentConfig(_Config):
    """Limits and formatting of one agent run (DeepSWE's evaluation values by default)."""

    max_steps: int = Field(100, ge=1, description="absolute turn limit (R2E max_steps_absolute)")
    soft_step_limit: int = Field(40, ge=1, description="the step budget shown as 'Steps Remaining'")
    max_context_tokens: int = Field(65536, ge=1, description="logical tokens (prompt + generated)")
    wall_time_s: float = Field(50_000.0, gt=0, description="model + env time for the whole run")
    max_format_errors: int | None = Field(10, ge=1, description="consecutive turns without a call; None: off")
    max_new_tokens: int | None = Field(
        None, ge=1, description="per-turn cap passed to the backend; None (DeepSWE): max_context_tokens - prompt"
    )
    seed: int = 0
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


class EpisodeSpec(_Config):
    """Everything that determines one episode (stored whole with its result).

    ``seed`` seeds the sampler, the agent and the eviction policy; ``eviction.seed`` always equals it.
    """

    suite: str | None = Field("mini", description="a bundled suite name or a folder of local tasks")
    tasks_file: str | None = Field(None, description="a JSON/JSONL/parquet file or HF dataset instead of a suite")
    split: str = Field("test", description="the dataset split, for tasks_file")
    task_id: str
    backend: BackendName = "hf"
    model: ModelSpec = ModelSpec()
    eviction: EvictionConfig = Field(description="the method and its settings; default nexus (see _seeded_eviction)")
    protocol: ProtocolName = "true_eviction"
    seed: int = 0
    sampling: SamplingConfig = SamplingConfig()
    agent: AgentConfig = AgentConfig()
    openai: dict[str, Any] = Field(default_factory=dict, description="OpenAIConfig fields for backend=openai")
    grade: bool = True
    grade_route: Literal["swebench", "r2e"] = Field(
        "swebench", description="R2E's SWE-bench rows: graded by swebench (official) or by R2E-Gym's in-loop reward"
    )

    @model_validator(mode="before")
    @classmethod
    def _seeded_eviction(cls, data: Any) -> Any:
        """Fill ``eviction`` (default: nexus) with the episode's seed; accept the older flat layout too."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        legacy = {key: data.pop(key) for key in _LEGACY_EVICTION_KEYS if key in data}
        eviction = data.get("eviction", {})
        if isinstance(eviction, dict):
            data["eviction"] = {**legacy, **eviction, "seed": eviction.get("seed", data.get("seed", 0))}
        return data

    @model_validator(mode="after")
    def _one_seed(self) -> EpisodeSpec:
        if self.eviction.seed != self.seed:
            raise ValueError(f"eviction.seed ({self.eviction.seed}) must equal the episode's seed ({self.seed})")
        return self

    def grade_config(self):
        """The grading settings this episode asks for (``env.grading.GradeConfig``)."""
        from env.grading import GradeConfig

        return GradeConfig(r2e_swebench_route=self.grade_route)

    def load_task(self) -> Task:
        """This episode's task; ``env.tasks.TaskNotFound`` (a ValueError) names the source and the known ids."""
        from env.tasks import find_task

        if self.tasks_file:
            return find_task(self.task_id, file=self.tasks_file, split=self.split)
        return find_task(self.task_id, suite=self.suite or "mini")
