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
  edited with ``file_editor str_replace`` (``env.grading.export_patch_filtered``), the patch DeepSWE's
  reported numbers were graded on. A patch the filter empties is left out like an empty one.

Memory stays bounded at any job size (a Table-3 job: 12,800 patches): :func:`collect` streams the result attempts
``CHUNK`` rows at a time and keeps only counts (which files, how many predictions, why others were left out), so
the CLI can refuse an ambiguous file before writing anything; :func:`write_one` / :func:`write_each` then stream
them again, writing each chunk's lines as they come. The lines and their order are those of the whole-job read
they replace: each key's result attempt in key order (Python's, :func:`db.progress.by_code_point`).
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import select

from db import job_rows
from db import store as db_store
from db.models import Episode, Turn, is_interactive
from db.progress import by_code_point

#: result attempts read (and their patches held) at a time
CHUNK = 100
#: the columns a prediction needs, its patch last
COLUMNS = ("id", "task_id", "method", "scope", "protocol", "seed", "driver", "patch")


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
    """What a job's export holds, without the patches: the number of predictions per configuration (sorted), what
    was left out and why, the interactive attempts among them, and what to read again to write them."""

    job_id: str
    model: str
    files: dict[Configuration, int] = field(default_factory=dict)  # configuration -> number of predictions
    left_out: dict[str, int] = field(default_factory=dict)  # reason -> number of episodes
    interactive: list[tuple[str, str]] = field(default_factory=list)  # (instance id, episode id), file by file
    query: dict[str, Any] = field(default_factory=dict)  # collect's arguments, for the streams that write

    def summary(self) -> str:
        kept = sum(self.files.values())
        parts = [f"{kept} predictions in {len(self.files)} configuration(s)"]
        parts += [f"left out {n} ({reason})" for reason, n in sorted(self.left_out.items())]
        if self.interactive:
            parts.append(f"{len(self.interactive)} from interactive attempts")
        return "; ".join(parts)


def _chunks(session: Any, query: dict[str, Any]) -> Iterator[list[Any]]:
    """The exported rows (``COLUMNS``) of ``query`` (collect's arguments), in key order, ``CHUNK`` at a time."""
    numbers = db_store.result_attempt_numbers([query["job_id"]], include_interactive=query["include_interactive"])
    stmt = select(*(getattr(Episode, c) for c in COLUMNS)).join(numbers, db_store.at_numbers(numbers))
    stmt = stmt.where(*(getattr(Episode, k) == v for k, v in query["only"].items()))
    stmt = stmt.order_by(by_code_point(session, Episode.episode_key)).execution_options(yield_per=CHUNK)
    yield from session.execute(stmt).partitions()


def _str_replace_paths(session: Any, episode_ids: list[str]) -> dict[str, list[str]]:
    """The files each episode edited with ``file_editor str_replace``, in order (R2E-Gym's filter keeps these)."""
    from env.sandbox.tools import ToolCall, str_replace_path

    paths: dict[str, list[str]] = {i: [] for i in episode_ids}
    actions = select(Turn.episode_id, Turn.action).where(Turn.episode_id.in_(episode_ids))
    for episode_id, action in session.execute(actions.order_by(Turn.episode_id, Turn.index)):
        path = str_replace_path(ToolCall.model_validate(action)) if action else None
        if path and path not in paths[episode_id]:
            paths[episode_id].append(path)
    return paths


def _predictions(session: Any, query: dict[str, Any]) -> Iterator[list[tuple[Configuration, Prediction | str]]]:
    """Chunk by chunk, each exported row's configuration and its prediction, or why it is left out."""
    from env.grading import export_patch_filtered

    r2e_filter = query["r2e_filter"]
    for rows in _chunks(session, query):
        edited = _str_replace_paths(session, [r.id for r in rows if r.patch is not None]) if r2e_filter else {}
        out: list[tuple[Configuration, Prediction | str]] = []
        for row in rows:
            patch = row.patch
            if patch is not None and r2e_filter:
                patch = export_patch_filtered(patch, edited[row.id])
            configuration = Configuration(row.method, row.scope, row.protocol, row.seed)
            if patch is None:
                out.append((configuration, "no patch: the agent stage left none"))
            elif not patch.strip():
                reason = "empty after the R2E filter" if r2e_filter and row.patch.strip() else "empty patch"
                out.append((configuration, reason))
            else:
                out.append((configuration, Prediction(row.task_id, patch, row.id, row.driver)))
        yield out


