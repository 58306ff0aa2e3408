"""What `run`, `status --watch` and `demo` write when their output is not a terminal (a pipe, a log file).

The bytes are what a user's log holds: a start line, one plain progress line per finished episode (or method)
with counts, every table on lines of its own (rich's Live left its last frame without a newline, so the status
table's bottom border and the compare title shared a line), and for the random tiny model a note that its
numbers check the plumbing only. The `run` tests (Docker) run the real CLI in a subprocess, stdout and stderr
into one pipe, as in ``nexus-eval run > log 2>&1``.
"""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from collections import Counter

import pytest
from rich.console import Console

from db import connect, sqlite_url
from db import store as db_store
from jobs.spec import JobSpec
from nexus_eval.commands._job_progress import Attempt, EndedLines
from nexus_eval.commands.service import random_weights_note
from tests.cli.test_cli import _finished_job, invoke
from tests.support.worker_fixtures import ROOT

BORDERS = ("└", "┘", "━", "─")
# [ended/episodes] STATUS METHOD SCOPE PROTOCOL TASK seed SEED [attempt N] (COUNTS, LEFT left)
PROGRESS = re.compile(r"^\[(\d+)/(\d+)\] (\S+) (\S+) (\S+) (\S+) (\S+) seed (\d+)(?: attempt \d+)? \((.+, \d+ left)\)$")


def glued(text: str) -> list[str]:
    """Lines that hold a table border and the start of the compare table together."""
    return [line for line in text.splitlines() if "compare " in line and any(b in line for b in BORDERS)]


def counts_of(line: str) -> Counter:
    """The counts a progress line ends with: ``(1 resolved, 2 unresolved, 7 left)``."""
    match = PROGRESS.match(line)
    assert match, line
    return Counter({word: int(n) for n, word in (part.split(" ") for part in match[9].split(", "))})


def test_a_progress_line_per_ended_attempt_with_the_counts_so_far():
    out = io.StringIO()
    lines = EndedLines(Console(file=out, width=40))  # narrower than a line: lines are never wrapped

    def attempt(key: str, status: str, n: int = 1) -> Attempt:
        return Attempt(f"{key}{n}", status, "nexus", "prefill_decode", "true_eviction", f"task_{key}", 0, n)

    lines.report([attempt("a", "queued"), attempt("b", "running"), attempt("c", "submitted")])
    lines.report([attempt("a", "resolved"), attempt("b", "running"), attempt("c", "submitted")])
    lines.report([attempt("a", "resolved"), attempt("b", "unresolved"), attempt("c", "infra_failure")])
    lines.report([attempt("a", "resolved"), attempt("b", "unresolved"), attempt("c", "queued", 2)])  # a retry
    lines.report([attempt("a", "resolved"), attempt("b", "unresolved"), attempt("c", "resolved", 2)])
    lines.report([attempt("a", "resolved"), attempt("b", "unresolved"), attempt("c", "resolved", 2)])  # said once
    where = "nexus prefill_decode true_eviction"
    assert out.getvalue().splitlines() == [
        f"[1/3] resolved {where} task_a seed 0 (1 resolved, 2 left)",
        f"[2/3] unresolved {where} task_b seed 0 (1 resolved, 1 unresolved, 1 left)",
        f"[3/3] infra_failure {where} task_c seed 0 (1 resolved, 1 unresolved, 1 infra_failure, 0 left)",
        f"[3/3] resolved {where} task_c seed 0 attempt 2 (2 resolved, 1 unresolved, 0 left)",
    ]
    assert all(PROGRESS.match(line) for line in out.getvalue().splitlines())


def test_status_watch_in_a_pipe_says_each_episode_and_ends_its_table_before_the_next(tmp_path):
    """``status --watch`` draws what ``run`` draws while it waits; CliRunner's stdout is not a terminal."""
    db = connect(sqlite_url(tmp_path / "results.db"))
    job_id, ids = _finished_job(db)
    watched = invoke("status", job_id, "--watch", "--db", db.url)
    assert watched.exit_code == 0, watched.output
    progress = [line for line in watched.stdout.splitlines() if line.startswith("[")]
    with db.session() as s:
        rows = {r.task_id: r for r in db_store.latest_attempts(s, [job_id])}
    assert [line.split(" (")[0] for line in progress] == [
        f"[{i}/2] {r.status} {r.method} {r.scope} {r.protocol} {r.task_id} seed {r.seed}"
        for i, r in enumerate(rows.values(), 1)
    ]
    assert counts_of(progress[-1]) == Counter(resolved=1, unresolved=1, left=0)
    assert watched.stdout.endswith("┘\n")  # the status table, and its line ended
    compared = invoke("compare", job_id, "--format", "table", "--db", db.url)
    assert compared.exit_code == 0, compared.output
    assert glued(watched.stdout + compared.stdout) == []  # as `run 2>&1` writes them, one after the other


