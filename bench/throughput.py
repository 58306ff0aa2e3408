"""Measurement throughput: the probe runs and the demonstration replays, before / after, side by side in one run.

Each measurement runs in a fresh process with one torch thread, timed from its start to its last result (model
loading included, as a user runs it):

  probe          README's probe run: dense, SnapKV, StreamingLLM, Nexus, Ada-Nexus at 20%, needle / later_turn
                 (both protocols) / nll, --samples samples (200 results at 10)
  probe_full     every method x both scopes x densities 0.1/0.2/0.3, --full-samples samples; the 10-sample
                 sweep's time is estimated from it (samples are independent and alike)
  replay         README command 1's replay: the expert job's trajectories of --tasks on smollm2-135m under dense,
                 SnapKV, StreamingLLM, Nexus, Ada-Nexus at 20%, prefill_only, both protocols
  replay_full    the full demonstration sweep's cells (every method x both scopes x both protocols x 0.1/0.2/0.3)
                 on --full-tasks; the 16-task sweep's time is estimated from it by history tokens

  sweep          the full sweep as a user runs it: `nexus-eval agent-case --tasks '*'` with every method, both
                 scopes, both protocols, 0.1/0.2/0.3 (the expert job in real containers, then 1,760 replays),
                 timed to its end; its results database is kept (--sweep-db) for docs/agent_case.md

Variants: `before` (the code in --before DIR, e.g. `git archive <commit>` unpacked, as it ran then), `float32`
and `bfloat16` (this code, --processes processes of one thread, the model measuring in that dtype): float32 and
bfloat16 side by side in one run. The replays need a results database holding an expert job (`nexus-eval run -f
examples/agent_case.yaml --tasks '*' --db FILE`); each variant replays into its own copy of it.

    python bench/throughput.py --db /tmp/ac/ac.db --out bench/out/throughput.json
    python bench/throughput.py --parts sweep --variants bfloat16 --sweep-db /tmp/sweep.db --out bench/out/sweep.json
    python bench/throughput.py --table bench/out/throughput.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if sys.path and Path(sys.path[0]).resolve() == ROOT / "bench":
    sys.path.pop(0)  # bench/sandbox.py would shadow the sandbox package; the code measured comes from PYTHONPATH
MODEL = "smollm2-135m"
DEFAULT_METHODS = ["dense", "snapkv", "streaming_llm", "nexus", "ada_nexus"]
ALL_METHODS = ["dense", "snapkv", "pyramidkv", "ada_snapkv", "ada_pyramidkv", "h2o", "morphkv", "streaming_llm",
               "nexus", "ada_nexus"]  # fmt: skip
FULL = dict(scopes=["prefill_only", "prefill_decode"], densities=[0.1, 0.2, 0.3])


# -- one measurement, in its own process ---------------------------------------------------------------------
def _probe_settings(part: str, samples: int, model: str):
    from measure.probes.settings import ProbeSettings

    if part == "probe":
        return ProbeSettings(model=model, samples=samples)
    return ProbeSettings(model=model, samples=samples, variants=tuple(ALL_METHODS), scopes=tuple(FULL["scopes"]),
                         densities=tuple(FULL["densities"]))  # fmt: skip


def _replay_kwargs(part: str, tasks: list[str]) -> dict:
    if part == "replay":
        return dict(methods=DEFAULT_METHODS, scopes=["prefill_only"], protocols=["true_eviction", "full_context"],
                    densities=[0.2], tasks=tasks)  # fmt: skip
    return dict(methods=ALL_METHODS, protocols=["true_eviction", "full_context"], tasks=tasks, **FULL)


def measure(part: str, variant: str, samples: int, tasks: list[str], db_file: str | None, model: str,
            processes: int) -> dict:  # fmt: skip
    import torch

    torch.set_num_threads(1)
    started = time.perf_counter()
    before = variant == "before"  # that code knows no dtype: it measured in float32 on a CPU, one process
    dtype = {} if before else dict(dtype=variant)
    if part.startswith("probe"):
        settings = _probe_settings(part, samples, model)
        from agent_runner.config import ModelSpec

        if before:
            from agent_runner.model_host import load_host
            from measure.probes import run_probes

            results = list(run_probes(load_host(ModelSpec(name=model)), settings))
        else:
            from measure.probes.parallel import measure as probe_measure

            settings = settings.model_copy(update=dtype)
            values = probe_measure(settings, ModelSpec(name=model, **dtype), processes=processes)
            results = [r for r in values if not isinstance(r, tuple)]
        return dict(results=len(results), seconds=time.perf_counter() - started, samples=samples, code=_code())
    from db.connection import connect
    from measure.replay import plan_replays, run_plan

    db = connect(f"sqlite:///{db_file}")
    with db.session() as s:
        from db.models import Job

        job = s.query(Job).filter(Job.name == "agent-case").order_by(Job.created_at.desc()).first().id
    kw = _replay_kwargs(part, tasks)
    plan = plan_replays(db, job, model=model, redo=True, **kw, **dtype)
    summary = run_plan(db, plan, processes=1 if before else processes)
    seconds = time.perf_counter() - started
    ok = sum(r.status == "ok" for r in summary.results)
    tokens = _history_tokens(db, job, tasks, model)
    with db.session() as s:  # the rows' own seconds (a group's time over its rows): CPU time, whatever ran beside
        from db.measure_models import Replay

        ids = [r.item.episode_id for r in summary.results]
        stored = s.query(Replay).filter(Replay.job_id == job, Replay.episode_id.in_(ids), Replay.model == model).all()
        ran = {(x.item.method, x.item.scope, x.item.protocol) for x in summary.results}
        cpu = sum(r.seconds or 0.0 for r in stored if (r.method, r.scope, r.protocol) in ran)
    return dict(
        results=len(summary.results), ok=ok, seconds=seconds, cpu_seconds=cpu, tasks=tasks, tokens=tokens, code=_code()
    )


def run_sweep(variant: str, args) -> dict:
    """The full sweep as a user runs it, from the expert job to the last stored replay, timed to its end."""
    db = Path(args.sweep_db).resolve()
    cmd = ["nexus-eval", "agent-case", "--tasks", "*", "--methods", ",".join(ALL_METHODS), "--scopes",
           ",".join(FULL["scopes"]), "--protocols", "true_eviction,full_context", "--densities",
           ",".join(map(str, FULL["densities"])), "--processes", str(args.processes), "--dtype", variant,
           "--format", "json", "--db", str(db)]  # fmt: skip
    print(f"-- sweep {variant}: {' '.join(cmd)}", flush=True)
    started = time.perf_counter()
    out = subprocess.run(cmd, cwd=args.workdir, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    (Path(args.workdir) / "sweep.stderr").write_text(out.stderr)
    if out.returncode != 0:
        raise SystemExit(f"sweep {variant} failed (exit {out.returncode}):\n{out.stderr[-4000:]}")
    sys.path.insert(0, str(ROOT))
    from db.connection import connect
    from db.measure_models import Replay

    with connect(f"sqlite:///{db}").session() as s:
        replays = s.query(Replay).filter(Replay.status == "ok", Replay.dtype == variant).count()
    result = dict(part="sweep", variant=variant, results=replays, seconds=seconds, db=str(db), code=_code())
    print(f"   {result}", flush=True)
    return result


def _code() -> str:
    import agent_runner

    return str(Path(agent_runner.__file__).parents[1])


def _history_tokens(db, job: str, tasks: list[str] | None, model: str) -> int:
    """SmolLM2 tokens of the final context of each dense trajectory of `tasks` (all tasks: None), summed."""
    from fnmatch import fnmatchcase

    from agent_runner.chat_stream import render_trajectory
    from agent_runner.config import ModelSpec
    from agent_runner.model_host import load_host
    from db import store
    from measure.counterfactual import contexts
    from measure.text_trajectories import conversation

    tokenizer = load_host(ModelSpec(name=model)).tokenizer
    total = 0
    with db.session() as s:
        episodes = [e for e in store.result_attempts(s, [job]) if e.method == "dense"]
    for e in episodes:
        if tasks and not any(fnmatchcase(e.task_id, t) for t in tasks):
            continue
        turns = render_trajectory(tokenizer, conversation(db, e.id), "true_eviction").turns
        total += len(contexts(turns)[-1]) + len(turns[-1].generated)
    return total


# -- the run: every (part, variant) in its own process, then the table -------------------------------------
def run_one(part: str, variant: str, args) -> dict:
    if variant == "before" and not args.before:
        raise SystemExit("the before variant needs --before DIR (the code to compare against)")
    if part == "sweep":
        return run_sweep(variant, args)
    env = dict(os.environ, PYTHONPATH=str(Path(args.before).resolve() if variant == "before" else ROOT))
    db_copy = None
    if part.startswith("replay"):
        db_copy = tempfile.mktemp(suffix=".db", dir=args.workdir)
        shutil.copy(args.db, db_copy)
    samples = args.samples if part == "probe" else args.full_samples
    tasks = args.tasks if part == "replay" else args.full_tasks
    cmd = [sys.executable, __file__, "--child", part, variant, "--samples", str(samples), "--tasks", ",".join(tasks),
           "--model", args.model, "--processes", str(args.processes)]  # fmt: skip
    if db_copy:
        cmd += ["--db", db_copy]
    print(f"-- {part} {variant}: {' '.join(cmd[2:])}", flush=True)
    out = subprocess.run(cmd, env=env, cwd=args.workdir, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"{part} {variant} failed:\n{out.stderr[-4000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    if db_copy:
        os.unlink(db_copy)
    print(f"   {result}", flush=True)
    return dict(part=part, variant=variant, **result)


def table(rows: list[dict], total_tokens: int | None = None) -> str:
    lines = [
        "| part | variant | results | seconds | results / min | vs float32 | vs before | full run |",
        "|---|---|---|---|---|---|---|---|",
    ]
    per = {(r["part"], r["variant"]): r["seconds"] / max(r["results"], 1) for r in rows}
    for r in rows:
        mine = per[r["part"], r["variant"]]
        ratios = []
        for other in ("float32", "before"):
            base = per.get((r["part"], other))
            shown = base and r["variant"] not in (other, "before")  # before is the baseline, not a dtype
            ratios.append(f"{base / mine:.1f}x" if shown else "")
        estimate = ""
        if r["part"] == "probe_full":
            estimate = f"{r['seconds'] * 10 / r['samples'] / 60:.1f} min (10 samples, estimated)"
        if r["part"] == "replay_full" and total_tokens:
            estimate = f"{r['seconds'] * total_tokens / r['tokens'] / 60:.0f} min (16 tasks, estimated by tokens)"
        if r["part"] == "sweep":
            estimate = f"{r['seconds'] / 60:.1f} min (measured to its end)"
        rate = 60 * r["results"] / r["seconds"]
        cells = [r["part"], r["variant"], r["results"], f"{r['seconds']:.1f}", f"{rate:.1f}", *ratios, estimate]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--child", nargs=2, metavar=("PART", "VARIANT"), help=argparse.SUPPRESS)
    ap.add_argument("--before", help="a folder holding the code to compare against (git archive of a commit)")
    ap.add_argument("--db", help="a results database holding an expert job (the demonstrations)")
    ap.add_argument("--model", default=MODEL, help="the model measured (a GPU-sized one in bench/gpu.sh)")
    ap.add_argument("--parts", default="probe,probe_full,replay,replay_full")
    ap.add_argument("--variants", default="float32,bfloat16", help="before (needs --before), float32, bfloat16")
    ap.add_argument("--processes", type=int, default=2, help="measuring processes of this code's variants")
    ap.add_argument("--sweep-db", default=str(ROOT / "bench/out/sweep.db"), help="the sweep's results database")
    ap.add_argument("--samples", type=int, default=10)
    ap.add_argument("--full-samples", type=int, default=1)
    ap.add_argument("--tasks", default="humanfmt__humanfmt-4,tinyparse__tinyparse-3")
    ap.add_argument("--full-tasks", default="humanfmt__humanfmt-4")
    ap.add_argument("--full-variants", default="bfloat16", help="variants of replay_full (before takes hours)")
    ap.add_argument("--out", default=str(ROOT / "bench/out/throughput.json"))
    ap.add_argument("--table", nargs="+", help="print the table of these JSON files")
    args = ap.parse_args(argv)
    args.tasks = [t for t in args.tasks.split(",") if t]
    if args.child:
        args.full_tasks = args.tasks
        print(json.dumps(measure(*args.child, args.samples, args.tasks, args.db, args.model, args.processes)))
        return
    if args.table:
        for path in args.table:
            data = json.loads(Path(path).read_text())
            print(table(data["rows"], data.get("total_tokens")))
        return
    args.full_tasks = [t for t in args.full_tasks.split(",") if t]
    args.workdir = tempfile.mkdtemp(prefix="throughput-")
    rows = []
    for part in args.parts.split(","):
        variants = args.full_variants if part == "replay_full" else args.variants
        for variant in variants.split(","):
            rows.append(run_one(part, variant, args))
    total = None
    if any(r["part"] == "replay_full" for r in rows):
        total = _total_tokens(args.db, args.model)
    data = dict(
        rows=rows, total_tokens=total, model=args.model, machine=dict(cpus=os.cpu_count(), threads_per_process=1)
    )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(data, indent=1))
    print(table(rows, total))


def _total_tokens(db_file: str, model: str) -> int:
    sys.path.insert(0, str(ROOT))
    from db.connection import connect
    from db.models import Job

    db = connect(f"sqlite:///{db_file}")
    with db.session() as s:
        job = s.query(Job).filter(Job.name == "agent-case").order_by(Job.created_at.desc()).first().id
    return _history_tokens(db, job, None, model)


if __name__ == "__main__":
    main()
