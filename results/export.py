"""``nexus-eval export``: a job's patches as SWE-bench predictions that the official harness reads as meant.

swebench's ``run_evaluation`` turns a predictions file into a dict keyed by ``instance_id``, so a file that
holds two configurations' patches for one instance keeps the last one without a word. Hence one file holds
exactly one configuration (method, scope, protocol, seed): :func:`collect` groups a job's result attempts by
configuration, and the CLI refuses to write several configurations to one file (``--output-dir`` writes one
file each).

What goes in a file:

- the result attempt of each key (``db.store.result_attempts``: the first the agent drove alone that did not
  break; interactive ones only on request, and then listed);
- not an episode without a patch, nor one whose patch is empty (the harness would grade it as a failed
  apply; SWE-bench counts a missing prediction as unresolved all the same), each counted in ``left_out``;
- with ``r2e_filter``, R2E-Gym's ``true_output_patch`` instead of the whole diff: only ``.py`` files the agent
  edited with ``file_editor str_replace`` (``grading.export_patch_filtered``), the patch DeepSWE's
  reported numbers were graded on. A patch the filter empties is left out like an empty one.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select

from db import store as db_store
from db.models import Turn, is_interactive


@dataclass(frozen=True, order=True)
class Configuration:
    """What one predictions file holds: one method under one scope, protocol and seed."""

    method: str
    scope: str
    protocol: str
    seed: int

    @property
    def label(self) -> str:
        return f"{self.method}/{self.scope}/{self.protocol}/seed {self.seed}"

    def model_name(self, model: str) -> str:
        """The ``model_name_or_path`` of this configuration's predictions (the harness names its logs by it)."""
        return f"{model}__{self.method}__{self.scope}__{self.protocol}__seed{self.seed}"


@dataclass(frozen=True)
class Prediction:
    instance_id: str
    patch: str
    episode_id: str
    driver: str


@dataclass
class Export:
    """A job's predictions by configuration, and what was left out of them and why."""

    job_id: str
    model: str
    files: dict[Configuration, list[Prediction]] = field(default_factory=dict)
    left_out: dict[str, int] = field(default_factory=dict)  # reason -> number of episodes

    @property
    def interactive(self) -> list[Prediction]:
        return [p for preds in self.files.values() for p in preds if is_interactive(p.driver)]

    def summary(self) -> str:
        kept = sum(len(p) for p in self.files.values())
        parts = [f"{kept} predictions in {len(self.files)} configuration(s)"]
        parts += [f"left out {n} ({reason})" for reason, n in sorted(self.left_out.items())]
        if self.interactive:
            parts.append(f"{len(self.interactive)} from interactive attempts")
        return "; ".join(parts)


def _str_replace_paths(session: Any, episode_id: str) -> list[str]:
    """The files the episode edited with ``file_editor str_replace``, in order (R2E-Gym's filter keeps these)."""
    from sandbox.tools import ToolCall, str_replace_path

    paths: list[str] = []
    actions = session.execute(select(Turn.action).where(Turn.episode_id == episode_id).order_by(Turn.index))
    for (action,) in actions:
        path = str_replace_path(ToolCall.model_validate(action)) if action else None
        if path and path not in paths:
            paths.append(path)
    return paths


def collect(
    session: Any,
    job_id: str,
    *,
    r2e_filter: bool = False,
    include_interactive: bool = False,
    only: dict[str, Any] | None = None,
) -> Export:
    """The predictions of job ``job_id`` (id or unique prefix) by configuration. ``only`` keeps the episodes
    whose ``method`` / ``scope`` / ``protocol`` / ``seed`` equal the given values (``None`` values ignored)."""
    from grading import export_patch_filtered

    job = db_store.get_job(session, job_id)
    config = job.config or {}
    model = (config.get("model") or {}).get("name") or config.get("backend") or "model"
    wanted = {k: v for k, v in (only or {}).items() if v is not None}
    out = Export(job.id, model)
    files: dict[Configuration, list[Prediction]] = defaultdict(list)
    for row in db_store.result_attempts(session, [job.id], include_interactive=include_interactive):
        if any(getattr(row, k) != v for k, v in wanted.items()):
            continue
        patch = row.patch
        if patch is not None and r2e_filter:
            patch = export_patch_filtered(patch, _str_replace_paths(session, row.id))
        if patch is None:
            reason = "no patch: the agent stage left none"
        elif not patch.strip():
            reason = "empty after the R2E filter" if r2e_filter and row.patch.strip() else "empty patch"
        else:
            files[Configuration(row.method, row.scope, row.protocol, row.seed)].append(
                Prediction(row.task_id, patch, row.id, row.driver)
            )
            continue
        out.left_out[reason] = out.left_out.get(reason, 0) + 1
    out.files = dict(sorted(files.items()))
    return out


def prediction_lines(predictions: list[Prediction], model_name: str) -> str:
    """JSONL, one ``{"instance_id", "model_name_or_path", "model_patch"}`` per line (the harness's fields)."""
    return "".join(
        json.dumps({"instance_id": p.instance_id, "model_name_or_path": model_name, "model_patch": p.patch}) + "\n"
        for p in predictions
    )


def file_name(model_name: str) -> str:
    """A predictions file name for ``model_name`` (``/`` in a hub id and other odd characters become ``_``)."""
    return re.sub(r"[^A-Za-z0-9._+-]", "_", model_name) + ".jsonl"
