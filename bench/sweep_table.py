"""The full demonstration sweep as docs/agent_case.md tables it: every method x scope x protocol x density.

Reads the sweep's results database (``bench/throughput.py --parts sweep``, or ``nexus-eval agent-case --tasks '*'``
with every method, both scopes, both protocols and 0.1/0.2/0.3) and prints, for one dtype:

1. per protocol and density, one row per method and scope: copy top-1 with its bootstrap interval over tasks, copy
   ΔNLL against dense, greedy-exact copies, the source's held share, the sign-flip p against dense and SnapKV (the
   action table's cells, ``results.action_stats``), and beside them the KV memory the method held: the mean over
   episodes of each replay's largest held bytes over its turns (``TurnScore.kv_peak_held_bytes``), in MB;
2. what prefill+decode changes against prefill-only: per method, protocol and density, the difference of copy top-1
   over the tasks both scopes measured, its sign-flip p over tasks, and how many tasks went down.

    python bench/sweep_table.py --db bench/out/sweep.db --dtype bfloat16 --out bench/out/sweep_table.json
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if sys.path and Path(sys.path[0]).resolve() == ROOT / "bench":
    sys.path.pop(0)


def _job(s, job: str | None) -> str:
    from db.models import Job

    if job:
        return job
    found = s.query(Job).filter(Job.name == "agent-case").order_by(Job.created_at.desc()).first()
    if found is None:
        raise SystemExit("no agent-case job in this database (give --job)")
    return found.id


def _held_mb(s, job: str, dtype: str) -> dict[tuple, float]:
    """{(method, scope, protocol, density): mean over episodes of the largest held KV bytes of a turn, in MB}."""
    from db.measure_models import Replay

    peaks: dict[tuple, list[float]] = defaultdict(list)
    rows = s.query(Replay).filter(Replay.job_id == job, Replay.status == "ok", Replay.dtype == dtype)
    for r in rows:
        density = None if r.method == "dense" else (r.config or {}).get("density")
        peak = max((t.get("kv_peak_held_bytes") or 0 for t in r.turns or ()), default=0)
        peaks[(r.method, r.scope, r.protocol, density)].append(peak / 1e6)
    return {k: sum(v) / len(v) for k, v in peaks.items()}


def _scope_change(outcomes, method: str, protocol: str, density: float) -> dict | None:
    """prefill_decode minus prefill_only copy top-1 of one method, paired by task (tokens pooled per task)."""
    from results.action_stats import _per_task
    from results.stats import sign_flip_test

    def per_task(scope: str):
        mine = [o for o in outcomes if (o.method, o.scope, o.protocol, o.density) == (method, scope, protocol, density)]
        return {t: v.copy_top1 for t, v in _per_task(mine).items() if v.copy_top1 is not None}

    po, pd = per_task("prefill_only"), per_task("prefill_decode")
    diffs = [pd[t] - po[t] for t in sorted(set(po) & set(pd))]
    if not diffs:
        return None
    test = sign_flip_test(diffs)
    return dict(method=method, protocol=protocol, density=density, tasks=len(diffs),
                diff=sum(diffs) / len(diffs), p=test.p_value, down=sum(d < 0 for d in diffs))  # fmt: skip


def collect(db_file: str, job: str | None, dtype: str) -> dict:
    from db.connection import connect
    from db.measure_models import Replay
    from results.action_outcomes import outcomes_from_rows
    from results.compare import compare_jobs

    db = connect(f"sqlite:///{db_file}", upgrade=False)
    with db.session() as s:
        job = _job(s, job)
        table = compare_jobs(s, [job])
        held = _held_mb(s, job, dtype)
        rows = s.query(Replay).filter(Replay.job_id == job, Replay.status == "ok", Replay.dtype == dtype).all()
        outcomes = outcomes_from_rows(rows)
        counts = dict(ok=len(rows), failed=s.query(Replay).filter(Replay.job_id == job, Replay.status != "ok").count())
    cells = [c.to_dict() for c in table.action if c.dtype == dtype]
    for c in cells:
        c["held_mb"] = held.get((c["method"], c["scope"], c["protocol"], c["density"]))
    methods = list(dict.fromkeys(c["method"] for c in cells if c["method"] != "dense"))
    changes = [
        change
        for protocol in ("true_eviction", "full_context")
        for density in sorted({c["density"] for c in cells if c["density"] is not None})
        for method in methods
        if (change := _scope_change(outcomes, method, protocol, density)) is not None
    ]
    return dict(job=job, dtype=dtype, replays=counts, cells=cells, scope_changes=changes)


def _pct(v) -> str:
    return "-" if v is None else f"{100 * v:.1f}"


def _p(v) -> str:
    return "-" if v is None else f"{v:.3g}"


def markdown(data: dict) -> str:
    cells = data["cells"]
    dense = {c["protocol"]: c for c in cells if c["method"] == "dense"}
    out = []
    for protocol in ("true_eviction", "full_context"):
        for density in sorted({c["density"] for c in cells if c["density"] is not None}):
            mine = [c for c in cells if c["protocol"] == protocol and c["density"] == density]
            if not mine:
                continue
            out += [
                f"\n**{protocol}, density {density}** ({data['dtype']})\n",
                "| method | scope | tasks | copy spans | copy top-1 % [95% CI] | ΔNLL copy vs dense | greedy-exact % "
                "| source held % | p vs dense | p vs SnapKV | KV held MB (peak) |",
                "|---|---|---|---|---|---|---|---|---|---|---|",
            ]
            for c in [dense.get(protocol), *sorted(mine, key=lambda c: (c["scope"], 0))]:
                if c is None:
                    continue
                ci = c["copy_top1_ci"]
                top1 = _pct(c["copy_top1"]) + (f" [{100 * ci[0]:.0f}-{100 * ci[1]:.0f}]" if ci else "")
                nll = "-" if c["delta_copy_nll"] is None else f"{c['delta_copy_nll']:+.2f}"
                held = "-" if c.get("held_mb") is None else f"{c['held_mb']:.1f}"
                scope = "-" if c["method"] == "dense" else c["scope"]
                row = [c["method"], scope, c["tasks"], c["spans"], top1, nll, _pct(c["copy_exact"]),
                       _pct(c["copy_held"]), _p(c["p_vs_dense"]), _p(c["p_vs_snapkv"]), held]  # fmt: skip
                out.append("| " + " | ".join(map(str, row)) + " |")
    out += [
        "\n**prefill+decode against prefill-only** (copy top-1, paired by task)\n",
        "| protocol | density | method | tasks | difference (points) | tasks down | p (sign-flip) |",
        "|---|---|---|---|---|---|---|",
    ]
    for ch in data["scope_changes"]:
        row = [ch["protocol"], ch["density"], ch["method"], ch["tasks"], f"{100 * ch['diff']:+.1f}",
               f"{ch['down']}/{ch['tasks']}", _p(ch["p"])]  # fmt: skip
        out.append("| " + " | ".join(map(str, row)) + " |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--db", default=str(ROOT / "bench/out/sweep.db"))
    ap.add_argument("--job", help="the sweep's job (default: the newest agent-case job)")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--out", default=str(ROOT / "bench/out/sweep_table.json"))
    args = ap.parse_args(argv)
    data = collect(args.db, args.job, args.dtype)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(data, indent=1))
    print(f"job {data['job']}: {data['replays']['ok']} replays ok in {args.dtype}, {data['replays']['failed']} not ok")
    print(markdown(data))


if __name__ == "__main__":
    main()