def test_the_random_weights_note_is_for_the_tiny_model_on_the_hf_backend_only():
    tiny = JobSpec.from_dict({"model": {"name": "tiny"}, "backend": "hf", "tasks": {"suite": "mini"}})
    note = random_weights_note(tiny)
    assert note and "random weights" in note and "resolves nothing, by design" in note
    assert "plumbing" in note and "`nexus-eval probe run`" in note and "smollm2-135m" in note
    real = JobSpec.from_dict({"model": {"name": "smollm2-135m"}, "backend": "hf", "tasks": {"suite": "mini"}})
    oracle = JobSpec.from_dict({"model": {"name": "tiny"}, "backend": "oracle", "tasks": {"suite": "mini"}})
    assert random_weights_note(real) is None and random_weights_note(oracle) is None


def test_demo_in_a_pipe_says_each_method_as_it_finishes():
    import nexus

    done = invoke("demo", "--decode", "2")
    assert done.exit_code == 0, done.output
    n = len(nexus.METHODS)
    assert done.stderr.startswith(f"demo: {n} methods on the tiny Qwen3 (random weights")
    lines = [line for line in done.stderr.splitlines() if line.startswith("[")]
    assert [line.split(":")[0] for line in lines] == [f"[{i}/{n}] {m}" for i, m in enumerate(nexus.METHODS, 1)]
    assert all(re.search(r"eviction events, max \|dlogit\| vs dense [\d.]+ \([\d.]+ s\)$", x) for x in lines)
    assert done.stdout.endswith("┘\n")


def run_piped(*args: str, timeout: float = 420) -> str:
    """``python -m nexus_eval.cli run ARGS > pipe 2>&1``: everything it wrote, in order, as text."""
    env = {**os.environ, "NEXUS_EVAL_DEVICE": "cpu", "OMP_NUM_THREADS": "1"}
    env.pop("NEXUS_EVAL_BROKER", None)
    done = subprocess.run(
        [sys.executable, "-m", "nexus_eval.cli", "run", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        timeout=timeout,
    )
    text = done.stdout.decode()
    assert done.returncode == 0, text[-4000:]
    return text


def check_run_output(text: str, episodes: int) -> list[str]:
    """The start line, one progress line per episode with counts, nothing glued; returns the progress lines."""
    assert re.search(rf"^job \w+ \(quick\): {episodes} episodes; embedded worker on sqlite:///", text, re.M), text
    progress = [line for line in text.splitlines() if line.startswith("[")]
    assert [PROGRESS.match(line).group(1, 2) for line in progress] == [
        (str(i), str(episodes)) for i in range(1, 1 + episodes)
    ]
    assert [sum(counts_of(line).values()) for line in progress] == [episodes] * episodes
    assert glued(text) == [], text
    return progress


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.parametrize("backend", ["hf", "oracle"])
def test_run_in_a_pipe_says_each_episode_and_notes_a_random_model(tmp_path, backend):
    from tests.conftest import docker_status, require

    require(*docker_status())
    flags = ["--backend", backend, "--model", "tiny", "--methods", "dense,nexus", "--protocols", "true_eviction"]
    flags += ["--tasks", "humanfmt__humanfmt-1", "--max-steps", "2", "--db", str(tmp_path / "runs" / "results.db")]
    text = run_piped(*flags)
    progress = check_run_output(text, episodes=2)
    assert {PROGRESS.match(line)[4] for line in progress} == {"dense", "nexus"}
    noted = "random weights, so the agent resolves nothing, by design" in text
    assert noted == (backend == "hf"), text
    if backend == "oracle":
        assert counts_of(progress[-1]) == Counter(resolved=2, left=0)
