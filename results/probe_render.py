"""Text forms of a :class:`results.probe_stats.ProbeTable`: rich ``table``, ``json``, ``csv``, ``markdown``.

- ``table``: one rich table per probe, for a 140-column terminal. A setting that is the same in every cell of
  the probe (scope, protocol, density) goes to the table's title instead of a column, and columns that do not
  apply to the probe are left out (needle scores no tokens, nll asks no question). The KV memory columns
  (:data:`KV_COLUMNS`) follow in a small table of their own per probe (markdown has them in the one table).
- ``markdown``: the same tables for docs, then the caption (``ProbeTable.caption``: with the model and the dtype the
  run was measured in) and the notes. Every heading names the dtype too (``dtype not recorded`` for an older run).
- ``json``: ``ProbeTable.to_dict()``: the run, its settings and provenance, every cell with every number
  (fractions in [0, 1], full float precision), the notes.
- ``csv``: one line per cell, :data:`CSV_COLUMNS` (the McNemar columns once per baseline; the run's ``dtype`` last,
  '' where not recorded), floats as ``repr``.
"""

from __future__ import annotations

import csv
import io
from typing import Any

from results.compare_render import render_as
from results.probe_stats import BASELINES, KV_FIELDS, PairedTest, ProbeCell, ProbeTable

_DIMENSIONS = ("scope", "protocol", "density")
CSV_COLUMNS = [
    "run_id", "probe", "variant", "scope", "protocol", "density", "n", "n_correct", "accuracy", "ci_low", "ci_high",
    *(f"{stat}_vs_{b}" for b in BASELINES for stat in ("p", "b", "c", "pairs")),
    "nll", "delta_nll", "delta_ci_low", "delta_ci_high", "nll_pairs", "kept_fraction", *KV_FIELDS, "seconds",
    "dtype",  # the run's: what its model was measured in ('' where not recorded)
]  # fmt: skip


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def accuracy_text(c: ProbeCell) -> str:
    """``7/10 70.0% [39.7–89.2]``; ``-`` when the probe asks no question."""
    if c.accuracy is None:
        return "-"
    return f"{c.n_correct}/{c.n} {_pct(c.accuracy)} [{100 * c.ci_low:.1f}–{100 * c.ci_high:.1f}]"  # type: ignore[operator]


def paired_text(test: PairedTest | None) -> str:
    """``p=0.0312 (5:0, 10 pairs)``: the McNemar p, b:c and the pairs it rests on; ``-`` without a baseline."""
    return "-" if test is None else f"p={test.p_value:.3g} ({test.b}:{test.c}, {test.pairs} pairs)"


def delta_text(c: ProbeCell) -> str:
    """``+0.124 [+0.051, +0.210]``; the count and "too few for an interval" below the bootstrap's minimum;
    ``-`` without dense pairs."""
    if c.delta_nll is None:
        return "-"
    if c.delta_ci_low is None:
        return f"{c.delta_nll:+.3f} ({c.nll_pairs} samples: too few for an interval)"
    return f"{c.delta_nll:+.3f} [{c.delta_ci_low:+.3f}, {c.delta_ci_high:+.3f}]"


def kv_text(n_bytes: float | None) -> str:
    if n_bytes is None:
        return "-"
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n_bytes >= size:
            return f"{n_bytes / size:.1f} {unit}"
    return f"{n_bytes:.0f} B"


