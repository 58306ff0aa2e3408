"""The compare table's notes: what it did with demonstrations, interactive attempts, graders, stale seeds, and
merged jobs whose settings differ (:func:`results.compare.compare_jobs` adds them to ``CompareTable.notes``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from agent_runner.config import NO_MODEL_BACKENDS
from db.models import (
    AttemptDriver,
)
from nexus.methods import DENSE
from nexus.presets import stored_settings
from results.compare_table import DEMONSTRATION_BACKENDS, CompareTable, Outcome
from results.replay_stats import units_text


def demonstration_notes(table: CompareTable) -> list[str]:
    """What the table did with stand-in jobs, and with replays scored on several models or in several dtypes."""
    notes = []
    if table.demonstrations:
        named = ", ".join(d.job_id for d in table.demonstrations)
        notes.append(
            f"job(s) {named} ran a stand-in backend ({', '.join(sorted(DEMONSTRATION_BACKENDS))}): demonstrations, "
            "not a model's samples, so none of their episodes is in a Pass@1 cell, a paired test or the per-task "
            "grid; their replays are in the replay and action tables"
        )
    units = {(c.model, c.dtype) for c in table.replay}
    if len({m for m, _ in units}) > 1:
        notes.append(
            f"replays were scored on several models ({units_text(units)}): each model's and dtype's cells are apart"
        )
    elif len(units) > 1:
        notes.append(
            f"replays were measured in several dtypes ({units_text(units)}): each dtype's cells are apart, and a "
            "replay is paired only with the dense replay measured in its own dtype"
        )
    return notes


def not_run_notes(table: CompareTable) -> list[str]:
    """What a "not run" cell is (every episode of it broke: nothing measured), and a dense that ran nothing."""
    cells = [(r, c) for r in table.rows for c in r.cells.values() if c.not_run is not None]
    if not cells:
        return []
    notes = [
        f"{len(cells)} cell(s) not run: every episode broke (timeout, infra_failure or cancelled), so nothing was "
        "measured and the cell shows no rate, interval or p-value; 'not run:' quotes the first episode's error "
        "(`nexus-eval episodes JOB --status infra_failure` lists them; `nexus-eval rerun JOB --failed` runs them again)"
    ]
    dense = sorted({r.label for r, c in cells if c.method == DENSE})
    if dense:
        notes.append(f"dense was not run in {', '.join(dense)}: no paired test against it there")
    return notes


def interactive_notes(interactive: Sequence[Any], *, counted: Sequence[Outcome]) -> list[str]:
    """What the table did with the jobs' interactive attempts (``interactive``: their rows; ``counted``: the
    outcomes of them the table counts, empty unless ``include_interactive``)."""
    if not interactive:
        return []
    steered = sum(e.driver == AttemptDriver.steered for e in interactive)
    if not counted:
        return [
            f"{len(interactive)} interactive attempt(s) ({steered} steered by an operator) are kept apart: each "
            "key's result is the agent's own attempt; `--include-interactive` counts them (marked *)"
        ]
    steered_counted = sum(o.driver == AttemptDriver.steered for o in counted)
    return [
        f"{len(counted)} result(s) (marked *) come from interactive attempts ({steered_counted} steered by an "
        "operator), counted in place of the agent's own: a person chose to run them, so they are not the "
        "method's samples"
    ]


def grading_notes(episodes: Sequence[Any]) -> list[str]:
    """Which tools graded the table, and the verdicts on tasks that needed a network grading did not have."""
    graders = sorted({f"{e.grader} ({e.grader_version})" for e in episodes if e.grader})
    notes = [f"graded by {', '.join(graders)}"] if graders else []
    offline = sorted({e.task_id for e in episodes if e.needs_network and e.status != "resolved"})
    if offline:
        notes.append(
            f"{len(offline)} task(s) need the network and were graded without it; their unresolved verdicts may "
            f"not be the agent's: {', '.join(offline[:10])}{' ...' if len(offline) > 10 else ''}"
        )
    return notes


def seed_notes(episodes: Sequence[Any]) -> list[str]:
    """A warning for episodes stored before the episode's seed reached its sampler: their config's ``agent.seed``
    (always 0) is what sampled, whatever their ``seed``, so their seeds are copies, not independent samples."""
    stale = [
        e
        for e in episodes
        if (e.config_backend or "hf") not in ("oracle", *DEMONSTRATION_BACKENDS)
        and e.config_agent_seed is not None
        and e.config_agent_seed != (e.seed if e.config_seed is None else e.config_seed)
    ]
    if not stale:
        return []
    return [
        f"{len(stale)} episode(s) were sampled with seed {stale[0].config_agent_seed} whatever their seed "
        "(stored before each seed sampled apart): across seeds they are copies, not independent samples, so "
        "Pass@1 over seeds, pass@k and McNemar pairs overstate the evidence; `nexus-eval rerun` them"
    ]


def dense_protocol_notes(jobs: Sequence[Any]) -> list[str]:
    """Why each job with dense and several protocols ran dense once or under each protocol: its stored planning
    answer (``dense_rendering``, ``agent_runner.dense_reuse``); a job planned before the check says it was not."""
    notes = []
    for job in jobs:
        config = job.config or {}
        protocols = config.get("protocols") or []
        if DENSE not in (config.get("methods") or []) or len(protocols) < 2 or config.get("dense_per_cell"):
            continue
        backend = config.get("backend") or "hf"
        model = (config.get("model") or {}).get("name")
        rendering = config.get("dense_rendering")
        if rendering is None and backend in NO_MODEL_BACKENDS:
            rendering = "no_model"
        once = f"job {job.id}: dense ran under {protocols[0]} only and stands for every protocol"
        each = f"job {job.id}: dense ran under each protocol, and each protocol's rows pair with their own dense"
        if rendering == "identical":
            notes.append(
                f"{once}: its model ({model}) renders a multi-turn history with a <think> block identically under "
                "true_eviction and full_context (checked at planning on a rendered two-turn conversation)"
            )
        elif rendering == "no_model":
            notes.append(f"{once}: backend {backend} has no model, so no history is rendered and reuse is exact")
        elif rendering == "differs":
            notes.append(
                f"{each}: the chat template of its model ({model}) re-renders a history differently from what true "
                "eviction holds (checked at planning), so dense is a different computation under each"
            )
        elif rendering == "unknown":
            why = "the server renders the history, unseen" if backend == "openai" else "its tokenizer did not load"
            notes.append(f"{each}: how backend {backend} renders a history could not be checked ({why})")
        else:
            notes.append(
                f"job {job.id} was planned before dense's rendering check: its dense ran under {protocols[0]} only "
                "and is reused for the other protocols unchecked; under full context Qwen3's template drops earlier "
                "<think> blocks, so it may be a different computation (resubmit to plan dense per protocol)"
            )
    return notes


#: Job settings that change what a column means; merged jobs that differ in them get a warning note. Density is
#: not one of them: cells are aligned by it (a row per density), so a sweep's jobs differ in it by design.
COMPARED_SETTINGS = ("model", "backend", "limits", "sampling", "eviction", "preset")
ALIGNED_SETTINGS = frozenset({"density"})


def setting_notes(jobs: Sequence[Any]) -> list[str]:
    """Warnings for merged jobs whose configs differ in a setting that changes results (the columns are
    keyed by method alone, and rows by scope, protocol and density only). A method's own settings
    (``method_params``, resolved from the job's preset) are compared per method, value by value, among the
    jobs that ran that method."""
    notes = []
    for key in COMPARED_SETTINGS:
        notes += _differences(key, {job.id: (job.config or {}).get(key) for job in jobs})
    per_method: dict[str, dict[str, dict[str, Any]]] = {}
    shared: dict[str, dict[str, Any]] = {}  # job -> its eviction block (what a method without an override uses)
    for job in jobs:
        shared[job.id] = (job.config or {}).get("eviction") or {}
        for method, settings in ((job.config or {}).get("method_params") or {}).items():
            per_method.setdefault(method, {})[job.id] = stored_settings(method, settings or {})
    for method, by_job in per_method.items():
        if len(by_job) < 2:
            continue
        for name in sorted({name for settings in by_job.values() for name in settings} - ALIGNED_SETTINGS):
            values = {j: settings.get(name, shared[j].get(name)) for j, settings in by_job.items()}
            notes += _differences(f"method_params.{method}.{name}", values)
    return notes


def _differences(label: str, values: dict[str, Any]) -> list[str]:
    """One note naming each job's value of ``label``, when the jobs do not all agree (else none)."""
    shown = {job: json.dumps(value, sort_keys=True) for job, value in values.items()}
    if len(set(shown.values())) < 2:
        return []
    return [f"jobs differ in {label}: " + ", ".join(f"{j}={v}" for j, v in shown.items())]
