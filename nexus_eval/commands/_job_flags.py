"""The job flags ``submit``, ``run`` and ``episode`` share: declared once, every one optional.

A flag that is given becomes one override (``workers.spec.apply_overrides``) set on top of the job file
(``--file``), or of the bundled quick job (``run``), or of the job defaults (``submit``); a flag that is not
given changes nothing. So the defaults live in one place, ``workers.spec.JobSpec``, and a file is never
silently ignored: ``submit -f job.yaml --density 0.1`` stores 0.1.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from nexus_eval.commands._common import csv_list, fail, service_settings
from workers.spec import JobSpec  # pydantic only, no torch

if TYPE_CHECKING:
    from env.tasks import Task

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


def job_overrides(
    *,
    name: str | None = None,
    model: str | None = None,
    backend: str | None = None,
    methods: str | None = None,
    scopes: str | None = None,
    protocols: str | None = None,
    density: float | None = None,
    preset: str | None = None,
    seeds: str | None = None,
    suite: str | None = None,
    tasks: str | None = None,
    max_steps: int | None = None,
    max_new_tokens: int | None = None,
    max_context_tokens: int | None = None,
    temperature: float | None = None,
) -> dict[str, Any]:
    """The overrides the given flags stand for, in order (dotted keys set one nested field)."""
    given: dict[str, Any] = {
        "name": name,
        "model": None if model is None else {"name": model},  # a new model: the file's revision was its own
        "backend": backend,
        "methods": None if methods is None else csv_list(methods),
        "scopes": None if scopes is None else csv_list(scopes),
        "protocols": None if protocols is None else csv_list(protocols),
        "density": density,
        "preset": preset,
        "seeds": None if seeds is None else _ints("--seeds", seeds),
        "tasks": None if suite is None else {"suite": suite},  # a new source: the file's ids were its own
        "tasks.ids": None if tasks is None else csv_list(tasks),
        "limits.max_steps": max_steps,
        "limits.max_context_tokens": max_context_tokens,
        "sampling.max_new_tokens": max_new_tokens,
        "sampling.temperature": temperature,
    }
    return {key: value for key, value in given.items() if value is not None}


def job_from_flags(file: Path | None, overrides: dict[str, Any], *, what: str) -> JobSpec:
    """The job of ``file`` (None: the job defaults) with ``overrides``, every method's settings checked by
    building its policy, and an openai job's endpoint checked against this machine's allow-lists
    (``ServiceSettings.openai_hosts`` / ``openai_key_envs``). Exit 2 naming the file, the overrides and the
    field (``what`` ends the message: "nothing was submitted"). ``submit``, ``run`` and ``episode`` (and their
    ``--show``) all come through here, before anything is stored or enqueued."""
    from workers.spec import JobSpecError

    source = str(file or "<defaults>")
    try:
        spec = JobSpec.load(file, overrides)
        spec.check_with_library(source=source)
        if spec.backend == "openai":  # only then: a job that sends nothing needs no service settings
            spec.check_endpoint(service_settings().openai_allowed, source=source)
    except JobSpecError as exc:
        fail(f"{exc}\n{what}")
    return spec


def load_job(file: Path | None, overrides: dict[str, Any], *, what: str) -> tuple[JobSpec, list[Task]]:
    """:func:`job_from_flags` and its tasks, loaded once (the selection checked, for the preflight and the
    fan-out); exit 2 on any error, before anything is stored."""
    from workers.spec import JobSpecError
    from workers.submit import load_tasks, plan_episodes

    spec = job_from_flags(file, overrides, what=what)
    try:
        tasks = load_tasks(spec, service_settings().grading_ceilings)
        plan_episodes(spec, tasks)  # a bad task selection is an error before anything is stored
    except JobSpecError as exc:
        fail(f"{exc}\n{what}")
    return spec, tasks


def show(spec: JobSpec) -> None:
    """Print the job as it would be stored (``--show``) and exit 0."""
    typer.echo(spec.to_yaml(), nl=False)
    raise typer.Exit(0)
