"""float32 against bfloat16 on the same demonstrations: does measuring in bfloat16 change a conclusion?

Reads a results database where one expert job's trajectories were replayed in both dtypes (``nexus-eval replay JOB
--model smollm2-135m --dtype float32 ...`` and ``--dtype bfloat16 ...``, same methods, scopes, protocols and
densities) and prints, per (scope, protocol, density), every method's copy top-1 and copy ΔNLL in each dtype side by
side, the difference, each dtype's ranking of the methods, and whether each sign-flip test against dense and SnapKV
lands on the same side of 0.05. Both dtypes' cells come from the action table (``results.action_stats``), which
pairs every cell with the dense replay of its own dtype.

    python bench/dtype_agreement.py --db RESULTS.db --job JOB --out bench/out/dtype_agreement.json

``--probe-runs FP32_RUN BF16_RUN`` (``nexus-eval probe run --dtype float32`` and ``--dtype bfloat16``, same settings)
compares two probe runs likewise: per probe, protocol and variant, accuracy (or NLL) in each dtype and the
difference, and whether each McNemar test against dense lands on the same side of 0.05.
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
    dense = {}  # dense keeps every token: its cell (density None) heads every density's group of its protocol
    for (scope, protocol, density, method), both in cells.items():
        if not set(DTYPES) <= set(both):
            continue
        if density is None:
            dense[protocol] = both
        else:
            groups.setdefault((scope, protocol, density), {})[method] = both
    for key, methods in groups.items():
        if key[1] in dense:
            groups[key] = {"dense": dense[key[1]], **methods}
    records = []
    for (scope, protocol, density), methods in sorted(groups.items(), key=lambda kv: [str(x) for x in kv[0]]):
        rows, flips = [], []
        for method, both in methods.items():
            f, b = both["float32"], both["bfloat16"]
            if f["tasks"] != b["tasks"]:  # the same demonstrations in both, or the difference says nothing
                raise SystemExit(f"{protocol} {method}: {f['tasks']} tasks in float32, {b['tasks']} in bfloat16")
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
        ranks = {
            d: _rank({r["method"]: r["copy_top1"][i] for r in rows if r["method"] != "dense"})
            for i, d in enumerate(DTYPES)
        }
        largest = max((r for r in rows if r["method"] != "dense"), key=lambda r: abs(r["copy_top1_diff"] or 0.0))
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


def probe_agreement(db_file: str, runs: list[str]) -> list[dict]:
    """One record per probe cell measured in both runs: (probe, protocol, variant), each dtype's value, the
    difference, and the McNemar p against dense in each."""
    from db.connection import connect
    from results.probe_stats import load_probe_table

    db = connect(f"sqlite:///{db_file}", upgrade=False)
    tables = {}
    with db.session() as s:
        for run in runs:
            table = load_probe_table(s, run)
            tables[table.dtype] = {(c.probe, c.protocol, c.scope, c.density, c.variant): c for c in table.cells}
    if set(tables) != set(DTYPES):
        raise SystemExit(f"--probe-runs: need one float32 and one bfloat16 run, got {sorted(map(str, tables))}")
    out = []
    for key, f in tables["float32"].items():
        b = tables["bfloat16"].get(key)
        if b is None:
            continue
        value = "accuracy" if f.accuracy is not None else "nll"
        fv, bv = getattr(f, value), getattr(b, value)
        p = [c.vs.get("dense").p_value if c.vs.get("dense") else None for c in (f, b)]
        out.append(dict(probe=key[0], protocol=key[1], variant=key[4], value=value, float32=fv, bfloat16=bv,
                        diff=None if None in (fv, bv) else bv - fv, n=(f.n, b.n), p_vs_dense=p))  # fmt: skip
    return out


def _probe_value(r: dict, v: float | None) -> str:
    if v is None:
        return "-"
    return f"{100 * v:.0f}%" if r["value"] == "accuracy" else f"{v:.3f}"


def probe_table_text(records: list[dict]) -> str:
    lines = [
        "| probe | protocol | variant | n | fp32 | bf16 | diff | p vs dense fp32 | bf16 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in records:
        d = r["diff"]
        diff = "-" if d is None else (f"{100 * d:+.0f} pts" if r["value"] == "accuracy" else f"{d:+.3f}")
        p = ["-" if v is None else f"{v:.3g}" for v in r["p_vs_dense"]]
        cells = [r["probe"], r["protocol"], r["variant"], f"{r['n'][0]}/{r['n'][1]}", _probe_value(r, r["float32"]),
                 _probe_value(r, r["bfloat16"]), diff, *p]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--db", required=True, help="a results database with the job's replays in both dtypes")
    ap.add_argument("--job", help="the expert job's id (replays)")
    ap.add_argument("--probe-runs", nargs=2, metavar=("RUN", "RUN"), help="a float32 and a bfloat16 probe run")
    ap.add_argument("--out", default=str(ROOT / "bench/out/dtype_agreement.json"))
    args = ap.parse_args(argv)
    if args.probe_runs:
        records = probe_agreement(args.db, args.probe_runs)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(records, indent=1))
        print(probe_table_text(records))
        return
    if not args.job:
        raise SystemExit("give --job (replays) or --probe-runs")
    records = agreement(cells_by_dtype(args.db, args.job))
    if not records:
        raise SystemExit(f"job {args.job}: no cell was replayed in both float32 and bfloat16")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(records, indent=1))
    print(table(records))


if __name__ == "__main__":
    main()
