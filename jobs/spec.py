"""``JobSpec``: what a user submits, frozen, validated and hashed, and its fan-out into episodes.

A job file (YAML), the flags set over it and the error a bad one raises are :mod:`jobs.job_file`; which tasks
it runs is :mod:`jobs.task_selection`. Every key has a default: this class's fields.

**Dense runs once per (task, seed, protocol), not once per cell.** Dense evicts nothing, so its result cannot
depend on the scope: its episode is stored under the first listed scope, and ``results.compare`` reuses it for
the dense column of every scope's row (marked as reused). The protocol is another matter: under full context
the chat template re-renders the history each turn, and Qwen3's (DeepSWE's) drops earlier ``<think>`` blocks,
so dense under full context is a different computation from dense under true eviction. Planning
(``jobs.submit.plan_job``) therefore asks ``agent_runner.dense_reuse.dense_rendering`` once per job and stores
its answer in ``dense_rendering``: only where the model's template renders a multi-turn history with a reasoning
block identically both ways (checked on a rendered two-turn conversation), or the backend has no model
(``oracle``, ``expert``), does one dense episode, under the first listed protocol, stand for every protocol; for
``differs`` and ``unknown`` (``openai``: the server renders, unseen) dense runs under each protocol, and compare
pairs each protocol's rows with their own protocol's dense. Set ``dense_per_cell: true`` to run dense in every
scope x protocol cell anyway (e.g. to measure run-to-run noise).

The parts are the runner's own configs (``agent_runner.config``): ``model`` is a ``ModelSpec``, ``limits`` an
``AgentConfig``, ``sampling`` a ``SamplingConfig``, and each episode an ``EpisodeSpec`` holding the method's
``nexus.EvictionConfig``. None of them imports torch, so validating a job does not either.

**Per-method settings.** ``method_params[m]`` holds method ``m``'s own hyperparameters and any of the
shared fields it sets for itself (``window``, ``block_size``, ``slack_blocks``, ``budget_tokens``). A
``preset`` fills every method's settings first (``nexus.presets``); the job's ``method_params`` override
single values. The validated spec holds the *resolved* settings of every method, so the stored job config
says exactly what ran even if a preset or a default changes later. A name a method does not have is an
error naming the method and the field; a bad value is found by ``check_with_library`` (it builds each
policy, so it imports torch), which ``nexus-eval submit`` and ``run`` call before anything is stored.

``config_hash()`` is the sha256 of the canonical JSON of the spec without ``name`` and with set-like lists
(methods, scopes, protocols, seeds, task ids) sorted: two submissions that would run the same episodes with
the same settings hash the same.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator, model_validator

from agent_runner.backend_settings import AllowedEndpoints, ExpertConfig, OpenAIConfig
from agent_runner.config import (
    NO_MODEL_BACKENDS,
    SHARED_DENSE,
    AgentConfig,
    BackendName,
    DenseRendering,
    EpisodeSpec,
    MethodName,
    ModelSpec,
    ProtocolName,
    SamplingConfig,
    ScopeName,
    check_backend_method,
    check_openai_fields,
    legacy_agent_fields,
)
from jobs.job_file import JobSpecError, apply_overrides, field_errors, plain_message, read_job_file
from jobs.task_selection import TaskSelection, no_duplicates
from nexus.config import EVICTION_DEFAULTS, SHARED_FIELDS, EvictionConfig
from nexus.methods import DENSE, check_method
from nexus.presets import DEFAULT_PRESET, PRESETS, check_preset, resolve, split_settings, stored_settings

#: the keys of a job's ``eviction`` mapping (density has its own top-level key)
EVICTION_KEYS: tuple[str, ...] = tuple(name for name in SHARED_FIELDS if name != "density")
_EVICTION = TypeAdapter(EvictionConfig)


@dataclass(frozen=True)
class EpisodeKey:
    """One fanned-out episode (attempt 1). ``config`` is the merged episode config stored with it."""

    task_id: str
    method: str
    scope: str
    protocol: str
    seed: int
    config: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)


class JobSpec(BaseModel):
    """A whole job. Immutable; ``model_dump(mode="json")`` is what the ``jobs.config`` column stores."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str | None = Field(None, max_length=200)
    model: ModelSpec = ModelSpec()
    backend: BackendName = "hf"
    # method, scope, density and seed: the library's defaults (nexus.EvictionConfig's fields, defined there once)
    methods: list[MethodName] = Field(default_factory=lambda: [DENSE, EVICTION_DEFAULTS["method"]], min_length=1)
    scopes: list[ScopeName] = Field(default_factory=lambda: [EVICTION_DEFAULTS["scope"]], min_length=1)
    protocols: list[ProtocolName] = Field(default_factory=lambda: ["true_eviction"], min_length=1)
    density: float = Field(EVICTION_DEFAULTS["density"], gt=0, le=1, description="kept fraction of the logical tokens")
    eviction: dict[str, Any] = Field(
        default_factory=dict,
        validate_default=True,
        description=f"EvictionConfig fields shared by every method: {', '.join(EVICTION_KEYS)}",
    )
    preset: str = Field(DEFAULT_PRESET, description=f"named per-method settings: {', '.join(PRESETS)}")
    method_params: dict[MethodName, dict[str, Any]] = Field(
        default_factory=dict, description="per method: its hyperparameters and shared-field overrides (resolved)"
    )
    seeds: list[int] = Field(default_factory=lambda: [EVICTION_DEFAULTS["seed"]], min_length=1)
    limits: AgentConfig = AgentConfig()
    sampling: SamplingConfig = SamplingConfig()
    tasks: TaskSelection = TaskSelection(suite="mini")
    openai: dict[str, Any] = Field(default_factory=dict, description="OpenAIConfig fields for backend=openai")
    expert: ExpertConfig = Field(
        ExpertConfig(), description="backend=expert: how much it explores (agent_runner.backends.expert)"
    )
    grade: bool = True
    grade_route: Literal["swebench", "r2e"] = Field(
        "swebench", description="R2E's SWE-bench rows: graded by swebench (official) or by R2E-Gym's in-loop reward"
    )
    dense_per_cell: bool = False
    dense_rendering: DenseRendering | None = Field(
        None,
        description="set by planning (jobs.submit.plan_job), replacing any value given: whether the model renders a "
        "history alike under both protocols (agent_runner.dense_reuse); None: not checked (one dense, as before)",
    )

    @field_validator("methods", "scopes", "protocols", "seeds")
    @classmethod
    def _unique(cls, values: list[Any], info: Any) -> list[Any]:
        no_duplicates(info.field_name, values)
        return values

    @model_validator(mode="before")
    @classmethod
    def _resolve_presets(cls, data: Any) -> Any:
        """Fill ``method_params`` with every listed method's resolved settings (preset, then overrides).
        Anything malformed is left for the field validators to report."""
        if not isinstance(data, dict):
            return data
        preset, methods, given = data.get("preset", DEFAULT_PRESET), data.get("methods"), data.get("method_params")
        given = {} if given is None else given
        if preset not in PRESETS or not isinstance(methods, list) or not isinstance(given, dict):
            return data
        resolved = {}
        for method in methods:
            own = given.get(method) if isinstance(method, str) else None
            # an unknown method is reported once, on ``methods`` (not again on a method_params entry never written)
            if _is_method(method) and (own is None or isinstance(own, dict)):
                try:
                    resolved[method] = resolve(method, preset, own)
                except ValueError as exc:
                    raise ValueError(f"method_params.{exc}") from None
        # entries for methods not listed (or malformed) stay as given, for the validators to report
        return {**data, "method_params": {**resolved, **{k: v for k, v in given.items() if k not in resolved}}}

    @field_validator("preset")
    @classmethod
    def _known_preset(cls, value: str) -> str:
        return check_preset(value)

    @field_validator("eviction")
    @classmethod
    def _shared_eviction_fields(cls, values: dict[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(values) - set(EVICTION_KEYS))
        if unknown:
            hint = " (density has its own top-level key)" if "density" in unknown else ""
            raise ValueError(f"unknown field(s) {unknown}; known: {', '.join(EVICTION_KEYS)}{hint}")
        try:  # the same checks as every method's EvictionConfig, without torch
            _EVICTION.validate_python({**values, "method": DENSE})
        except ValidationError as exc:
            raise ValueError(plain_message(exc)) from None
        # stored whole (the library's defaults filled in), so two jobs compare field by field
        return {**{name: EVICTION_DEFAULTS[name] for name in EVICTION_KEYS}, **values}

    @model_validator(mode="after")
    def _consistent(self) -> JobSpec:
        stray = [m for m in self.method_params if m not in self.methods]
        if stray:
            raise ValueError(f"method_params has {stray}, which are not in methods {self.methods}")
        check_openai_fields(self.openai)
        for method in self.methods:  # a method's own window / slack / block size, checked without torch
            try:
                self.eviction_config(method, self.scopes[0], self.seeds[0])
            except ValueError as exc:  # pydantic's ValidationError included
                raise ValueError(f"method_params.{method}: {plain_message(exc)}") from None
        return self

    # --- construction -------------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, data: Any, *, source: str = "<spec>") -> JobSpec:
        """Validate ``data``; errors become one ``JobSpecError`` naming ``source`` and each bad field."""
        if not isinstance(data, dict):
            raise JobSpecError(source, [("", f"a job spec must be a mapping, got {type(data).__name__}")])
        try:
            spec = cls.model_validate(data)
        except ValidationError as exc:
            raise JobSpecError(source, field_errors(exc)) from None
        if spec.backend == "openai":  # a new job's endpoint (a stored one is checked again by its worker)
            try:
                spec.openai_config()
            except ValidationError as exc:
                raise JobSpecError(source, field_errors(exc, "openai")) from None
        return spec

    @classmethod
    def from_stored(cls, config: Mapping[str, Any]) -> JobSpec:
        """A job as the ``jobs.config`` column holds it, written by this or an earlier release: a stored
        ``model: null`` (oracle jobs) reads as the default model, and ``limits.seed`` / ``limits.max_new_tokens``
        (removed: the job's ``seeds`` and ``sampling.max_new_tokens`` are the only ones) are dropped / moved as
        ``EpisodeSpec`` reads them; a method's settings stored before one of them existed read as what they ran
        with (``nexus.presets.stored_settings``). A file or flags with those keys are errors instead (``from_dict``)."""
        data = dict(config)
        if data.get("model", ()) is None:
            data.pop("model")
        if isinstance(data.get("method_params"), dict):  # settings added since it was stored: what it ran with
            data["method_params"] = {m: stored_settings(m, p or {}) for m, p in data["method_params"].items()}
        if isinstance(data.get("limits"), dict):
            data["limits"], sampling = legacy_agent_fields(data["limits"], data.get("sampling"))
            if sampling is not None:
                data["sampling"] = sampling
        return cls.model_validate(data)

    @classmethod
    def from_yaml(cls, path: str | Path) -> JobSpec:
        """Load a YAML job file. Errors name the file and the field (or the YAML line)."""
        return cls.from_dict(read_job_file(path), source=str(path))

    @classmethod
    def load(cls, path: str | Path | None = None, overrides: Mapping[str, Any] | None = None) -> JobSpec:
        """The job of ``path`` (None: every default) with ``overrides`` set on top (:func:`apply_overrides`).
        Errors name the file, the overrides (``job.yaml with density=0.1``) and the field."""
        data = read_job_file(path) if path is not None else {}
        source = str(path) if path is not None else "<defaults>"
        if overrides:
            source += " with " + ", ".join(f"{key}={value!r}" for key, value in overrides.items())
        defaults = cls().model_dump(mode="json", exclude_none=True)
        return cls.from_dict(apply_overrides(data, overrides or {}, defaults=defaults), source=source)

    def check_with_library(self, *, source: str = "<spec>") -> None:
        """Build each method's policy so a bad ``method_params`` value (an out-of-range hyperparameter, a
        budget below what the method must keep) fails before anything is enqueued. Imports torch.
        Each error names ``method_params.<method>.<field>`` where the policy says which field."""
        from nexus.policies.base import ParamError

        errors = []
        for method in self.methods:
            try:
                _ = self.eviction_config(method, self.scopes[0], self.seeds[0]).policy
            except ParamError as exc:
                errors.append((f"method_params.{method}.{exc.field}", str(exc)))
            except (TypeError, ValueError) as exc:
                errors.append((f"method_params.{method}", str(exc)))
        if errors:
            raise JobSpecError(source, errors)

    def check_backend_methods(self, *, source: str = "<spec>") -> None:
        """Refuse a job whose backend cannot run one of its methods (``agent_runner.config.check_backend_method``:
        ``expert`` and ``openai`` run dense only): ``JobSpecError`` naming ``methods``, what was refused and what
        would run. Every submission is checked here (``jobs.submit.plan_job``), before anything is stored.

        Not a validator of the spec itself: a stored job is read back whatever it held (``from_stored``), and a
        replay extends an expert job's spec to the methods it replays its dense runs under (``jobs.variants``)."""
        refused = []
        for method in self.methods:
            try:
                check_backend_method(self.backend, method)
            except ValueError as exc:
                refused.append(("methods", str(exc)))
        if refused:
            raise JobSpecError(source, refused)

    def openai_config(self) -> OpenAIConfig:
        """``backend=openai``: the endpoint settings as the backend reads them (pydantic's ValidationError when
        ``openai`` holds what ``OpenAIConfig`` refuses: an unknown field, a base_url with credentials or a query)."""
        return OpenAIConfig(**self.openai)

    def check_endpoint(self, allowed: AllowedEndpoints, *, source: str = "<spec>") -> None:
        """``backend=openai``: refuse an endpoint the operator's allow-lists do not allow (``JobSpecError`` naming
        ``openai.base_url`` / ``openai.api_key_env``; ``agent_runner.backend_settings.AllowedEndpoints.check``). Other
        backends send nothing anywhere: nothing to check."""
        if self.backend != "openai":
            return
        try:
            allowed.check(self.openai_config())
        except ValidationError as exc:
            raise JobSpecError(source, field_errors(exc, "openai")) from None
        except ValueError as exc:
            raise JobSpecError(source, [(f"openai.{getattr(exc, 'field', '')}".rstrip("."), str(exc))]) from None

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json", exclude_none=True), sort_keys=False)

    # --- identity -----------------------------------------------------------------------------------
    def canonical_json(self) -> str:
        """Sorted-key, whitespace-free JSON of the spec as hashed (see the module docstring)."""
        data = self.model_dump(mode="json", exclude={"name"})
        for key in ("methods", "scopes", "protocols", "seeds"):
            data[key] = sorted(data[key])
        if data["tasks"]["ids"] is not None:
            data["tasks"]["ids"] = sorted(data["tasks"]["ids"])
        return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)

    def config_hash(self) -> str:
        return hashlib.sha256(self.canonical_json().encode("utf-8")).hexdigest()

    # --- fan-out ------------------------------------------------------------------------------------
    @property
    def dense_shared_across_protocols(self) -> bool:
        """Whether one dense episode stands for every protocol (see the module docstring): one protocol, a backend
        with no model, or a model whose template planning found renders a history alike both ways. A spec that was
        never planned (``dense_rendering`` None: a job stored before the check, or a spec fanned out by hand) keeps
        the plan jobs had before the check, one dense for every protocol, unchecked (compare's note says so);
        ``jobs.submit.plan_job``, the one path a submission takes, always plans it."""
        if len(self.protocols) == 1 or self.backend in NO_MODEL_BACKENDS or self.dense_rendering is None:
            return True
        return self.dense_rendering in SHARED_DENSE

    def cells(self, method: str) -> list[tuple[str, str]]:
        """The (scope, protocol) cells ``method`` runs in: all of them; for dense the first scope under each
        protocol, or under the first protocol alone when it stands for every one (see the module docstring)."""
        every = [(s, p) for s in self.scopes for p in self.protocols]
        if method != DENSE or self.dense_per_cell:
            return every
        if self.dense_shared_across_protocols:
            return every[:1]
        return [(self.scopes[0], p) for p in self.protocols]

    def episodes(self, available_task_ids: Iterable[str]) -> list[EpisodeKey]:
        """Fan out task x method x (scope, protocol) x seed over the selected tasks, in that nesting order.

        ``available_task_ids``: the ids the task source holds (the selection is applied here)."""
        tasks = self.tasks.select(list(available_task_ids))
        return [
            EpisodeKey(
                task,
                method,
                scope,
                protocol,
                seed,
                config=self.episode_config(task, method, scope, protocol, seed).model_dump(mode="json"),
            )
            for task in tasks
            for method in self.methods
            for scope, protocol in self.cells(method)
            for seed in self.seeds
        ]

    def eviction_config(self, method: str, scope: str, seed: int) -> EvictionConfig:
        """``method``'s ``nexus.EvictionConfig`` in this job (validated without torch; its policy is built on
        first use)."""
        shared, own = split_settings(self.method_params.get(method, {}))
        settings = {"method": method, "scope": scope, "density": self.density, "seed": seed, **self.eviction, **shared}
        return _EVICTION.validate_python({**settings, "method_params": own})

    def episode_config(self, task_id: str, method: str, scope: str, protocol: str, seed: int) -> EpisodeSpec:
        """The one episode's ``EpisodeSpec``; its JSON dump is stored whole in ``episodes.config``, and a
        worker runs ``EpisodeSpec.model_validate(config)``."""
        return EpisodeSpec(
            suite=self.tasks.suite,
            tasks_file=self.tasks.file,
            split=self.tasks.split,
            task_id=task_id,
            backend=self.backend,
            model=self.model,
            eviction=self.eviction_config(method, scope, seed),
            protocol=protocol,
            seed=seed,
            sampling=self.sampling,
            agent=self.limits,
            openai=dict(self.openai),
            expert=self.expert,
            grade=self.grade,
            grade_route=self.grade_route,
        )


def _is_method(name: object) -> bool:
    """A known (or run-time registered) method name; anything else is reported on ``methods`` alone."""
    try:
        check_method(name)
    except (ValueError, TypeError):
        return False
    return True
