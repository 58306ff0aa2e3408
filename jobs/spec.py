"""``JobSpec``: what a user submits, frozen, validated and hashed, and its fan-out into episodes.

A job file (YAML) looks like this; every key has a default (the class's fields), and ``examples/`` holds the
job files for the common cases, each checked by ``tests/service/test_examples.py``::

    name: mini-dense-vs-nexus
    model: {name: Qwen/Qwen3-0.6B, revision: main}   # default: tiny (random weights, the real Qwen3 tokenizer)
    backend: hf                      # hf | openai | oracle | expert (oracle and expert ignore the model)
    methods: [dense, snapkv, nexus]  # default: [dense, nexus]
    scopes: [prefill_only, prefill_decode]       # default: [prefill_decode]
    protocols: [true_eviction, full_context]     # default: [true_eviction]
    density: 0.2
    eviction: {block_size: 32, window: 16}   # nexus.EvictionConfig's shared fields, for every method
    preset: paper                    # paper | reference | kvcache_factory (nexus/presets.py)
    method_params: {nexus: {walk_steps: 3}, snapkv: {window: 32, kernel_size: 5}}
    seeds: [0, 1, 2]                 # each seed samples its own episode: the sampler and the eviction policy
    limits: {max_steps: 100, soft_step_limit: 40, max_context_tokens: 65536}
    sampling: {temperature: 1.0, top_p: 1.0, top_k: 0, max_new_tokens: null}  # null: no per-turn cap
    tasks: {suite: mini, ids: ["argkit__*"]}     # default: every task of mini

**Command-line flags override a file** (``nexus-eval submit -f job.yaml --density 0.1`` stores 0.1): the
CLI turns each flag it was given into one override (:func:`apply_overrides`), set on top of the file, or on
top of these defaults without a file. A flag never given changes nothing.

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

import copy
import fnmatch
import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator, model_validator

from agent_runner.backend_settings import AllowedEndpoints, ExpertConfig, OpenAIConfig
from agent_runner.config import (
    NO_MODEL_BACKENDS,
    PROTOCOLS,
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
    check_openai_fields,
    legacy_agent_fields,
)
from nexus.config import EVICTION_DEFAULTS, SHARED_FIELDS, EvictionConfig
from nexus.methods import DENSE, check_method
from nexus.presets import DEFAULT_PRESET, PRESETS, check_preset, resolve, split_settings, stored_settings

_GLOB_CHARS = set("*?[")
#: the job ``nexus-eval run`` submits when it is given no file (shipped in the package)
QUICK_JOB_FILE = Path(__file__).resolve().parent / "bundled" / "quick.yaml"
AGENT_CASE_JOB_FILE = Path(__file__).resolve().parent / "bundled" / "agent_case.yaml"
#: the keys of a job's ``eviction`` mapping (density has its own top-level key)
EVICTION_KEYS: tuple[str, ...] = tuple(name for name in SHARED_FIELDS if name != "density")
_EVICTION = TypeAdapter(EvictionConfig)


class JobSpecError(ValueError):
    """A bad job file or spec. ``source`` is the file (or ``<spec>``); ``errors`` are (field, message) pairs."""

    def __init__(self, source: str, errors: list[tuple[str, str]]) -> None:
        self.source = source
        self.errors = errors
        lines = [f"{source}: field '{loc}': {msg}" if loc else f"{source}: {msg}" for loc, msg in errors]
        super().__init__("\n".join(lines))


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TaskSelection(_Frozen):
    """Where the tasks come from (exactly one of ``suite``/``file``) and which of them to run.

    ``ids``: exact task ids and/or glob patterns (``*``, ``?``, ``[...]``); ``None`` runs every task.
    """

    suite: str | None = Field(None, description="a bundled suite name (tasks/suites/<name>) or a task folder")
    file: str | None = Field(None, description="a JSON/JSONL/parquet task file or a Hugging Face dataset name")
    split: str = "test"
    ids: list[str] | None = None

    @model_validator(mode="after")
    def _one_source(self) -> TaskSelection:
        if (self.suite is None) == (self.file is None):
            raise ValueError("give exactly one of 'suite' or 'file'")
        if self.ids is not None:
            if not self.ids:
                raise ValueError("'ids' is empty; omit it to run every task")
            _no_duplicates("ids", self.ids)
        return self

    @property
    def source(self) -> str:
        return self.suite if self.suite is not None else str(self.file)

    @property
    def named(self) -> str:
        """What the user gave, as an error's source: ``suite 'mini'`` or the task file."""
        return f"suite {self.suite!r}" if self.suite is not None else f"task file {self.file}"

    def select(self, available: Sequence[str]) -> list[str]:
        """The selected ids, in ``available``'s order. Raises ``JobSpecError`` for an exact id that does not
        exist or a pattern that matches nothing (so a typo never silently shrinks a job)."""
        if self.ids is None:
            return list(available)
        present = set(available)
        missing = [p for p in self.ids if not _is_glob(p) and p not in present]
        empty = [p for p in self.ids if _is_glob(p) and not fnmatch.filter(available, p)]
        if missing or empty:
            errors = [("tasks.ids", f"no task {p!r} in {self.source}") for p in missing]
            errors += [("tasks.ids", f"pattern {p!r} matches no task in {self.source}") for p in empty]
            raise JobSpecError(self.named, errors)
        return [t for t in available if any(t == p or (_is_glob(p) and fnmatch.fnmatchcase(t, p)) for p in self.ids)]

    def load(self, ceilings: Any = None) -> list[Any]:
        """Load the source's tasks (``tasks.loading.Task`` objects) under the operator's grading ``ceilings``
        (``tasks.ceilings.GradingCeilings``; None: the defaults) and apply the selection."""
        from tasks.loading import load_source

        tasks = load_source(suite=self.suite, file=self.file, split=self.split, ceilings=ceilings)
        chosen = set(self.select([t.instance_id for t in tasks]))
        return [t for t in tasks if t.instance_id in chosen]


