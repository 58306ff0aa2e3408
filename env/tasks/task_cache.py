"""A worker process's task sources, each loaded once: a Hugging Face dataset or a suite folder is read on the
first episode that needs it, not once per episode and once more per grade.

One ``TaskCache`` lives per worker process (``workers.celery_tasks``) and is handed to
``workers.execution.execute_episode`` and ``workers.grade_stored.grade_stored_episode``; the CLI's one-episode paths
load their one task directly. A source that changes on disk while the worker runs is not seen until the worker restarts.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agent_runner.config import EpisodeSpec
    from env.tasks.ceilings import GradingCeilings
    from env.tasks.loading import Task


class TaskCache:
    """Loaded task sources keyed by (suite, file, split); safe to share between a worker's threads.

    ``ceilings``: the operator's ceilings on a task row's own grading limits (``ServiceSettings.grading_ceilings``;
    None: the defaults), applied when a source is loaded and again when its tasks are graded."""

    def __init__(self, ceilings: GradingCeilings | None = None) -> None:
        self.ceilings = ceilings
        self._sources: dict[tuple[str | None, str | None, str | None], list[Task]] = {}
        self._lock = threading.Lock()

    def task(self, spec: EpisodeSpec) -> Task:
        """``spec``'s task; its source is loaded on first use. ``env.tasks.loading.TaskNotFound`` (a ValueError) names
        the source and the ids it has; a source that cannot be loaded raises as ``load_source`` does (and is
        tried again next time)."""
        from env.tasks.loading import load_source, pick_task

        source = spec.task_source()
        key = (source["suite"], source["file"], source["split"])
        with self._lock:  # one load per source even when several episodes start at once
            if key not in self._sources:
                self._sources[key] = load_source(**source, ceilings=self.ceilings)
            tasks = self._sources[key]
        return pick_task(tasks, spec.task_id, source=str(source["file"] or source["suite"]))
