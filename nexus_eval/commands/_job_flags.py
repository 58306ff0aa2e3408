"""The job flags ``submit``, ``run`` and ``episode`` share: declared once, every one optional (``submit`` and
``run`` take them all as one :class:`JobFlags`, ``episode`` the options it needs).

A flag that is given becomes one override (``jobs.spec.apply_overrides``) set on top of the job file
(``--file``), or of the bundled quick job (``run``), or of the job defaults (``submit``); a flag that is not
given changes nothing. So the defaults live in one place, ``jobs.spec.JobSpec``, and a file is never
silently ignored: ``submit -f job.yaml --density 0.1`` stores 0.1.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from jobs.spec import JobSpec  # pydantic only, no torch
from nexus_eval.commands._common import csv_list, fail, service_settings
from nexus_eval.commands._flag_group import flag

if TYPE_CHECKING:
    from jobs.submit import PlannedJob

_D = JobSpec()  # each flag's help names the job default it overrides, read from the one place it is defined


def _csv(values: list) -> str:
    return ",".join(str(v) for v in values)


FILE = typer.Option(None, "--file", "-f", help="a YAML job file (see examples/); flags given as well override it")
NAME = typer.Option(None, help="a name for the job")
MODEL = typer.Option(
    None,
    help="'tiny' (random weights), 'smollm2-135m' (a real trained model), a Hugging Face id or a local path "
    f"(job default: {_D.model.name})",
)
BACKEND = typer.Option(None, help=f"hf | oracle | expert | openai (job default: {_D.backend})")
METHODS = typer.Option(None, "--methods", help=f"comma-separated eviction methods (job default: {_csv(_D.methods)})")
SCOPES = typer.Option(None, help=f"comma-separated: prefill_only,prefill_decode (job default: {_csv(_D.scopes)})")
PROTOCOLS = typer.Option(None, help=f"comma-separated: true_eviction,full_context (job default: {_csv(_D.protocols)})")
DENSITY = typer.Option(None, help=f"kept fraction of the logical tokens (job default: {_D.density})")
PRESET = typer.Option(None, help=f"per-method settings: paper | reference | kvcache_factory (job default: {_D.preset})")
SEEDS = typer.Option(None, help=f"comma-separated seeds; each samples its own episode (job default: {_csv(_D.seeds)})")
SUITE = typer.Option(
    None, help=f"bundled suite name or task folder; replaces the job's task source (job default: {_D.tasks.suite})"
)
TASKS = typer.Option(None, "--tasks", help="comma-separated task ids or globs (job default: every task)")
MAX_STEPS = typer.Option(None, "--max-steps", help=f"absolute turn limit (job default: {_D.limits.max_steps})")
MAX_NEW_TOKENS = typer.Option(
    None, "--max-new-tokens", help=f"per-turn generation cap (job default: {_D.sampling.max_new_tokens or 'none'})"
)
MAX_CONTEXT_TOKENS = typer.Option(
    None, "--max-context-tokens", help=f"logical tokens (job default: {_D.limits.max_context_tokens})"
)
TEMPERATURE = typer.Option(None, help=f"sampling temperature (job default: {_D.sampling.temperature})")
SHOW = typer.Option(False, "--show", help="print the job as it would be stored (YAML) and exit; stores nothing")


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


def job_overrides(**flags: Any) -> dict[str, Any]:
    """``JobFlags(**flags).overrides()``: for a verb that declares some of the job flags itself (``episode``)."""
    return JobFlags(**flags).overrides()


def job_from_flags(file: Path | None, overrides: dict[str, Any], *, what: str) -> JobSpec:
    """The job of ``file`` (None: the job defaults) with ``overrides``, every method's settings checked by
    building its policy, and an openai job's endpoint checked against this machine's allow-lists
    (``ServiceSettings.openai_hosts`` / ``openai_key_envs``). Exit 2 naming the file, the overrides and the
    field (``what`` ends the message: "nothing was submitted"). ``submit``, ``run`` and ``episode`` (and their
    ``--show``) all come through here, before anything is stored or enqueued."""
    from jobs.spec import JobSpecError

    source = str(file or "<defaults>")
    try:
        spec = JobSpec.load(file, overrides)
        spec.check_with_library(source=source)
        if spec.backend == "openai":  # only then: a job that sends nothing needs no service settings
            spec.check_endpoint(service_settings().openai_allowed, source=source)
    except JobSpecError as exc:
        fail(f"{exc}\n{what}")
    return spec


def load_job(file: Path | None, overrides: dict[str, Any], *, what: str) -> PlannedJob:
    """:func:`job_from_flags` planned over its tasks, each loaded and fanned out once (``jobs.submit.plan_job``:
    the preflight reads ``.tasks``, storing takes the plan whole); exit 2 on any error, before anything is
    stored (a bad task selection included)."""
    from jobs.spec import JobSpecError
    from jobs.submit import load_tasks, plan_job

    spec = job_from_flags(file, overrides, what=what)
    try:
        return plan_job(spec, load_tasks(spec, service_settings().grading_ceilings))
    except JobSpecError as exc:
        fail(f"{exc}\n{what}")


def show(spec: JobSpec) -> None:
    """Print the job as it would be stored (``--show``) and exit 0."""
    typer.echo(spec.to_yaml(), nl=False)
    raise typer.Exit(0)
