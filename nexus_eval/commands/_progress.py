"""Progress of the long verbs (``run``, ``status --watch``, ``demo``, ``probe run``) on stderr, by one rule.

:func:`live` is the one place that decides how: a terminal that can redraw gets rich's live display (a bar,
or the job's status table); anything else (a pipe, a log file, ``2>&1 | tee``, ``TERM=dumb``) gets no
redrawn display but one plain line per finished item, in this one format (:func:`line`)::

    [3/10] <what finished>: <what it measured>

so a log read later shows the whole run and where it stopped. A plain line is written as is (:func:`say`):
no markup, no highlighting, never wrapped at the console's width.

Rich's ``Live`` prints its last frame *without* a final newline on a console that is not a terminal, so
whatever is written next starts on that frame's last line; these verbs never start a ``Live`` there.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


def live(console: Any) -> bool:
    """Whether ``console`` gets a live (redrawn) display; otherwise it gets plain lines."""
    return console.is_terminal and not console.is_dumb_terminal


def line(done: int, total: int, text: str) -> str:
    """``[done/total] text``: one finished item of ``total``."""
    return f"[{done}/{total}] {text}"


def say(console: Any, text: str) -> None:
    """``text`` and a newline on ``console``, as is."""
    console.out(text, highlight=False)


@contextmanager
def progress(console: Any, total: int, label: str, describe: Callable[[Any], str]) -> Iterator[Callable[[Any], None]]:
    """Yields ``advance(item)``, to call once per finished item: a bar named ``label`` on a live console
    (showing ``describe(item)`` up to its first ``:``), one :func:`line` of ``describe(item)`` elsewhere."""
    if live(console):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        with Progress(*columns, console=console) as bar:
            task = bar.add_task(label, total=total)
            yield lambda item: bar.update(task, advance=1, description=describe(item).split(":")[0])
        return
    done = 0

    def advance(item: Any) -> None:
        nonlocal done
        done += 1
        say(console, line(done, total, describe(item)))

    yield advance
