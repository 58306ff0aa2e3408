"""The service's own overhead per episode, with the oracle backend (no model time to hide behind).

    python bench/service.py [--episodes 8] [--broker redis://127.0.0.1:6379/9] [--db URL]

Submits one job of oracle episodes (mini tasks x dense, prefill_only, true_eviction; repeated over seeds to
reach ``--episodes``), runs it with real ``celery worker`` processes (one on ``gpu``, one on
``grade,default``; with no ``--broker`` one embedded worker on all queues over the SQLite broker), and
reads every timing back from the database. Per episode:

- ``pickup``: the broker hand-off, from the later of (enqueued, the same worker's previous finish) to the claim;
- ``db``: the claim, every per-turn ``record_turn`` and the ``finish_episode`` write;
- ``agent``: the agent stage inside the claim minus ``db`` (container start, tools, the oracle's three turns, diff);
- ``handoff``: from the agent finish to the grade verdict, minus the grading run itself (grade queue + write);
- ``grade``: the grading run in a fresh container.

Overhead = pickup + db + handoff (+ grade, reported both ways) as a share of the episode's wall time
(pickup + claim-to-finish + handoff + grade). Episodes/hour = episodes / (last verdict - submission).
Prints a rich table and writes bench/out/service.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from workers.embedded import worker_command

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "out"
TASKS = ["humanfmt__humanfmt-1", "dslib__dslib-1", "argkit__argkit-1", "tinyparse__tinyparse-1"]


def start_worker(env: dict[str, str], queues: str, log: Path) -> subprocess.Popen:
    cmd = worker_command(queues, name=f"bench-{queues}@%h")
    return subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=open(log, "ab"), stderr=subprocess.STDOUT)  # noqa: SIM115


def run_until_finished(db, spec, *, timeout: float, status: str, on_timeout, console: Console, app=None):
    """Submit ``spec`` (planned over its tasks) and wait until the job has finished; (job id, episodes, seconds from
    the submission). ``on_timeout()`` says where to look when it does not finish within ``timeout`` seconds."""
    from jobs.submit import load_job_tasks, plan_job, submit
    from workers.embedded import job_finished

    plan = plan_job(spec, load_job_tasks(spec))
    started = time.perf_counter()
    job_id, n = submit(db, plan, app=app) if app is not None else submit(db, plan)
    deadline = time.monotonic() + timeout
    with console.status(status.format(job=job_id, n=n)):
        while not job_finished(db, job_id):
            if time.monotonic() > deadline:
                raise SystemExit(f"job {job_id} did not finish in {timeout}s\n{on_timeout()}")
            time.sleep(0.5)
    return job_id, n, time.perf_counter() - started


def job_spec(episodes: int, name: str):
    """4 tasks x dense x prefill_only x true_eviction x ceil(episodes / 4) seeds, oracle backend."""
    from jobs.spec import JobSpec

    seeds = list(range(max(1, -(-episodes // len(TASKS)))))
    return JobSpec.from_dict(
        {
            "name": name,
            "backend": "oracle",
            "methods": ["dense"],
            "scopes": ["prefill_only"],
            "protocols": ["true_eviction"],
            "seeds": seeds,
            "tasks": {"suite": "mini", "ids": TASKS},
        }
    )


def per_episode(rows) -> list[dict]:
    """Timings per episode (seconds) from the stored rows; see the module docstring."""
    out, last_finish = [], {}
    for r in sorted(rows, key=lambda r: r.started_at):
        svc = (r.result or {}).get("service_timings", {})
        db_s = svc.get("claim_s", 0.0) + svc.get("db_turns_s", 0.0) + svc.get("finish_s", 0.0)
        ready = max(r.created_at, last_finish.get(r.worker, r.created_at))
        pickup = max(0.0, (r.started_at - ready).total_seconds())
        run = (r.finished_at - r.started_at).total_seconds()
        grade = r.grade_s or 0.0
        handoff = max(0.0, (r.graded_at - r.finished_at).total_seconds() - grade)
        last_finish[r.worker] = r.finished_at
        wall = pickup + run + handoff + grade
        out.append(
            {
                "episode": r.id,
                "task": r.task_id,
                "status": r.status,
                "pickup_s": pickup,
                "db_s": db_s,
                "agent_s": max(0.0, run - db_s),
                "handoff_s": handoff,
                "grade_s": grade,
                "wall_s": wall,
                "overhead_share": (pickup + db_s + handoff) / wall,
                "overhead_share_with_grading": (pickup + db_s + handoff + grade) / wall,
            }
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=8)
    parser.add_argument("--broker", default=None, help="redis://... (default: the embedded SQLite broker)")
    parser.add_argument("--db", default=None, help="results database URL (default: bench/out/service-bench.db)")
    parser.add_argument("--timeout", type=float, default=900)
    args = parser.parse_args()

    OUT.mkdir(parents=True, exist_ok=True)
    db_url = args.db or f"sqlite:///{OUT / 'service-bench.db'}"
    env = {**os.environ, "NEXUS_EVAL_DB": db_url, "OMP_NUM_THREADS": "1"}
    env.pop("NEXUS_EVAL_RESULT_BACKEND", None)
    if args.broker:
        env["NEXUS_EVAL_BROKER"] = args.broker
    else:
        env.pop("NEXUS_EVAL_BROKER", None)
    os.environ.update({k: env[k] for k in ("NEXUS_EVAL_DB",)})
    os.environ.pop("NEXUS_EVAL_BROKER", None)
    if args.broker:
        os.environ["NEXUS_EVAL_BROKER"] = args.broker

    from db import connect
    from db import store as db_store

    spec = job_spec(args.episodes, "bench-service")
    db = connect(db_url)
    log = OUT / "service-bench-worker.log"
    queues = ["gpu", "grade,default"] if args.broker else ["gpu,grade,default"]
    workers = [start_worker(env, q, log) for q in queues]
    console = Console()
    try:
        time.sleep(3)  # let the workers connect before the clock starts
        job_id, n, total = run_until_finished(
            db, spec, timeout=args.timeout, status="job {job}: {n} oracle episodes", on_timeout=lambda: f"see {log}",
            console=console,
        )  # fmt: skip
    finally:
        for w in workers:
            w.terminate()
            w.wait(30)
    with db.session() as s:
        rows = db_store.episodes_for_job(s, job_id, full=True)  # per_episode reads each row's result
        eps = per_episode(rows)

    keys = ("pickup_s", "db_s", "agent_s", "handoff_s", "grade_s", "wall_s")
    summary = {k: statistics.median(e[k] for e in eps) for k in keys}
    share = statistics.median(e["overhead_share"] for e in eps)
    share_grading = statistics.median(e["overhead_share_with_grading"] for e in eps)
    per_hour = len(eps) / total * 3600
    table = Table(
        title=f"service overhead per oracle episode ({'redis' if args.broker else 'embedded'} broker, "
        f"{len(eps)} episodes, medians)"
    )
    table.add_column("part")
    table.add_column("seconds", justify="right")
    table.add_column("share of wall", justify="right")
    for k in keys:
        table.add_row(k.removesuffix("_s"), f"{summary[k]:.3f}", f"{summary[k] / summary['wall_s']:.1%}")
    table.add_row("service overhead (pickup+db+handoff)", "", f"{share:.1%}")
    table.add_row("... including grading", "", f"{share_grading:.1%}")
    table.add_row("episodes / hour (this machine)", f"{per_hour:.0f}", "")
    console.print(table)
    report = {
        "broker": "redis" if args.broker else "embedded-sqlite",
        "db": db_url.split("://")[0],
        "episodes": len(eps),
        "statuses": sorted({e["status"] for e in eps}),
        "total_s": total,
        "episodes_per_hour": per_hour,
        "median": summary,
        "overhead_share_median": share,
        "overhead_share_with_grading_median": share_grading,
        "per_episode": eps,
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform()},
    }
    name = "service-redis.json" if args.broker else "service.json"
    (OUT / name).write_text(json.dumps(report, indent=2, default=str))
    console.print(f"wrote {OUT / name}")


if __name__ == "__main__":
    main()
