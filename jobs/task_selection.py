"""Which tasks a job runs (a job file's ``tasks`` mapping): the source they come from, a bundled suite or a task
file, and the ids or glob patterns chosen from it.

Selecting is strict: an exact id the source lacks, or a pattern that matches nothing, is a ``JobSpecError``
naming the source, so a typo never silently shrinks a job.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from jobs.job_file import JobSpecError

_GLOB_CHARS = set("*?[")


class TaskSelection(BaseModel):
    """Where the tasks come from (exactly one of ``suite``/``file``) and which of them to run.

    ``ids``: exact task ids and/or glob patterns (``*``, ``?``, ``[...]``); ``None`` runs every task.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    suite: str | None = Field(None, description="a bundled suite name (env/tasks/suites/<name>) or a task folder")
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
            no_duplicates("ids", self.ids)
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
        """Load the source's tasks (``env.tasks.loading.Task`` objects) under the operator's grading ``ceilings``
        (``env.tasks.ceilings.GradingCeilings``; None: the defaults) and apply the selection."""
        from env.tasks.loading import load_source

        tasks = load_source(suite=self.suite, file=self.file, split=self.split, ceilings=ceilings)
        chosen = set(self.select([t.instance_id for t in tasks]))
        return [t for t in tasks if t.instance_id in chosen]


def _is_glob(pattern: str) -> bool:
    return bool(_GLOB_CHARS & set(pattern))


def no_duplicates(name: str, values: Sequence[Any]) -> None:
    """A validator's check that the list field ``name`` names each value once (a repeat would run twice)."""
    seen, dupes = set(), []
    for v in values:
        if v in seen:
            dupes.append(v)
        seen.add(v)
    if dupes:
        raise ValueError(f"'{name}' lists {dupes} more than once")
