"""Coding tasks: one ``Task`` for SWE-bench, R2E-Gym and local task folders, the loaders, the bundled suites,
the task images and the agent's sandbox layouts (docs/tasks.md).

The loaders are re-exported here: ``from env.tasks import load_tasks, load_suite, Task, TaskError``.
"""

from env.tasks.loading import (
    Task,
    TaskError,
    TaskNotFound,
    find_task,
    known_suites,
    load_local_task,
    load_suite,
    load_tasks,
)

__all__ = [
    "Task",
    "TaskError",
    "TaskNotFound",
    "find_task",
    "known_suites",
    "load_local_task",
    "load_suite",
    "load_tasks",
]