def collect(
    session: Any,
    job_id: str,
    *,
    r2e_filter: bool = False,
    include_interactive: bool = False,
    only: dict[str, Any] | None = None,
) -> Export:
    """What job ``job_id`` (id or unique prefix) exports, by configuration, without holding a patch past its chunk.
    ``only`` keeps the episodes whose ``method`` / ``scope`` / ``protocol`` / ``seed`` equal the given values
    (``None`` values ignored)."""
    job = job_rows.get_job(session, job_id)
    config = job.config or {}
    model = (config.get("model") or {}).get("name") or config.get("backend") or "model"
    wanted = {k: v for k, v in (only or {}).items() if v is not None}
    query = {"job_id": job.id, "r2e_filter": r2e_filter, "include_interactive": include_interactive, "only": wanted}
    out = Export(job.id, model, query=query)
    files: dict[Configuration, int] = defaultdict(int)
    interactive: dict[Configuration, list[tuple[str, str]]] = defaultdict(list)
    for chunk in _predictions(session, query):
        for configuration, kept in chunk:
            if isinstance(kept, str):
                out.left_out[kept] = out.left_out.get(kept, 0) + 1
                continue
            files[configuration] += 1
            if is_interactive(kept.driver):
                interactive[configuration].append((kept.instance_id, kept.episode_id))
    out.files = dict(sorted(files.items()))
    out.interactive = [p for configuration in out.files for p in interactive[configuration]]
    return out


def prediction_lines(predictions: list[Prediction], model_name: str) -> str:
    """JSONL, one ``{"instance_id", "model_name_or_path", "model_patch"}`` per line (the harness's fields)."""
    return "".join(
        json.dumps({"instance_id": p.instance_id, "model_name_or_path": model_name, "model_patch": p.patch}) + "\n"
        for p in predictions
    )


def write_one(session: Any, found: Export, model_name: str, write: Callable[[str], object]) -> None:
    """Stream ``found``'s predictions (one configuration) as JSONL to ``write``, a chunk's lines per call."""
    for chunk in _predictions(session, found.query):
        text = prediction_lines([p for c, p in chunk if isinstance(p, Prediction) and c in found.files], model_name)
        if text:
            write(text)


def write_each(session: Any, found: Export, output_dir: Path) -> None:
    """Stream ``found``'s predictions into one JSONL file per configuration in ``output_dir`` (which exists), each
    named by its ``model_name``; a chunk's lines are appended to their files as they come. ``OSError`` as raised."""
    names = {c: c.model_name(found.model) for c in found.files}
    for configuration in found.files:  # emptied first, so a file written before is replaced, not appended to
        (output_dir / file_name(names[configuration])).write_text("", encoding="utf-8")
    for chunk in _predictions(session, found.query):
        by_file: dict[Configuration, list[Prediction]] = defaultdict(list)
        for configuration, p in chunk:
            if isinstance(p, Prediction) and configuration in names:
                by_file[configuration].append(p)
        for configuration, predictions in by_file.items():
            name = names[configuration]
            with (output_dir / file_name(name)).open("a", encoding="utf-8") as f:
                f.write(prediction_lines(predictions, name))


def file_name(model_name: str) -> str:
    """A predictions file name for ``model_name`` (``/`` in a hub id and other odd characters become ``_``)."""
    return re.sub(r"[^A-Za-z0-9._+-]", "_", model_name) + ".jsonl"
