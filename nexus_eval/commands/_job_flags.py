"""The job flags ``submit``, ``run`` and ``episode`` share: declared once, every one optional (``submit`` and
``run`` take them all as one :class:`JobFlags`, ``episode`` the options it needs).

A flag that is given becomes one override (``jobs.job_file.apply_overrides``) set on top of the job file
(``--file``), or of the bundled quick job (``run``), or of the job defaults (``submit``); a flag that is not
given changes nothing. So the defaults live in one place, ``jobs.spec.JobSpec``, and a file is never
silently ignored: ``submit -f job.yaml --density 0.1`` stores 0.1.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from jobs.job_file import QUICK_JOB_FILE
from jobs.spec import JobSpec  # pydantic only, no torch
from nexus_eval.commands._common import csv_list, fail, service_settings
from nexus_eval.commands._flag_group import flag

if TYPE_CHECKING:
    from jobs.submit import PlannedJob

_D = JobSpec()  # each flag's help names the job default it overrides, read from the one place it is defined
_QUICK = JobSpec.load(QUICK_JOB_FILE)  # and, on `run`, what the bundled quick job sets instead (without --file)


def _csv(values: list) -> str:
    return ",".join(str(v) for v in values)


def _default(value: Callable[[JobSpec], object], quick: bool) -> str:
    """The default a flag overrides, as its help says it: the job default; on ``run`` (``quick``) the bundled quick
    job's value first where it sets another (what applies without --file)."""
    if quick and value(_QUICK) != value(_D):
        return f"quick job: {value(_QUICK)}; with --file: the file's, else {value(_D)}"
    return f"job default: {value(_D)}"


def _options(quick: bool) -> dict[str, Any]:
    """Each override flag's option, its help naming the default that applies (:func:`_default`)."""

    def d(value: Callable[[JobSpec], object]) -> str:
        return _default(value, quick)

    def ids(spec: JobSpec) -> str:
        return "every task" if spec.tasks.ids is None else _csv(spec.tasks.ids)

    return {
        "name": typer.Option(None, help="a name for the job"),
        "model": typer.Option(
            None,
            help="'tiny' (random weights), 'smollm2-135m' (a real trained model), a Hugging Face id or a local path "
            f"({d(lambda j: j.model.name)})",
        ),
        "backend": typer.Option(None, help=f"hf | oracle | expert | openai ({d(lambda j: j.backend)})"),
        "methods": typer.Option(
            None, "--methods", help=f"comma-separated eviction methods ({d(lambda j: _csv(j.methods))})"
        ),
        "scopes": typer.Option(
            None, help=f"comma-separated: prefill_only,prefill_decode ({d(lambda j: _csv(j.scopes))})"
        ),
        "protocols": typer.Option(
            None, help=f"comma-separated: true_eviction,full_context ({d(lambda j: _csv(j.protocols))})"
        ),
        "density": typer.Option(None, help=f"kept fraction of the logical tokens ({d(lambda j: j.density)})"),
        "preset": typer.Option(
            None, help=f"per-method settings: paper | reference | kvcache_factory ({d(lambda j: j.preset)})"
        ),
        "seeds": typer.Option(
            None, help=f"comma-separated seeds; each samples its own episode ({d(lambda j: _csv(j.seeds))})"
        ),
        "suite": typer.Option(
            None,
            help=f"bundled suite name or task folder; replaces the job's task source ({d(lambda j: j.tasks.suite)})",
        ),
        "tasks": typer.Option(None, "--tasks", help=f"comma-separated task ids or globs ({d(ids)})"),
        "max_steps": typer.Option(None, "--max-steps", help=f"absolute turn limit ({d(lambda j: j.limits.max_steps)})"),
        "max_new_tokens": typer.Option(
            None,
            "--max-new-tokens",
            help=f"per-turn generation cap ({d(lambda j: j.sampling.max_new_tokens or 'none')})",
        ),
        "max_context_tokens": typer.Option(
            None, "--max-context-tokens", help=f"logical tokens ({d(lambda j: j.limits.max_context_tokens)})"
        ),
        "temperature": typer.Option(None, help=f"sampling temperature ({d(lambda j: j.sampling.temperature)})"),
    }


