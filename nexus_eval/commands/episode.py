"""`nexus-eval episode`: run one task x method x scope x protocol x seed, print the trajectory or JSON."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer


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
    task: str = typer.Option(..., "--task", help="task instance id"),
    suite: str = typer.Option("mini", help="bundled suite name or a folder of local tasks"),
    tasks_file: Path = typer.Option(None, "--tasks-file", help="JSON/JSONL/parquet tasks instead of a suite"),
    backend: str = typer.Option("hf", help="hf | oracle | openai"),
    model: str = typer.Option("tiny", help="'tiny', a Hugging Face id or a local path"),
    revision: str = typer.Option(None, help="model revision"),
    device: str = typer.Option("auto", help="auto | cpu | cuda"),
    method: str = typer.Option("nexus", help="eviction method"),
    scope: str = typer.Option("prefill_decode", help="prefill_only | prefill_decode"),
    protocol: str = typer.Option("true_eviction", help="true_eviction | full_context"),
    density: float = typer.Option(0.2, help="kept fraction of the logical length"),
    preset: str = typer.Option("paper", help="the method's settings: paper | reference | kvcache_factory"),
    seed: int = typer.Option(0),
    max_steps: int = typer.Option(100, "--max-steps"),
    max_new_tokens: int = typer.Option(
        None, "--max-new-tokens", help="per-turn generation cap (default: none, the context limit governs)"
    ),
    prompts: str = typer.Option(
        None, "--prompts", help="R2E-Gym prompt YAML (a path, or r2egym:NAME) for DeepSWE's scaffold; docs/agent.md"
    ),
    r2egym_root: str = typer.Option(None, "--r2egym-root", help="an R2E-Gym checkout's src/r2egym, for --prompts"),
    grade_route: str = typer.Option(
        "swebench", "--grade-route", help="R2E's SWE-bench rows: swebench (official) or r2e (R2E-Gym's reward)"
    ),
    temperature: float = typer.Option(1.0),
    base_url: str = typer.Option(None, "--base-url", help="openai backend: endpoint up to /v1"),
    grade: bool = typer.Option(True, "--grade/--no-grade", help="grade the patch in a fresh container"),
    as_json: bool = typer.Option(False, "--json", help="print the EpisodeResult as JSON"),
) -> None:
    """Run one episode in a real container and grade it."""
    from pydantic import ValidationError
    from rich.console import Console

    from agent_runner.config import AgentConfig, EpisodeSpec, ModelSpec, SamplingConfig
    from agent_runner.episode import build_model
    from agent_runner.episode_core import run_episode
    from nexus.presets import preset_settings, split_settings
    from nexus_eval.commands._preflight import build_or_fail, refuse_unless_ready
    from nexus_eval.readiness import container_checks

    console = Console(stderr=True)
    try:
        shared, own = split_settings(preset_settings(method, preset))
        spec = EpisodeSpec(
            suite=None if tasks_file else suite,
            tasks_file=str(tasks_file) if tasks_file else None,
            task_id=task,
            backend=backend,
            model=ModelSpec(name=model, revision=revision, device=device),
            eviction={"method": method, "scope": scope, "density": density, **shared, "method_params": own},
            protocol=protocol,
            seed=seed,
            sampling=SamplingConfig(max_new_tokens=max_new_tokens, temperature=temperature),
            agent=AgentConfig(
                max_steps=max_steps, max_new_tokens=max_new_tokens, seed=seed, prompts=prompts, r2egym_root=r2egym_root
            ),
            openai={"base_url": base_url} if base_url else {},
            grade=grade,
            grade_route=grade_route,
        )
        spec.agent.scaffold()  # a bad prompt file fails here, before any container starts
        the_task = spec.load_task()
        with console.status(f"loading {backend} backend"):
            the_model = build_model(spec, the_task)  # bad model / method errors surface before any container
    except (ValueError, ValidationError) as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from exc
    # every backend works in a container: no engine, or an image that cannot be had, is exit 2 (after the
    # input errors above, which come first); a missing local image (base or task) is built, with a progress bar
    checks = container_checks([the_task])
    refuse_unless_ready(checks, "nothing was run")
    build_or_fail(checks, console, "nothing was run")
    the_model.reset(seed=spec.seed)
    with console.status(f"{task}: {method}/{scope}/{protocol}") as status:

        def on_turn(turn):
            status.update(f"{task}: turn {turn.index} -> {turn.action.name if turn.action else 'no call'}")

        result = run_episode(
            the_task,
            the_model,
            agent_config=spec.agent,
            grade=spec.grade,
            grade_config=spec.grade_config(),
            on_turn=on_turn,
            labels={"nexus-eval.job": "cli"},
        )
    result.config = {**result.config, "episode": spec.model_dump(mode="json")}
    if as_json:
        sys.stdout.write(json.dumps(result.model_dump(mode="json")) + "\n")
    else:
        Console().print(_turn_table(result))
        if result.error:
            console.print(f"[yellow]{result.error.splitlines()[0]}[/yellow]")
    if result.exit_status == "infra_failure":
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Attach this area's verbs to the root app."""
    app.command("episode")(episode)
