"""The one list of table formats every verb that prints a table takes (``compare``, ``episodes``, ``probe show``,
``run``, ``agent-case``), and the writers they share: a delimited line (csv / tsv) and a markdown line.

``tsv`` is ``csv`` with a tab for the comma (the same quoting rule: a field holding the delimiter, a quote or a
line break is quoted), so the two read back with ``csv.reader(..., delimiter=...)`` alike."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable

TABLE_FORMATS = ("table", "csv", "tsv", "json", "markdown")
FORMAT_HELP = " | ".join(TABLE_FORMATS)
DELIMITERS = {"csv": ",", "tsv": "\t"}


def unknown_format(fmt: str) -> str | None:
    """The message for a format no table verb takes (None for a known one)."""
    return None if fmt in TABLE_FORMATS else f"unknown --format {fmt!r}; use one of {', '.join(TABLE_FORMATS)}"


def delimited_line(values: Iterable[object], fmt: str) -> str:
    """One csv or tsv line (no line end) of ``values`` as text."""
    out = io.StringIO()
    csv.writer(out, delimiter=DELIMITERS[fmt], lineterminator="\n").writerow(values)
    return out.getvalue()[:-1]


def csv_to_tsv(text: str) -> str:
    """A csv text as tsv: the same rows and fields, tab-separated."""
    return "".join(delimited_line(row, "tsv") + "\n" for row in csv.reader(io.StringIO(text)))


def markdown_line(values: Iterable[object]) -> str:
    """One markdown table line (a ``|`` inside a value is escaped)."""
    return "| " + " | ".join(str(v).replace("|", "\\|") for v in values) + " |"