_SUBMIT = _options(quick=False)
FILE = typer.Option(None, "--file", "-f", help="a YAML job file (see examples/); flags given as well override it")
NAME = _SUBMIT["name"]
MODEL = _SUBMIT["model"]
BACKEND = _SUBMIT["backend"]
METHODS = _SUBMIT["methods"]
SCOPES = _SUBMIT["scopes"]
PROTOCOLS = _SUBMIT["protocols"]
DENSITY = _SUBMIT["density"]
PRESET = _SUBMIT["preset"]
SEEDS = _SUBMIT["seeds"]
SUITE = _SUBMIT["suite"]
TASKS = _SUBMIT["tasks"]
MAX_STEPS = _SUBMIT["max_steps"]
MAX_NEW_TOKENS = _SUBMIT["max_new_tokens"]
MAX_CONTEXT_TOKENS = _SUBMIT["max_context_tokens"]
TEMPERATURE = _SUBMIT["temperature"]
SHOW = typer.Option(False, "--show", help="print the job as it would be stored (YAML) and exit; stores nothing")
NO_MODEL_CHECK = typer.Option(
    False,
    "--no-model-check",
    help="hf backend: skip checking that this machine can find the model (a preset, a local folder, the local "
    "Hugging Face cache, the hub when reachable), for workers that hold a model this machine does not",
)
#: what a refused model's message ends with: the flag that skips the check
SKIP_MODEL_CHECK = "workers that hold a model this machine cannot see: --no-model-check skips this check"


def _ints(flag: str, text: str) -> list[int]:
    try:
        return [int(part) for part in csv_list(text)]
    except ValueError:
        fail(f"{flag} takes comma-separated whole numbers, got {text!r}")


@dataclass(frozen=True)
class JobFlags:
    """The flags ``submit`` and ``run`` take for their job, declared once: each field is one option
    (``takes_flags`` spreads them into the verb's options, in this order). ``file`` and ``show`` say which job and
    whether to print it; every other field is an override (:meth:`overrides`), ``None`` when not given."""

    file: Path | None = flag(FILE)
    name: str | None = flag(NAME)
    model: str | None = flag(MODEL)
    backend: str | None = flag(BACKEND)
    methods: str | None = flag(METHODS)
    scopes: str | None = flag(SCOPES)
    protocols: str | None = flag(PROTOCOLS)
    density: float | None = flag(DENSITY)
    preset: str | None = flag(PRESET)
    seeds: str | None = flag(SEEDS)
    suite: str | None = flag(SUITE)
    tasks: str | None = flag(TASKS)
    max_steps: int | None = flag(MAX_STEPS)
    max_new_tokens: int | None = flag(MAX_NEW_TOKENS)
    max_context_tokens: int | None = flag(MAX_CONTEXT_TOKENS)
    temperature: float | None = flag(TEMPERATURE)
    show: bool = flag(SHOW)
    no_model_check: bool = flag(NO_MODEL_CHECK)

    @property
    def model_check(self) -> bool:
        """Whether the job's model is checked here (:func:`check_model`): not with ``--no-model-check``, and not
        for ``--show``, which stores and runs nothing."""
        return not (self.no_model_check or self.show)

    def overrides(self) -> dict[str, Any]:
        """The overrides the given flags stand for, in order (dotted keys set one nested field)."""
        given: dict[str, Any] = {
            "name": self.name,
            # a new model: the file's revision was its own
            "model": None if self.model is None else {"name": self.model},
            "backend": self.backend,
            "methods": None if self.methods is None else csv_list(self.methods),
            "scopes": None if self.scopes is None else csv_list(self.scopes),
            "protocols": None if self.protocols is None else csv_list(self.protocols),
            "density": self.density,
            "preset": self.preset,
            "seeds": None if self.seeds is None else _ints("--seeds", self.seeds),
            # a new source: the file's ids were its own
            "tasks": None if self.suite is None else {"suite": self.suite},
            "tasks.ids": None if self.tasks is None else csv_list(self.tasks),
            "limits.max_steps": self.max_steps,
            "limits.max_context_tokens": self.max_context_tokens,
            "sampling.max_new_tokens": self.max_new_tokens,
            "sampling.temperature": self.temperature,
        }
        return {key: value for key, value in given.items() if value is not None}


