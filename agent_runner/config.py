"""The runner's configs, defined once and importable without torch.

`ModelSpec` (which model the host loads), `SamplingConfig` (how a turn is decoded), `AgentConfig` (the agent
loop's limits), and `EpisodeSpec`, which composes them with a ``nexus.EvictionConfig`` into one episode.
The service's job spec (``workers.spec.JobSpec``) composes the same classes, and the episode config it stores
with every row is an ``EpisodeSpec`` dump, so a worker runs exactly what was submitted.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from nexus.config import EvictionConfig
from nexus.methods import check_method, check_scope

if TYPE_CHECKING:
    from env.tasks import Task

ProtocolName = Literal["true_eviction", "full_context"]
PROTOCOLS: tuple[str, ...] = ProtocolName.__args__  # type: ignore[attr-defined]
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
    max_new_tokens: int = Field(4096, ge=1, description="per-turn generation cap of the hf backend")


class AgentConfig(_Config):
    """Limits and formatting of one agent run (DeepSWE's evaluation values by default)."""

    max_steps: int = Field(100, ge=1, description="absolute turn limit (R2E max_steps_absolute)")
    soft_step_limit: int = Field(40, ge=1, description="the step budget shown as 'Steps Remaining'")
    max_context_tokens: int = Field(65536, ge=1, description="logical tokens (prompt + generated)")
    wall_time_s: float = Field(50_000.0, gt=0, description="model + env time for the whole run")
    max_format_errors: int | None = Field(10, ge=1, description="consecutive turns without a call; None: off")
    max_new_tokens: int | None = Field(None, ge=1, description="per-turn cap passed to the backend")
    seed: int = 0
    history: Literal["raw", "resynthesized"] = Field(
        "raw", description="assistant messages as generated (rLLM default) or R2E's thought + canonical call"
    )
    duplicate_params: Literal["last", "first"] = "last"


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

    def load_task(self) -> Task:
        """This episode's task; ``env.tasks.TaskNotFound`` (a ValueError) names the source and the known ids."""
        from env.tasks import find_task

        if self.tasks_file:
            return find_task(self.task_id, file=self.tasks_file, split=self.split)
        return find_task(self.task_id, suite=self.suite or "mini")
