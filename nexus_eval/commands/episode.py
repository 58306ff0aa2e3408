"""`nexus-eval episode`: run one task x method x scope x protocol x seed, print the trajectory or JSON."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer

from nexus_eval.commands import _job_flags as jf
from nexus_eval.commands._common import fail


def _turn_table(result):
    from rich.table import Table

    table = Table(title=f"{result.task_id}: {result.status}")
    for col in (
        "turn",
        "action",
        "appended",
        "generated",
        "logical",
        "physical after (min/mean/max)",
        "events",
        "tok/s",
        "env s",
    ):
        table.add_column(col, justify="right" if col != "action" else "left")
    for t in result.turns:
        c = t.completion
        phys = c.physical_after
        table.add_row(
            str(t.index),
            (t.action.name if t.action else "(no call)"),
            str(c.tokens_appended),
            str(c.tokens_generated),
            str(c.logical_length),
            "-" if phys is None else f"{phys.min:.0f}/{phys.mean:.0f}/{phys.max:.0f}",
            str(c.eviction_events),
            "-" if c.tokens_per_s is None else f"{c.tokens_per_s:.1f}",
            f"{t.env_s:.2f}",
        )
    return table


def episode(
    task: str = typer.Option(..., "--task", help="task instance id (in the job's task source)"),
    file: Path = jf.FILE,
    suite: str = jf.SUITE,
    tasks_file: Path = typer.Option(None, "--tasks-file", help="JSON/JSONL/parquet tasks instead of a suite"),
    backend: str = jf.BACKEND,
    model: str = jf.MODEL,
    revision: str = typer.Option(None, help="model revision"),
    device: str = typer.Option(None, help="auto | cpu | cuda (default: the job's model device)"),
    method: str = typer.Option(None, help="eviction method (default: the job's first)"),
    scope: str = typer.Option(None, help="prefill_only | prefill_decode (default: the job's first)"),
    protocol: str = typer.Option(None, help="true_eviction | full_context (default: the job's first)"),
    density: float = jf.DENSITY,
    preset: str = jf.PRESET,
    seed: int = typer.Option(
        None, help="the episode's seed: its sampler and its eviction policy (default: the job's first)"
    ),
    max_steps: int = jf.MAX_STEPS,
    max_new_tokens: int = jf.MAX_NEW_TOKENS,
    max_context_tokens: int = jf.MAX_CONTEXT_TOKENS,
    temperature: float = jf.TEMPERATURE,
    prompts: str = typer.Option(
        None, "--prompts", help="R2E-Gym prompt YAML (a path, or r2egym:NAME) for DeepSWE's scaffold; docs/agent.md"
    ),
    r2egym_root: str = typer.Option(None, "--r2egym-root", help="an R2E-Gym checkout's src/r2egym, for --prompts"),
    grade_route: str = typer.Option(
        None, "--grade-route", help="R2E's SWE-bench rows: swebench (official) or r2e (R2E-Gym's reward)"
    ),
    base_url: str = typer.Option(None, "--base-url", help="openai backend: endpoint up to /v1"),
    grade: bool = typer.Option(
        None, "--grade/--no-grade", help="grade the patch in a fresh container (default: the job's)"
    ),
    as_json: bool = typer.Option(False, "--json", help="print the EpisodeResult as JSON"),
    no_model_check: bool = jf.NO_MODEL_CHECK,
) -> None:
    """Run one episode in a real container and grade it: one cell of a job (--file, else the job defaults)
    with the flags given on top, through the same runner as a worker (agent_runner.episode.run_episode)."""
    from rich.console import Console

    from agent_runner.episode import EpisodeHooks, run_episode
    from agent_runner.loaded_models import backend_for
    from nexus_eval.commands._preflight import build_or_fail, refuse_unless_ready
    from nexus_eval.readiness import container_checks

    console = Console(stderr=True)
    overrides = jf.job_overrides(
        model=model,
        backend=backend,
        density=density,
        preset=preset,
        suite=suite,
        max_steps=max_steps,
        max_new_tokens=max_new_tokens,
        max_context_tokens=max_context_tokens,
        temperature=temperature,
    )
    given = {  # one cell: each of these names one value, never a list
        "methods": None if method is None else [method],
        "scopes": None if scope is None else [scope],
        "protocols": None if protocol is None else [protocol],
        "seeds": None if seed is None else [seed],
        "tasks": None if tasks_file is None else {"file": str(tasks_file)},
        "model.revision": revision,
        "model.device": device,
        "limits.prompts": prompts,
        "limits.r2egym_root": r2egym_root,
        "grade_route": grade_route,
        "openai.base_url": base_url,
        "grade": grade,
    }
    overrides.update({key: value for key, value in given.items() if value is not None})
    spec = _one_episode(file, overrides, task, model_check=not no_model_check)
    try:
        spec.agent.scaffold()  # a bad prompt file fails here, before any container starts
        the_task = spec.load_task()
        with console.status(f"loading {spec.backend} backend"):
            the_model = backend_for(spec, the_task)  # bad model / method errors surface before any container
    except ValueError as exc:
        fail(str(exc))
    # every backend works in a container: no daemon, or an image that cannot be had, is exit 2 (after the
    # input errors above, which come first); a missing local image (base or task) is built, with a progress bar
    checks = container_checks([the_task])
    refuse_unless_ready(checks, "nothing was run")
    build_or_fail(checks, console, "nothing was run")
    cell = f"{spec.eviction.method}/{spec.eviction.scope}/{spec.protocol} seed {spec.seed}"
    with console.status(f"{task}: {cell}") as status:

        def on_turn(turn):
            status.update(f"{task}: turn {turn.index} -> {turn.action.name if turn.action else 'no call'}")

        hooks = EpisodeHooks(on_turn=on_turn, labels={"nexus-eval.job": "cli"})
        result = run_episode(spec, task=the_task, model=the_model, hooks=hooks)
    if as_json:
        sys.stdout.write(json.dumps(result.model_dump(mode="json")) + "\n")
    else:
        Console().print(_turn_table(result))
        if result.error:
            console.print(f"[yellow]{result.error.splitlines()[0]}[/yellow]")
    if result.exit_status == "infra_failure":
        raise typer.Exit(1)


def _one_episode(file: Path | None, overrides: dict, task_id: str, *, model_check: bool = True):
    """The ``EpisodeSpec`` of ``task_id`` in the job (``file`` + ``overrides``): its first method, scope,
    protocol and seed (the flags, when given, are the only ones). Exit 2 naming the problem (an hf model
    this machine cannot find among them, unless not ``model_check``)."""
    job = jf.job_from_flags(file, overrides, what="nothing was run", model_check=model_check)
    method, (scope, protocol), seed = job.methods[0], job.cells(job.methods[0])[0], job.seeds[0]
    return job.episode_config(task_id, method, scope, protocol, seed)


def register(app: typer.Typer) -> None:
    """Attach this area's verbs to the root app."""
    app.command("episode")(episode)
