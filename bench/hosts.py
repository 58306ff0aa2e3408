"""Throughput across hosts (issue 48): one oracle job on one worker host, then the same job on two.

    python bench/hosts.py [--episodes 200] [--out bench/out/hosts.json] [--warmup 4] [--timeout 3600]
                          [--graders server|each]

Brings up one ``tests.support.hosts.HostBed`` (network namespaces as hosts: S with Redis (password) and PostgreSQL,
A and B as worker hosts, each with its own hostname, pid namespace and Docker daemon loaded with the four mini
tasks' images) and keeps it for every run. Each run starts the graders (``--graders server``: one on S;
``each``: one on each worker host, beside its gpu worker) and one ``nexus-eval worker --queues gpu`` on each of
its hosts, waits for them to report ready, submits from this process
(``jobs.submit.submit`` over the bed's PostgreSQL and Redis) a job of ``--episodes`` oracle episodes (4 tasks x
dense x prefill_only x true_eviction x N seeds), and times submission to ``workers.embedded.job_finished``; then
stops the workers. Runs: an unmeasured warm-up (``--warmup`` episodes on A and B, so that neither measured run pays
for cold page caches and daemons alone), "1 host" (A), "2 hosts" (A and B). The service's liveness settings are
the defaults (no fast heartbeat): this is a throughput measurement.

Per run: wall seconds, episodes/hour, how many episodes each host ran (the runner's identity is
``result["worker"]``, ``hostname/pid/kernel``; ``episodes.worker`` names the grader once graded), and the medians
of ``bench/service.py``'s per-episode parts (pickup, db, agent, handoff, grade, overhead share), computed with each
row's runner as its worker so that "the same worker's previous finish" is that host's. Also when the worker hosts'
last run finished (``runs done``, from the submission) and the grader's busy share (its grading runs end to end over
the wall time). Then the ratio wall(1 host) / wall(2 hosts). Prints a rich table and writes the JSON (``--out``);
the hosts' logs go to ``bench/out/hosts-logs/``.

Needs root (namespaces, Docker daemons of its own), a Docker engine with the base image, ``redis-server`` and the
PostgreSQL server binaries. The repository root is put on ``sys.path`` at the top: the script runs as
``python bench/hosts.py`` (``bench/`` is then ``sys.path[0]``) and imports ``tests.support.hosts``, which is not
installed with the package.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
for _path in (ROOT, BENCH):  # tests.support.hosts (repo root); bench/service.py's per_episode (bench/)
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from collections import Counter  # noqa: E402
from typing import Any  # noqa: E402

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402
from service import TASKS, job_spec, per_episode, run_until_finished  # noqa: E402

SCHEMA = "nexus-bench-hosts/1"
PARTS = ("pickup_s", "db_s", "agent_s", "handoff_s", "grade_s", "wall_s")
RUNS = {"1 host": ("A",), "2 hosts": ("A", "B")}


# --- the pure parts (tests/bench/test_bench_hosts.py) ---------------------------------------------------------------
def runner_of(row) -> str | None:
    """The identity (``hostname/pid/kernel``) of the process that ran the episode: ``result["worker"]``, written at
    its finish; ``row.worker`` is the grader's once the grade is claimed."""
    return (row.result or {}).get("worker")


def host_of(identity: str | None) -> str:
    """The hostname part of an identity (``a-host/12/...`` -> ``a-host``); ``?`` for none."""
    return identity.split("/", 1)[0] if identity else "?"


def per_host(rows) -> dict[str, int]:
    """Episodes each host ran (rows that finished their run), by the runner's hostname, sorted by host."""
    counts = Counter(host_of(runner_of(r)) for r in rows if r.finished_at is not None)
    return dict(sorted(counts.items()))


class AsRun:
    """A stored row read with its runner as ``worker``: ``per_episode`` keys "the same worker's previous finish" by
    ``worker``, which after grading names the grader (one for all hosts), not the host that ran the episode."""

    def __init__(self, row) -> None:
        self._row = row

    def __getattr__(self, name: str):
        return getattr(self._row, name)

    @property
    def worker(self) -> str | None:
        return runner_of(self._row) or self._row.worker


