"""Observation masking and newest-turn-only compression beside the KV methods: the agent's case table of issue 47.

Reads an agent-case job's replays (``nexus-eval replay JOB --model smollm2-135m`` with the methods below; see
docs/agent_case.md section 6 for the commands) and prints, per protocol and density (prefill-only):

1. one row per setting (a method, or a variant's label such as ``snapkv[candidates=newest_turn]``): copy top-1 with
   its bootstrap interval over tasks, ΔNLL against dense, the KV it held (the mean over turns of the bytes held
   after each turn, and the largest held during a turn, in MB), and sign-flip p values over tasks against dense and
   against ``observation_masking[rule=budget]`` (equal memory: the same density budget);
2. the protocol gap: per setting, true eviction minus full context copy top-1, paired by task;
3. what each setting loses against dense, by how far back the copied source was and by what produced it (the tool
   call whose output the source is: a file view, a test run, a listing, a search result, an edit's snippet).

    python bench/turn_baselines.py --db bench/out/sweep.db --job 8405c0c4 --dtype bfloat16
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

#: the settings of the issue's table, in table order (labels as compare names them)
SETTINGS = (
    "dense",
    "snapkv",
    "snapkv[candidates=newest_turn]",
    "h2o",
    "streaming_llm",
    "nexus",
    "nexus[candidates=newest_turn]",
    "ada_nexus",
    "observation_masking",
    "observation_masking[keep_latest=3]",
    "observation_masking[rule=budget]",
)
EQUAL_MEMORY = "observation_masking[rule=budget]"
PROTOCOLS = ("true_eviction", "full_context")


def source_kind(action: dict | None) -> str:
    """What produced an observation, from the tool call before it (``turns.action``)."""
    if not action:
        return "other"
    name, args = action.get("name"), action.get("arguments") or {}
    if name == "search":
        return "search result"
    if name == "file_editor":
        return "file view" if args.get("command") == "view" else "edit snippet"
    if name == "execute_bash":
        return "test run" if "pytest" in (args.get("cmd") or "") or "test" in (args.get("cmd") or "") else "listing"
    return name or "other"


def _kinds(s, episode_ids) -> dict[tuple[str, int], str]:
    """{(episode, user message index): source kind}: user message i >= 1 is turn i-1's observation."""
    from sqlalchemy import select

    from db.models import Turn

    out = {}
    for episode, index, action in s.execute(
        select(Turn.episode_id, Turn.index, Turn.action).where(Turn.episode_id.in_(list(episode_ids)))
    ):
        out[(episode, index + 1)] = source_kind(action)
    return out


def collect(db_file: str, job: str, dtype: str) -> dict:
    from db.connection import connect
    from db.measure_models import Replay
    from jobs.variants import row_labels
    from results.action_outcomes import distance_bucket, outcomes_from_rows
    from results.action_stats import _per_task
    from results.stats import bootstrap_mean_ci, sign_flip_test

    db = connect(f"sqlite:///{db_file}", upgrade=False)
    with db.session() as s:
        rows = s.query(Replay).filter(Replay.job_id.like(f"{job}%"), Replay.status == "ok", Replay.dtype == dtype).all()
        rows = [r for r in rows if r.method == "dense" or r.scope == "prefill_only"]
        labels = row_labels(rows)
        outcomes = outcomes_from_rows(rows)
        kinds = _kinds(s, {r.episode_id for r in rows})
        # per (label, protocol, density): held MB per row; per task: span sums by distance bucket and source kind
        held: dict[tuple, list[tuple[float, float]]] = defaultdict(list)
        by: dict[tuple, dict[str, dict[str, list[float]]]] = defaultdict(lambda: defaultdict(dict))
        for r, label in zip(rows, labels, strict=True):
            density = None if r.method == "dense" else (r.config or {}).get("density")
            turns = r.turns or []
            if turns:
                mean = sum(t.get("kv_held_bytes") or 0 for t in turns) / len(turns) / 1e6
                peak = max(t.get("kv_peak_held_bytes") or 0 for t in turns) / 1e6
                held[(label, r.protocol, density)].append((mean, peak))
            for t in turns:
                for span in t.get("spans") or ():
                    if span.get("kind") != "copy" or span.get("top1") is None or span.get("tokens", 0) < 2:
                        continue
                    n = span["tokens"] - 1
                    source = span.get("source")
                    groups = [f"kind:{'task' if not source else kinds.get((r.episode_id, source), 'other')}"]
                    if span.get("back") is not None:
                        groups.append(f"back:{distance_bucket(int(span['back']))}")
                    for g in groups:
                        slot = by[(label, r.protocol, density)][g].setdefault(r.task_id, [0.0, 0.0, 0.0])
                        slot[0] += n
                        slot[1] += span["top1"] * n
                        slot[2] += 1

    per_task: dict[tuple, dict[str, float]] = {}
    for key in {(o.method, o.protocol, o.density) for o in outcomes}:
        mine = [
            o
            for o in outcomes
            if (o.method, o.protocol, o.density) == key and (o.scope == "prefill_only" or o.method == "dense")
        ]
        per_task[key] = {t: v.copy_top1 for t, v in _per_task(mine).items() if v.copy_top1 is not None}

    def paired(a: dict[str, float], b: dict[str, float]) -> dict | None:
        both = sorted(set(a) & set(b))
        if not both:
            return None
        diffs = [a[t] - b[t] for t in both]
        return dict(tasks=len(both), diff=sum(diffs) / len(diffs), p=sign_flip_test(diffs).p_value,
                    down=sum(d < 0 for d in diffs))  # fmt: skip

    densities = sorted({k[2] for k in per_task if k[2] is not None})
    table, gaps, losses = [], [], []
    for protocol in PROTOCOLS:
        dense = per_task.get(("dense", protocol, None), {})
        for density in densities:
            for label in SETTINGS:
                key = (label, protocol, None if label == "dense" else density)
                values = per_task.get(key)
                if not values:
                    continue
                ci = bootstrap_mean_ci(list(values.values())) if len(values) >= 2 else None
                h = held.get(key, [])
                row = dict(
                    setting=label, protocol=protocol, density=density, tasks=len(values),
                    copy_top1=sum(values.values()) / len(values), ci=list(ci) if ci else None,
                    held_mb=sum(x for x, _ in h) / len(h) if h else None,
                    peak_mb=sum(y for _, y in h) / len(h) if h else None,
                    vs_dense=None if label == "dense" else paired(values, dense),
                    vs_equal_memory=None if label in ("dense", EQUAL_MEMORY)
                    else paired(values, per_task.get((EQUAL_MEMORY, protocol, density), {})),
                )  # fmt: skip
                table.append(row)
                sums = by.get(key, {})
                for group, tasks in sorted(sums.items()):
                    base = by.get(("dense", protocol, None), {}).get(group, {})
                    mine = {t: v[1] / v[0] for t, v in tasks.items() if v[0]}
                    ref = {t: v[1] / v[0] for t, v in base.items() if v[0]}
                    both = sorted(set(mine) & set(ref))
                    if both:
                        losses.append(dict(setting=label, protocol=protocol, density=density, group=group,
                                           tasks=len(both), spans=int(sum(tasks[t][2] for t in both)),
                                           top1=sum(mine[t] for t in both) / len(both),
                                           dense=sum(ref[t] for t in both) / len(both)))  # fmt: skip
    for density in densities:
        for label in SETTINGS[1:]:
            te, fc = per_task.get((label, "true_eviction", density)), per_task.get((label, "full_context", density))
            if te and fc and (g := paired(te, fc)) is not None:
                gaps.append(dict(setting=label, density=density, **g))
    return dict(job=job, dtype=dtype, replays=len(rows), table=table, gaps=gaps, losses=losses)


