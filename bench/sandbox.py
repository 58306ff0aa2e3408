"""Sandbox costs on the local engine: container start, per-tool-call overhead vs a bare `docker exec true`,
and grading time per task. Prints a rich table and writes bench/out/sandbox.json.

    python bench/sandbox.py [--starts 5] [--calls 30] [--suite mini] [--grade-tasks 4]

Medians and p95 over the repetitions; "overhead" = a tool call's wall time minus the median bare exec.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

OUT = Path(__file__).resolve().parent / "out"


def pctl(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def stats(name: str, seconds: list[float]) -> dict:
    return {
        "name": name,
        "n": len(seconds),
        "median_ms": statistics.median(seconds) * 1e3,
        "p95_ms": pctl(seconds, 0.95) * 1e3,
        "min_ms": min(seconds) * 1e3,
    }


def timed(fn) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=5)
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument("--suite", default="mini")
    parser.add_argument("--grade-tasks", type=int, default=4)
    args = parser.parse_args()

    import docker
    from env.grading import GradeConfig, grade
    from env.sandbox.container import Sandbox
    from env.sandbox.tools import ToolBox, ToolCall
    from env.tasks.images import BASE_IMAGE_TAG, build_base_image, ensure_task_image
    from env.tasks.loading import load_suite

    console = Console()
    client = docker.from_env(timeout=300)
    build_base_image(BASE_IMAGE_TAG, client=client)
    job = "bench-sandbox"
    rows: list[dict] = []

    with console.status("container start (create + start + first exec) and close"):
        starts, closes = [], []
        for _ in range(args.starts):
            t0 = time.perf_counter()
            box = Sandbox.start(BASE_IMAGE_TAG, job=job, client=client)
            starts.append(time.perf_counter() - t0)
            closes.append(timed(box.close))
        rows += [stats("container start", starts), stats("container close (rm -f)", closes)]

    tasks = load_suite(args.suite)
    image = ensure_task_image(tasks[0], client)
    with Sandbox.start(image, job=job, client=client) as box, console.status("per-call costs"):
        rows.append(stats("ToolBox.install", [timed(lambda: ToolBox(box).install()) for _ in range(3)]))
        tools = ToolBox(box).install()
        bare = [
            timed(lambda: subprocess.run(["docker", "exec", box.id, "true"], check=True)) for _ in range(args.calls)
        ]
        rows.append(stats("bare `docker exec true` (CLI)", bare))
        api_bare = [timed(lambda: box.container.exec_run(["true"])) for _ in range(args.calls)]
        rows.append(stats("bare exec_run(true) (docker-py)", api_bare))
        rows.append(stats("Sandbox.run('true')", [timed(lambda: box.run("true")) for _ in range(args.calls)]))
        calls = {
            "execute_bash 'true'": ToolCall(name="execute_bash", arguments={"cmd": "true"}),
            "file_editor view dir": ToolCall(name="file_editor", arguments={"command": "view", "path": "/testbed"}),
            "search 'def'": ToolCall(name="search", arguments={"search_term": "def"}),
        }
        for label, call in calls.items():
            rows.append(stats(label, [timed(lambda call=call: tools.call(call)) for _ in range(args.calls)]))
    base_ms = statistics.median(api_bare) * 1e3
    per_exec = {"bare `docker exec true` (CLI)", "Sandbox.run('true')", *calls}
    for row in rows:
        row["overhead_vs_bare_exec_ms"] = row["median_ms"] - base_ms if row["name"] in per_exec else None

    grading = []
    with console.status("grading gold patches"):
        for task in tasks[: args.grade_tasks]:
            ensure_task_image(task, client)
            result = grade(task, task.patch, config=GradeConfig(job=job))
            grading.append({"task": task.instance_id, "status": result.status, "seconds": result.seconds})

    table = Table(title="sandbox costs (local engine)")
    for column in ("measure", "n", "median ms", "p95 ms", "over bare exec ms"):
        table.add_column(column, justify="right" if column != "measure" else "left")
    for row in rows:
        over = row["overhead_vs_bare_exec_ms"]
        table.add_row(
            row["name"],
            str(row["n"]),
            f"{row['median_ms']:.1f}",
            f"{row['p95_ms']:.1f}",
            "" if over is None else f"{over:.1f}",
        )
    console.print(table)
    gtable = Table(title="grading (fresh container, gold patch)")
    for column in ("task", "status", "seconds"):
        gtable.add_column(column)
    for g in grading:
        gtable.add_row(g["task"], g["status"], f"{g['seconds']:.2f}")
    console.print(gtable)

    OUT.mkdir(exist_ok=True)
    report = {
        "machine": platform.platform(),
        "cpus": __import__("os").cpu_count(),
        "docker_server": client.version().get("Version"),
        "measures": rows,
        "grading": grading,
    }
    (OUT / "sandbox.json").write_text(json.dumps(report, indent=2))
    console.print(f"wrote {OUT / 'sandbox.json'}")


if __name__ == "__main__":
    main()
