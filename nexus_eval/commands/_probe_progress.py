"""Progress of ``nexus-eval probe run`` on stderr: a rich bar on a terminal, one plain line per result in a pipe.

A pipe (a CI log, ``| tee``) gets no redrawn bar: every finished sample of a cell is one line that says where
the run is (``[12/80]``), which cell and sample it was and what it measured, so a log read later shows
the whole run and where it stopped.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import typer


def describe(result: Any) -> str:
    """``needle snapkv prefill_only/single_prefill density 0.2 sample 3: wrong (0.41 s)``."""
    measured = []
    if result.correct is not None:
        measured.append("correct" if result.correct else "wrong")
    if result.nll is not None:
        measured.append(f"nll {result.nll:.3f}")
    where = f"{result.probe} {result.variant} {result.scope}/{result.protocol} density {result.density}"
    return f"{where} sample {result.sample}: {', '.join(measured) or 'done'} ({result.seconds:.2f} s)"


@contextmanager
def progress(console: Any, total: int) -> Iterator[Callable[[Any], None]]:
    """Yields ``advance(result)``, to call once per stored result."""
    if console.is_terminal:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        with Progress(*columns, console=console) as bar:
            task = bar.add_task("probes", total=total)
            yield lambda result: bar.update(task, advance=1, description=describe(result).split(":")[0])
        return
    done = 0

    def advance(result: Any) -> None:
        nonlocal done
        done += 1
        typer.echo(f"[{done}/{total}] {describe(result)}", err=True)

    yield advance