def _pct(v) -> str:
    return "-" if v is None else f"{100 * v:.1f}"


def _test(t) -> str:
    return "-" if not t else f"{100 * t['diff']:+.1f} (p {t['p']:.2g}, {t['down']}/{t['tasks']} down)"


def markdown(data: dict) -> str:
    out = []
    for protocol in PROTOCOLS:
        for density in sorted({r["density"] for r in data["table"]}):
            rows = [r for r in data["table"] if r["protocol"] == protocol and r["density"] == density]
            if not rows:
                continue
            out += [f"\n**{protocol}, prefill-only, density {density}** ({data['dtype']})\n",
                    "| setting | tasks | copy top-1 % [95% CI] | KV held MB (mean / peak) | vs dense, points | "
                    "vs observation_masking[rule=budget], points |", "|---|---|---|---|---|---|"]  # fmt: skip
            for r in rows:
                ci = f" [{100 * r['ci'][0]:.0f}-{100 * r['ci'][1]:.0f}]" if r["ci"] else ""
                mb = "-" if r["held_mb"] is None else f"{r['held_mb']:.1f} / {r['peak_mb']:.1f}"
                out.append(f"| {r['setting']} | {r['tasks']} | {_pct(r['copy_top1'])}{ci} | {mb} | "
                           f"{_test(r['vs_dense'])} | {_test(r['vs_equal_memory'])} |")  # fmt: skip
    out += ["\n**the protocol gap**: true eviction minus full context, copy top-1, paired by task\n",
            "| density | setting | tasks | points (p, tasks down) |", "|---|---|---|---|"]  # fmt: skip
    out += [f"| {g['density']} | {g['setting']} | {g['tasks']} | {_test(g)} |" for g in data["gaps"]]
    out += ["\n**what is lost, by source** (copy top-1 %, per task then mean; dense on the same tasks)\n",
            "| protocol | density | setting | group | tasks | spans | top-1 % | dense % |",
            "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    out += [f"| {x['protocol']} | {x['density']} | {x['setting']} | {x['group']} | {x['tasks']} | {x['spans']} | "
            f"{_pct(x['top1'])} | {_pct(x['dense'])} |" for x in data["losses"] if x["setting"] != "dense"]  # fmt: skip
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--db", default=str(ROOT / "bench/out/sweep.db"))
    ap.add_argument("--job", required=True, help="the agent-case job (an id or its prefix)")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--out", default=str(ROOT / "bench/out/turn_baselines.json"))
    args = ap.parse_args(argv)
    data = collect(args.db, args.job, args.dtype)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(data, indent=1))
    print(f"job {data['job']}: {data['replays']} replays ok in {args.dtype}")
    print(markdown(data))


if __name__ == "__main__":
    main()