def timings(rows) -> list[dict]:
    """``bench/service.py``'s per-episode parts for every row that ran and was graded, keyed by its runner."""
    done = [AsRun(r) for r in rows if r.started_at and r.finished_at and r.graded_at]
    return per_episode(done)


def span_s(rows, field: str) -> float | None:
    """Seconds from the first row's creation (the submission) to the last row's ``field`` (``finished_at``: the
    worker hosts' last run done; ``graded_at``: the grader's last verdict); None if no row has it."""
    ends = [getattr(r, field) for r in rows if getattr(r, field) is not None]
    return (max(ends) - min(r.created_at for r in rows)).total_seconds() if ends else None


def summarize(rows, wall_s: float, *, job_id: str = "", hosts: tuple[str, ...] = ()) -> dict[str, Any]:
    """One run: its wall time, episodes/hour, the split per host and the medians of the per-episode parts."""
    eps = timings(rows)
    medians = {k: statistics.median(e[k] for e in eps) for k in PARTS} if eps else {}
    share = statistics.median(e["overhead_share"] for e in eps) if eps else None
    share_grading = statistics.median(e["overhead_share_with_grading"] for e in eps) if eps else None
    return {
        "job": job_id,
        "worker_hosts": list(hosts),
        "episodes": len(rows),
        "graded": len(eps),
        "statuses": dict(sorted(Counter(r.status for r in rows).items())),
        "wall_s": wall_s,
        "runs_done_s": span_s(rows, "finished_at"),  # the gpu hosts' part; wall minus this: the grader's tail
        "graded_s": span_s(rows, "graded_at"),
        "episodes_per_hour": len(rows) / wall_s * 3600 if wall_s > 0 else None,
        "per_host": per_host(rows),
        # the single grader's grading runs end to end as a share of the wall time: near 1, it sets the pace
        "grader_busy_share": sum(e["grade_s"] for e in eps) / wall_s if wall_s > 0 else None,
        "median": medians,
        "overhead_share_median": share,
        "overhead_share_with_grading_median": share_grading,
        "per_episode": eps,
    }


def speedup(one: dict, two: dict) -> float:
    """wall(1 host) / wall(2 hosts): above 1 when the second host helped."""
    return one["wall_s"] / two["wall_s"]


def table(runs: dict[str, dict], ratio: float | None) -> Table:
    """The runs side by side: wall, episodes/h, the per-host split, median parts (s), overhead shares."""
    out = Table(title="one oracle job on worker hosts of one machine (medians per episode, seconds)")
    for col in ("run", "episodes", "wall s", "runs done s", "episodes/h", "per host"):
        out.add_column(col, justify="left" if col in ("run", "per host") else "right")
    for part in PARTS[:-1]:
        out.add_column(part.removesuffix("_s"), justify="right")
    out.add_column("overhead share", justify="right")
    out.add_column("+ grading", justify="right")
    out.add_column("grader busy", justify="right")
    for name, run in runs.items():
        med = run["median"]
        split = ", ".join(f"{h} {n}" for h, n in run["per_host"].items())
        share, share_g = run["overhead_share_median"], run["overhead_share_with_grading_median"]
        out.add_row(
            name,
            str(run["episodes"]),
            f"{run['wall_s']:.1f}",
            f"{run['runs_done_s']:.1f}" if run["runs_done_s"] is not None else "",
            f"{run['episodes_per_hour']:.0f}",
            split,
            *(f"{med[p]:.2f}" if p in med else "" for p in PARTS[:-1]),
            f"{share:.1%}" if share is not None else "",
            f"{share_g:.1%}" if share_g is not None else "",
            f"{run['grader_busy_share']:.0%}" if run["grader_busy_share"] is not None else "",
        )
    if ratio is not None:
        out.caption = f"wall(1 host) / wall(2 hosts) = {ratio:.2f}"
    return out


