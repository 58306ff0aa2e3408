"""float32 against bfloat16 on the same demonstrations: does measuring in bfloat16 change a conclusion?

Reads a results database where one expert job's trajectories were replayed in both dtypes (``nexus-eval replay JOB
--model smollm2-135m --dtype float32 ...`` and ``--dtype bfloat16 ...``, same methods, scopes, protocols and
densities) and prints, per (scope, protocol, density), every method's copy top-1 and copy ΔNLL in each dtype side by
side, the difference, each dtype's ranking of the methods, and whether each sign-flip test against dense and SnapKV
lands on the same side of 0.05. Both dtypes' cells come from the action table (``results.action_stats``), which
pairs every cell with the dense replay of its own dtype.

    python bench/dtype_agreement.py --db RESULTS.db --job JOB --out bench/out/dtype_agreement.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if sys.path and Path(sys.path[0]).resolve() == ROOT / "bench":
    sys.path.pop(0)
DTYPES = ("float32", "bfloat16")
ALPHA = 0.05


def cells_by_dtype(db_file: str, job: str) -> dict[tuple, dict[str, dict]]:
    """{(scope, protocol, density, method): {dtype: cell dict}} of the job's action table."""
    from db.connection import connect
    from results.compare import compare_jobs

    db = connect(f"sqlite:///{db_file}", upgrade=False)
    with db.session() as s:
        table = compare_jobs(s, [job])
    out: dict[tuple, dict[str, dict]] = {}
    for cell in table.action:
        if cell.dtype in DTYPES:
            key = (cell.scope, cell.protocol, cell.density, cell.method)
            out.setdefault(key, {})[cell.dtype] = cell.to_dict()
    return out


def _rank(values: dict[str, float | None]) -> list[str]:
    return sorted((m for m, v in values.items() if v is not None), key=lambda m: -values[m])


def agreement(cells: dict[tuple, dict[str, dict]]) -> list[dict]:
    """One record per (scope, protocol, density): the methods side by side, the rankings, what changed."""
    groups: dict[tuple, dict[str, dict[str, dict]]] = {}
    for (scope, protocol, density, method), both in cells.items():
        if set(DTYPES) <= set(both):
            groups.setdefault((scope, protocol, density), {})[method] = both
    records = []
    for (scope, protocol, density), methods in sorted(groups.items(), key=lambda kv: [str(x) for x in kv[0]]):
        rows, flips = [], []
        for method, both in methods.items():
            f, b = both["float32"], both["bfloat16"]
            row = dict(method=method, tasks=(f["tasks"], b["tasks"]))
            for field in ("copy_top1", "delta_copy_nll", "copy_exact"):
                row[field] = (f[field], b[field])
                row[f"{field}_diff"] = None if None in (f[field], b[field]) else b[field] - f[field]
            for test in ("p_vs_dense", "p_vs_snapkv"):
                sides = [None if c[test] is None else c[test] < ALPHA for c in (f, b)]
                row[test] = (f[test], b[test])
                if sides[0] is not None and sides[0] != sides[1]:
                    flips.append(f"{method} {test}: {f[test]:.3g} in float32, {b[test]:.3g} in bfloat16")
            rows.append(row)
        ranks = {d: _rank({r["method"]: r["copy_top1"][i] for r in rows}) for i, d in enumerate(DTYPES)}
        largest = max(rows, key=lambda r: abs(r["copy_top1_diff"] or 0.0))
        records.append(
            dict(scope=scope, protocol=protocol, density=density, rows=rows, ranking=ranks,
                 same_ranking=ranks["float32"] == ranks["bfloat16"], significance_changes=flips,
                 largest_copy_top1_diff=dict(method=largest["method"], diff=largest["copy_top1_diff"]))
        )  # fmt: skip
    return records


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.1f}"


def table(records: list[dict]) -> str:
    lines = []
    for rec in records:
        lines += [
            f"\n**{rec['protocol']}, {rec['scope']}, density {rec['density']}**\n",
            "| method | tasks | copy top-1 % fp32 | bf16 | diff (points) | copy ΔNLL fp32 | bf16 "
            "| p vs dense fp32 | bf16 |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for r in rec["rows"]:
            d = r["copy_top1_diff"]
            nll = ["-" if v is None else f"{v:+.2f}" for v in r["delta_copy_nll"]]
            p = ["-" if v is None else f"{v:.3g}" for v in r["p_vs_dense"]]
            cells = [r["method"], "/".join(map(str, r["tasks"])), _pct(r["copy_top1"][0]), _pct(r["copy_top1"][1]),
                     "-" if d is None else f"{100 * d:+.1f}", *nll, *p]  # fmt: skip
            lines.append("| " + " | ".join(cells) + " |")
        lines.append(f"\nranking by copy top-1, float32: {', '.join(rec['ranking']['float32'])}")
        lines.append(f"ranking by copy top-1, bfloat16: {', '.join(rec['ranking']['bfloat16'])}")
        big = rec["largest_copy_top1_diff"]
        lines.append(f"largest difference: {big['method']} {100 * (big['diff'] or 0):+.1f} points")
        lines.append(f"tests that change side of {ALPHA}: {'; '.join(rec['significance_changes']) or 'none'}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--db", required=True, help="a results database with the job's replays in both dtypes")
    ap.add_argument("--job", required=True, help="the expert job's id")
    ap.add_argument("--out", default=str(ROOT / "bench/out/dtype_agreement.json"))
    args = ap.parse_args(argv)
    records = agreement(cells_by_dtype(args.db, args.job))
    if not records:
        raise SystemExit(f"job {args.job}: no cell was replayed in both float32 and bfloat16")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(records, indent=1))
    print(table(records))


if __name__ == "__main__":
    main()