def _is_glob(pattern: str) -> bool:
    return bool(_GLOB_CHARS & set(pattern))


def _no_duplicates(name: str, values: Sequence[Any]) -> None:
    seen, dupes = set(), []
    for v in values:
        if v in seen:
            dupes.append(v)
        seen.add(v)
    if dupes:
        raise ValueError(f"'{name}' lists {dupes} more than once")


@dataclass(frozen=True)
class EpisodeKey:
    """One fanned-out episode (attempt 1). ``config`` is the merged episode config stored with it."""

    task_id: str
    method: str
    scope: str
    protocol: str
    seed: int
    config: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)


class JobSpec(_Frozen):
    """A whole job. Immutable; ``model_dump(mode="json")`` is what the ``jobs.config`` column stores."""

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
        _no_duplicates(info.field_name, values)
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
            raise ValueError(_plain(exc)) from None
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
                raise ValueError(f"method_params.{method}: {_plain(exc)}") from None
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
            raise JobSpecError(source, [(_loc(e["loc"]), _message(e)) for e in exc.errors()]) from None
        if spec.backend == "openai":  # a new job's endpoint (a stored one is checked again by its worker)
            try:
                spec.openai_config()
            except ValidationError as exc:
                raise JobSpecError(source, [(_loc(("openai", *e["loc"])), _message(e)) for e in exc.errors()]) from None
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
            raise JobSpecError(source, [(_loc(("openai", *e["loc"])), _message(e)) for e in exc.errors()]) from None
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


def read_job_file(path: str | Path) -> dict[str, Any]:
    """A YAML job file's mapping, not yet validated; ``JobSpecError`` names the file (and the YAML line)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise JobSpecError(str(path), [("", f"cannot read: {exc.strerror or exc}")]) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise JobSpecError(str(path), [("", f"invalid YAML: {where}{problem}")]) from None
    if data is None:
        raise JobSpecError(str(path), [("", "the file is empty")])
    if not isinstance(data, dict):
        raise JobSpecError(str(path), [("", f"a job spec must be a mapping, got {type(data).__name__}")])
    return data


def apply_overrides(
    data: Mapping[str, Any], overrides: Mapping[str, Any], *, defaults: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """``data`` (a job mapping) with each override set, in order: a dotted key sets one nested field
    (``limits.max_steps``: the rest of ``limits`` stays), a plain key replaces the whole value (``methods``,
    ``model``, ``tasks``). A nested field whose parent ``data`` lacks starts from that parent in ``defaults``
    (``tasks.ids`` alone keeps the default task source). ``data`` is not changed."""
    merged = copy.deepcopy(dict(data))
    for key, value in overrides.items():
        *parents, leaf = key.split(".")
        node, fallback = merged, defaults or {}
        for part in parents:
            child, fallback = node.get(part), fallback.get(part) if isinstance(fallback, Mapping) else None
            base = child if isinstance(child, dict) else fallback if isinstance(fallback, Mapping) else {}
            node[part] = child = copy.deepcopy(dict(base))
            node = child
        node[leaf] = value
    return merged


def _is_method(name: object) -> bool:
    """A known (or run-time registered) method name; anything else is reported on ``methods`` alone."""
    try:
        check_method(name)
    except (ValueError, TypeError):
        return False
    return True


def _plain(exc: Exception) -> str:
    """A ValueError's text, or a pydantic ValidationError's messages without pydantic's framing."""
    if isinstance(exc, ValidationError):
        return "; ".join(e["msg"].removeprefix("Value error, ") for e in exc.errors())
    return str(exc)


def _loc(loc: tuple[Any, ...]) -> str:
    return ".".join(str(part) for part in loc if part != "[key]")


def _message(error: dict[str, Any]) -> str:
    """pydantic's message, made specific for the vocabulary fields (unknown method and so on)."""
    loc, kind, value = error["loc"], error["type"], error.get("input")
    if kind == "literal_error" and loc and loc[0] == "protocols":
        return f"unknown protocol {value!r}; known: {', '.join(PROTOCOLS)}"
    if loc == ("density",) and kind in ("greater_than", "less_than_equal"):
        return f"density must be in (0, 1], got {value!r}"
    if kind == "extra_forbidden":
        moved = {"seed": "a job's seeds are its top-level 'seeds'", "max_new_tokens": "use sampling.max_new_tokens"}
        hint = f": {moved[loc[-1]]}" if loc[0] == "limits" and loc[-1] in moved else ""
        return f"unknown field {loc[-1]!r}{hint}"
    message = error["msg"].removeprefix("Value error, ")
    return f"{message} (got {value!r})" if kind not in ("missing", "value_error") and value is not None else message