def _float(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


#: a probe cell's KV memory columns (nexus.memory): held and allocated when the answer started, and the largest
#: allocated at any moment of the sample
KV_COLUMNS: list[tuple[str, Any]] = [
    ("KV held", lambda c: kv_text(c.kv_held_bytes)),
    ("KV alloc", lambda c: kv_text(c.kv_allocated_bytes)),
    ("KV alloc peak", lambda c: kv_text(c.kv_peak_allocated_bytes)),
]


def layout(cells: list[ProbeCell], *, memory: bool = True) -> tuple[str, list[tuple[str, Any]]]:
    """(title suffix, [(header, cell -> text)]) of one probe's cells: constant settings go to the title, and
    only the columns the probe has numbers for are kept."""
    constant = [d for d in _DIMENSIONS if len({getattr(c, d) for c in cells}) == 1]
    suffix = ", ".join(f"{d} {getattr(cells[0], d)}" for d in constant) if cells else ""
    columns: list[tuple[str, Any]] = [("variant", lambda c: c.variant)]
    columns += [(d, lambda c, d=d: str(getattr(c, d))) for d in _DIMENSIONS if d not in constant]
    if any(c.accuracy is not None for c in cells):
        columns.append(("accuracy (95% CI)", accuracy_text))  # k/n: the n column would repeat it
        for b in BASELINES:
            if any(c.vs.get(b) for c in cells):
                columns.append((f"vs {b}", lambda c, b=b: paired_text(c.vs.get(b))))
    else:
        columns.append(("n", lambda c: str(c.n)))
    if any(c.nll is not None for c in cells):
        columns.append(("NLL", lambda c: _float(c.nll, ".3f")))
        if any(c.delta_nll is not None for c in cells):
            columns.append(("ΔNLL vs dense (95% CI)", delta_text))
    columns += [
        ("kept", lambda c: _pct(c.kept_fraction)),
        *(KV_COLUMNS if memory else []),
        ("s", lambda c: _float(c.seconds, ".2f")),
    ]
    return suffix, columns


def memory_layout(cells: list[ProbeCell]) -> list[tuple[str, Any]]:
    """The columns of a probe's KV memory table (the terminal's: its quality table has no room for them): the
    cell's variant and the settings that vary, then :data:`KV_COLUMNS`."""
    _, columns = layout(cells, memory=False)
    return [col for col in columns if col[0] == "variant" or col[0] in _DIMENSIONS] + KV_COLUMNS


def heading(table: ProbeTable) -> str:
    r = table.run
    dtype = table.dtype or "dtype not recorded"
    return f"probe run {r['id']} · {r['model']} · {dtype} · {r['status']} · {r['n_results']}/{r['n_planned']} results"


def _csv_num(x: float | None) -> str:
    return "" if x is None else repr(float(x))


def to_csv(table: ProbeTable) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for c in table.cells:
        paired = []
        for b in BASELINES:
            t = c.vs.get(b)
            paired += ["", "", "", ""] if t is None else [_csv_num(t.p_value), t.b, t.c, t.pairs]
        writer.writerow(
            [
                table.run["id"], c.probe, c.variant, c.scope, c.protocol, repr(c.density), c.n,
                "" if c.n_correct is None else c.n_correct, _csv_num(c.accuracy), _csv_num(c.ci_low),
                _csv_num(c.ci_high), *paired, _csv_num(c.nll), _csv_num(c.delta_nll), _csv_num(c.delta_ci_low),
                _csv_num(c.delta_ci_high), c.nll_pairs, _csv_num(c.kept_fraction),
                *(_csv_num(getattr(c, name)) for name in KV_FIELDS), _csv_num(c.seconds),
                table.dtype or "",
            ]
        )  # fmt: skip
    return out.getvalue()


def to_markdown(table: ProbeTable) -> str:
    lines = [f"**{heading(table)}**", ""]
    for probe in table.probes:
        suffix, columns = layout(table.cells_of(probe))
        lines += [f"### {probe}" + (f" ({suffix})" if suffix else ""), ""]
        lines += ["| " + " | ".join(h for h, _ in columns) + " |", "|" + "---|" * len(columns)]
        lines += ["| " + " | ".join(f(c) for _, f in columns) + " |" for c in table.cells_of(probe)]
        lines.append("")
    if not table.cells:
        lines += ["No results stored.", ""]
    lines += [table.caption, ""] + [f"Note: {n}" for n in table.notes]
    return "\n".join(lines).rstrip() + "\n"


def rich_tables(table: ProbeTable) -> list[Any]:
    """rich renderables: a heading, one table per probe, the caption and the notes."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    out: list[Any] = [Text(heading(table), style="bold")]
    for probe in table.probes:
        suffix, columns = layout(table.cells_of(probe), memory=False)  # the KV columns: a table of their own
        # no vertical rules: the columns' room goes to the numbers (140 terminal columns for later_turn)
        t = Table(title=probe + (f" · {suffix}" if suffix else ""), title_justify="left", box=box.SIMPLE_HEAD)
        for i, (header, _) in enumerate(columns):
            t.add_column(header, justify="left" if i == 0 else "right", overflow="fold")
        for c in table.cells_of(probe):
            t.add_row(*(f(c) for _, f in columns))
        out.append(t)
        memory = Table(title=f"{probe} · KV memory", title_justify="left", box=box.SIMPLE_HEAD)
        kv_columns = memory_layout(table.cells_of(probe))
        for i, (header, _) in enumerate(kv_columns):
            memory.add_column(header, justify="left" if i == 0 else "right")
        for c in table.cells_of(probe):
            memory.add_row(*(f(c) for _, f in kv_columns))
        out.append(memory)
    if not table.cells:
        out.append(Text("No results stored."))
    out.append(Text(table.caption, style="dim"))
    out += [Text(f"note: {n}", style="yellow") for n in table.notes]
    return out


def render(table: ProbeTable, fmt: str = "table", *, width: int = 140) -> str:
    """The table as text in ``fmt`` (one of ``results.compare_render.FORMATS``)."""
    return render_as(table, fmt, width=width, csv_of=to_csv, markdown_of=to_markdown, renderables_of=rich_tables)