def _run_flags() -> type[JobFlags]:
    """``run``'s job flags: :class:`JobFlags` (the same fields, overrides and order) with each help naming what
    applies on ``run``: the bundled quick job's value where it sets one, when no --file is given."""
    run = _options(quick=True)
    changed = [f.name for f in fields(JobFlags) if f.name in run and run[f.name].help != _SUBMIT[f.name].help]
    namespace: dict[str, Any] = {
        "__module__": __name__,
        "__doc__": _run_flags.__doc__,
        "__annotations__": {name: JobFlags.__annotations__[name] for name in changed},
        **{name: flag(run[name]) for name in changed},
    }
    return dataclass(frozen=True)(type("RunJobFlags", (JobFlags,), namespace))


RunJobFlags = _run_flags()


def job_overrides(**flags: Any) -> dict[str, Any]:
    """``JobFlags(**flags).overrides()``: for a verb that declares some of the job flags itself (``episode``)."""
    return JobFlags(**flags).overrides()


def job_from_flags(file: Path | None, overrides: dict[str, Any], *, what: str, model_check: bool = True) -> JobSpec:
    """The job of ``file`` (None: the job defaults) with ``overrides``, every method's settings checked by
    building its policy, an openai job's endpoint checked against this machine's allow-lists
    (``ServiceSettings.openai_hosts`` / ``openai_key_envs``), and (``model_check``) an hf job's model found
    here (:func:`check_model`). Exit 2 naming the file, the overrides and the field (``what`` ends the message:
    "nothing was submitted"). ``submit``, ``run`` and ``episode`` (and their ``--show``) all come through here,
    before anything is stored or enqueued."""
    from jobs.job_file import JobSpecError

    source = str(file or "<defaults>")
    try:
        spec = JobSpec.load(file, overrides)
        spec.check_with_library(source=source)
        if spec.backend == "openai":  # only then: a job that sends nothing needs no service settings
            spec.check_endpoint(service_settings().openai_allowed, source=source)
    except JobSpecError as exc:
        fail(f"{exc}\n{what}")
    if model_check:
        check_model(spec, what=what)
    return spec


def check_model(spec: JobSpec, *, what: str) -> None:
    """Exit 2 when an hf job's model resolves nowhere this machine can see (``agent_runner.model_lookup``: a
    preset, a local folder, the local Hugging Face cache, the hub only when it answers within a few seconds; no
    retries), naming the model, where it looked and ``--no-model-check``. Other backends load no HF model."""
    if spec.backend != "hf":
        return
    from agent_runner.model_lookup import ModelNotFound, resolve_model

    try:
        resolve_model(spec.model.name, spec.model.revision)
    except ModelNotFound as exc:
        fail(f"{exc}\n{SKIP_MODEL_CHECK}\n{what}")


def load_job(file: Path | None, overrides: dict[str, Any], *, what: str, model_check: bool = True) -> PlannedJob:
    """:func:`job_from_flags` planned over its tasks, each loaded and fanned out once (``jobs.submit.plan_job``:
    the preflight reads ``.tasks``, storing takes the plan whole); exit 2 on any error, before anything is
    stored (a bad task selection included)."""
    from jobs.job_file import JobSpecError
    from jobs.submit import load_job_tasks, plan_job

    spec = job_from_flags(file, overrides, what=what, model_check=model_check)
    try:
        tasks = load_job_tasks(spec, service_settings().grading_ceilings)
        return plan_job(spec, tasks, source=str(file or "<defaults>"))
    except JobSpecError as exc:
        fail(f"{exc}\n{what}")


def show(spec: JobSpec) -> None:
    """Print the job as it would be stored (``--show``) and exit 0."""
    typer.echo(spec.to_yaml(), nl=False)
    raise typer.Exit(0)