# --- the runs on the bed ---------------------------------------------------------------------------------------------
def run_job(
    bed, db, app, spec, hosts: tuple[str, ...], *, graders: str, timeout: float, console: Console
) -> tuple[str, float]:
    """A gpu worker on each of ``hosts`` and the graders (``server``: one on S; ``each``: one on each of ``hosts``,
    beside its gpu worker, on that host's Docker daemon); the job submitted once all report ready; (job id,
    seconds from submission to the job finished). The workers are stopped (warm shutdown) before returning."""
    from tests.support.hosts import wait_for

    env = bed.env()  # the default liveness settings
    grading = ("S",) if graders == "server" else hosts
    procs = [*(bed.worker(h, env, queues="grade,default") for h in grading), *(bed.worker(h, env) for h in hosts)]
    try:
        for p in procs:
            wait_for(lambda p=p: " ready." in p.tail(10**6) or not p.alive(), 180, f"{p.name} ready", bed)
            if not p.alive():
                raise SystemExit(f"{p.name} exited at its start\n{bed.tails()}")
        job_id, _, wall = run_until_finished(
            db, spec, app=app, timeout=timeout, on_timeout=bed.tails, console=console,
            status=f"{spec.name}: job {{job}}, {{n}} oracle episodes on {'+'.join(hosts)}",
        )  # fmt: skip
    finally:
        for p in procs:
            p.stop(60)
        for host in bed.hosts.values():
            host.processes.clear()  # stopped; the next run's logs are new files (bed.started numbers them)
    return job_id, wall


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=200, help="episodes per measured run (rounded up to 4s)")
    parser.add_argument("--warmup", type=int, default=4, help="episodes of the unmeasured warm-up on A and B (0: none)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "hosts.json")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds one run may take")
    parser.add_argument(
        "--graders",
        choices=("server", "each"),
        default="server",
        help="server: one grader on S for every run; each: a grader on each worker host (grading scales with hosts)",
    )
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        raise SystemExit("bench/hosts.py needs root (network namespaces, Docker daemons of its own)")

    from db import connect
    from db import store as db_store
    from jobs.queue import make_app
    from jobs.settings import ServiceSettings
    from tests.conftest import docker_status
    from tests.support.hosts import HostBed

    ready, why = docker_status()
    if not ready:
        raise SystemExit(why)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    logs = ROOT / "bench" / "out" / "hosts-logs" / time.strftime("%Y%m%d-%H%M%S")
    logs.mkdir(parents=True, exist_ok=True)
    console = Console(width=None if sys.stdout.isatty() else 200)  # the whole table in a log, not folded
    load_before = os.getloadavg()
    started = time.perf_counter()
    runs: dict[str, dict] = {}
    with HostBed(logs, images=TASKS) as bed:
        bed_s = time.perf_counter() - started
        console.print(f"bed up in {bed_s:.0f} s (hosts' logs: {logs})")
        db = connect(bed.postgres.url)  # the operator's link to S
        app = make_app(ServiceSettings.from_env(bed.env()))
        try:
            if args.warmup:
                spec = job_spec(args.warmup, "bench-hosts-warmup")
                job_id, wall = run_job(
                    bed, db, app, spec, ("A", "B"), graders=args.graders, timeout=args.timeout, console=console
                )
                console.print(f"warm-up: job {job_id}, {wall:.1f} s")
            for name, hosts in RUNS.items():
                spec = job_spec(args.episodes, f"bench-hosts-{name.replace(' ', '-')}")
                job_id, wall = run_job(
                    bed, db, app, spec, hosts, graders=args.graders, timeout=args.timeout, console=console
                )
                with db.session() as s:  # the payloads (``result``) too, read while the rows are bound
                    rows = db_store.episodes_for_job(s, job_id, full=True)
                    runs[name] = summarize(rows, wall, job_id=job_id, hosts=hosts)
                console.print(f"{name}: job {job_id}, {wall:.1f} s, {runs[name]['per_host']}")
        finally:
            db.dispose()
    ratio = speedup(runs["1 host"], runs["2 hosts"])
    console.print(table(runs, ratio))
    report = {
        "schema": SCHEMA,
        "tasks": TASKS,
        "episodes_asked": args.episodes,
        "warmup_episodes": args.warmup,
        "graders": args.graders,
        "bed_up_s": bed_s,
        "runs": runs,
        "ratio_wall_1_over_2": ratio,
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "loadavg_before": load_before,
            "loadavg_after": os.getloadavg(),
        },
        "logs": str(logs),
    }
    args.out.write_text(json.dumps(report, indent=2, default=str))
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
