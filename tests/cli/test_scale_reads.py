"""Issue 35 (Table-3 scale): ``status``, ``status --watch``, ``run``'s progress and the failure summary read counts
and a few columns (``db.progress``), never whole episode rows; ``export`` streams its patches a chunk at a time.
Each shows what it showed when it read every row: the grouped counts equal a count over the rows for a job with
reruns, resamples and interactive attempts, on SQLite and PostgreSQL, and the exported bytes equal those of the
whole-job read."""

from __future__ import annotations

import io
import json
import tracemalloc
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, replace

import pytest
from rich.console import Console
from sqlalchemy import event
from sqlalchemy.engine import Engine

from db import job_rows, progress
from db import store as st
from db.attempt_roles import AttemptFacts, Role, apart_text, roles_of
from nexus_eval.commands._job_progress import Attempt, EndedLines
from nexus_eval.commands._preflight import failure_reasons, first_line
from results import export
from tests.cli.test_cli import invoke
from tests.support.db_fixtures import any_db_fixture, sqlite_db_fixture  # noqa: F401  (fixtures)
from workers.embedded import ACTIVE_STATUSES, job_finished, progress_table

# "Zeta" sorts before "alpha" by code point (Python), after it in a locale collation (PostgreSQL's default)
TASKS = ("alpha__a-1", "Zeta__z-1", "alpha__a-10", "beta.b-1")
METHODS = ("dense", "nexus")
PROTOCOLS = ("true_eviction", "full_context")
ENDS = ("resolved", "unresolved", "infra_failure", "timeout", "submitted", "running", "queued", "empty_patch")


@dataclass(frozen=True)
class Key:
    task_id: str
    method: str
    scope: str = "prefill_decode"
    protocol: str = "true_eviction"
    seed: int = 0


def _patch(task: str, method: str, body: str = "b") -> str:
    return f"diff --git a/{task}.py b/{task}.py\n--- a/{task}.py\n+++ b/{task}.py\n@@ -1 +1 @@\n-a\n+{body}-{method}\n"


def _run(db, episode_id: str, end: str, *, patch: str | None = None, driver_action: dict | None = None) -> None:
    """One attempt through the writers, to ``end``: queued, running, an agent exit, a broken run, or a grade."""
    if end == "queued":
        return
    with db.session() as s:
        claim = st.claim_episode(s, episode_id)
    if end == "running":
        return
    with db.session() as s:
        st.record_turn(s, claim, 0, completion="x", action=driver_action, observation="o")
    with db.session() as s:
        if end in ("infra_failure", "timeout"):
            st.finish_episode(s, claim, end, error=f"\n  RuntimeError: {end} #{len(episode_id) % 2}\n  at line 3")
            return
        st.finish_episode(s, claim, "submitted", patch="  \n" if end == "empty_patch" else patch)
    if end != "submitted":
        with db.session() as s:
            st.record_grade(s, episode_id, "unresolved" if end == "empty_patch" else end, test_log="log", grader="t")


def _varied_job(db) -> str:
    """Every status, a rerun of a broken run (it becomes the result), a resample of a verdict, an interactive
    rerun that resolves, and patches a str_replace turn names (R2E's filter keeps those files)."""
    keys = [Key(t, m, protocol=p) for t in TASKS for m in METHODS for p in PROTOCOLS]
    with db.session() as s:
        job = job_rows.create_job(s, config={"model": {"name": "org/model"}}, config_hash="c" * 64, name="scale")
        rows = job_rows.add_episodes(s, job.id, keys, config={"density": 0.2})
        job_id, ids = job.id, [(r.id, r.task_id, r.method) for r in rows]
    for i, (episode_id, task, method) in enumerate(ids):
        edit = {"name": "file_editor", "arguments": {"command": "str_replace", "path": f"/testbed/{task}.py"}}
        _run(db, episode_id, ENDS[i % len(ENDS)], patch=_patch(task, method), driver_action=edit if i % 3 else None)
    broken, verdict, other = ids[2][0], ids[0][0], ids[1][0]
    with db.session() as s:
        rerun, resample = st.new_attempt(s, broken).id, st.new_attempt(s, verdict).id
        interactive = st.new_attempt(s, other, driver="interactive").id
    _run(db, rerun, "resolved", patch=_patch(ids[2][1], "rerun"))
    _run(db, resample, "unresolved", patch=_patch(ids[0][1], "resample"))
    _run(db, interactive, "resolved", patch=_patch(ids[1][1], "interactive", "steered"))
    return job_id


@contextmanager
def statements():
    """Every SQL statement any engine runs inside the block (the CLI opens its own)."""
    seen: list[str] = []

    def record(conn, cursor, statement, parameters, context, executemany):
        seen.append(statement)

    event.listen(Engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(Engine, "before_cursor_execute", record)


def whole_rows(seen: list[str]) -> list[str]:
    """The statements that read episode rows whole: a display never shows an episode's config."""
    return [q for q in seen if "episodes.config" in q]


def _shown(s, job_id: str) -> list[tuple]:
    """(row, role) of every attempt a view shows, by the result rule written out over all the job's rows (a
    replaced broken run left out), in key then attempt order."""
    rows = st.episodes_for_job(s, job_id)
    by_key: dict = {}
    for r in rows:
        by_key.setdefault(r.episode_key, []).append(r)
    shown = []
    for key in sorted(by_key):
        roles = roles_of(AttemptFacts(r.attempt, r.driver, r.status) for r in by_key[key])
        shown += [(r, roles[r.attempt].value) for r in by_key[key] if roles[r.attempt] != Role.replaced]
    return shown


def test_grouped_counts_equal_a_count_over_the_rows(any_db):
    job_id = _varied_job(any_db)
    with any_db.session() as s:
        shown = _shown(s, job_id)
        assert {role for _, role in shown} >= {"result", "resample", "interactive"}
        by_group: dict = {}
        for r, role in shown:
            by_group.setdefault((r.method, r.scope, r.protocol), {}).setdefault(role, Counter())[r.status] += 1
        assert progress.group_counts(s, job_id) == by_group
        assert progress.status_counts(s, job_id) == Counter(r.status for r, _ in shown)
        assert progress.shown_statuses(s, job_id) == [(r.id, r.status, role) for r, role in shown]  # key order
        assert set(progress.status_counts(s, job_id)) >= set(ENDS) - {"empty_patch"}
        rows = [r for r, role in shown if role == "result"]
        failed = Counter(f"{r.status}: {first_line(r.error)}" for r in rows if r.status in ("infra_failure", "timeout"))
    assert failure_reasons(any_db, job_id) == [(n, reason) for reason, n in failed.most_common()]
    assert not job_finished(any_db, job_id)


def _old_table(db, job_id: str) -> str:
    """The status table drawn from every row, by the result rule written out (:func:`_shown`)."""
    with db.session() as s:
        shown, status = _shown(s, job_id), job_rows.get_job(s, job_id).status
    groups: dict = {}
    for r, role in shown:
        groups.setdefault((r.method, r.scope, r.protocol), {}).setdefault(role, Counter())[r.status] += 1
    results = {g: by.get("result", Counter()) for g, by in groups.items()}
    statuses = sorted({x for c in results.values() for x in c}, key=lambda x: (x not in ACTIVE_STATUSES, x))
    from rich.table import Table

    table = Table(title=f"job {job_id}: {status}")
    for col in ("method", "scope", "protocol", *statuses, "done", "apart"):
        table.add_column(col, justify="left" if col in ("method", "scope", "protocol", "apart") else "right")
    for (method, scope, protocol), counts in sorted(results.items()):
        total = sum(counts.values())
        done = total - sum(counts[a] for a in ACTIVE_STATUSES)
        cells = [method, scope, protocol, *(str(counts.get(x, 0)) for x in statuses), f"{done}/{total}"]
        table.add_row(*cells, apart_text(groups[(method, scope, protocol)]))
    return _drawn(table)


def _drawn(table) -> str:
    out = io.StringIO()
    Console(file=out, width=200).print(table)
    return out.getvalue()


def test_status_draws_the_same_table_without_reading_episode_rows(any_db):
    job_id = _varied_job(any_db)
    assert _drawn(progress_table(any_db, job_id)) == _old_table(any_db, job_id)
    with statements() as seen:
        shown = invoke("status", job_id, "--db", any_db.url)
        listed = invoke("status", "--db", any_db.url)
        job_finished(any_db, job_id)
        failure_reasons(any_db, job_id)
    assert shown.exit_code == 0 and listed.exit_code == 0, shown.output + listed.output
    assert f"job {job_id}: running" in shown.stdout and job_id in listed.stdout
    assert any("GROUP BY" in q for q in seen) and whole_rows(seen) == []


def test_a_poll_reads_the_fields_of_what_ended_only(any_db):
    job_id = _varied_job(any_db)
    polled, reported = io.StringIO(), io.StringIO()
    by_poll, by_rows = EndedLines(Console(file=polled, width=40)), EndedLines(Console(file=reported, width=40))

    def both() -> list[str]:
        with statements() as seen:
            by_poll.poll(any_db, job_id)
        with any_db.session() as s:
            by_rows.report([replace(Attempt.of(r), role=role) for r, role in _shown(s, job_id)])
        return [q for q in seen if q.startswith("SELECT")]

    assert whole_rows(both()) == []
    with any_db.session() as s:
        waiting = [r.id for r in st.latest_attempts(s, [job_id]) if r.status == "submitted"]
        failed = next(r.id for r in st.latest_attempts(s, [job_id]) if r.status == "timeout")
        st.new_attempt(s, failed)  # a retry: its key's ended attempt is no longer its result
    assert len(waiting) == 2
    for episode_id in waiting:
        with any_db.session() as s:
            st.record_grade(s, episode_id, "resolved", test_log="log", grader="t")
    assert len(both()) == 2  # the statuses, then the fields of the two that ended
    assert len(both()) == 1  # nothing new: the statuses only
    assert polled.getvalue() == reported.getvalue() and polled.getvalue().count("\n") > 5


def _old_export(db, job_id: str, *, r2e: bool = False, interactive: bool = False, method: str | None = None):
    """{configuration's model name: JSONL} as the whole-job read wrote it (every result row with its patch)."""
    from env.grading import export_patch_filtered
    from env.sandbox.tools import ToolCall, str_replace_path

    files: dict[str, list[str]] = {}
    with db.session() as s:
        for r in st.result_attempts(s, [job_id], include_interactive=interactive, full=True):
            if method and r.method != method:
                continue
            patch = r.patch
            if patch is not None and r2e:
                turns = st.get_episode(s, r.id).turns
                paths = [str_replace_path(ToolCall.model_validate(t.action)) for t in turns if t.action]
                patch = export_patch_filtered(patch, list(dict.fromkeys(p for p in paths if p)))
            if patch is None or not patch.strip():
                continue
            name = export.Configuration(r.method, r.scope, r.protocol, r.seed).model_name("org/model")
            line = {"instance_id": r.task_id, "model_name_or_path": name, "model_patch": patch}
            files.setdefault(name, []).append(json.dumps(line) + "\n")
    return {name: "".join(lines) for name, lines in sorted(files.items())}


@pytest.mark.parametrize("r2e,interactive", [(False, False), (True, False), (False, True)])
def test_export_streams_the_same_bytes(any_db, tmp_path, monkeypatch, r2e, interactive):
    monkeypatch.setattr(export, "CHUNK", 3)  # several chunks, one configuration's rows split across them
    job_id = _varied_job(any_db)
    flags = [*(["--r2e-filter"] if r2e else []), *(["--include-interactive"] if interactive else [])]
    expected = _old_export(any_db, job_id, r2e=r2e, interactive=interactive)
    assert len(expected) == 3 and all(text.count("\n") >= 1 for text in expected.values())
    with statements() as seen:
        done = invoke("export", job_id, "--output-dir", str(tmp_path / "out"), *flags, "--db", any_db.url)
    assert done.exit_code == 0, done.output
    written = {p.name: p.read_text(encoding="utf-8") for p in sorted((tmp_path / "out").iterdir())}
    assert written == {export.file_name(name): text for name, text in expected.items()}
    assert whole_rows(seen) == []
    assert ("from interactive attempt" in done.stderr) == interactive
    (one,) = [name for name in expected if "__nexus__" in name]
    only = ["--method", "nexus", "--scope", "prefill_decode"]
    piped = invoke("export", job_id, *only, *flags, "--db", any_db.url)
    assert piped.exit_code == 0 and piped.stdout == expected[one], piped.output
    to_file = invoke("export", job_id, *only, *flags, "-o", str(tmp_path / "one.jsonl"), "--db", any_db.url)
    assert to_file.exit_code == 0 and (tmp_path / "one.jsonl").read_text(encoding="utf-8") == expected[one]
    refused = invoke("export", job_id, "--method", "dense", "--db", any_db.url)
    assert refused.exit_code == 2 and "2 configurations" in refused.output and refused.stdout == ""


def test_export_holds_one_chunk_of_patches(sqlite_db, tmp_path, monkeypatch):
    """48 patches of 512 KB (24 MB): writing them holds a few chunks' worth, never the job's."""
    monkeypatch.setattr(export, "CHUNK", 2)
    keys = [Key(f"task-{i:02d}", "dense") for i in range(48)]
    with sqlite_db.session() as s:
        job = job_rows.create_job(s, config={}, config_hash="c" * 64, name="big")
        ids = [r.id for r in job_rows.add_episodes(s, job.id, keys)]
        job_id = job.id
    for i, episode_id in enumerate(ids):
        _run(sqlite_db, episode_id, "resolved", patch=_patch(f"t{i}", "dense", "x" * (512 * 1024)))
    tracemalloc.start()
    try:
        with sqlite_db.session() as s:
            found = export.collect(s, job_id)
            _, collected = tracemalloc.get_traced_memory()
            tracemalloc.reset_peak()
            export.write_each(s, found, tmp_path)
            _, written = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert found.summary() == "48 predictions in 1 configuration(s)"
    assert (tmp_path / "model__dense__prefill_decode__true_eviction__seed0.jsonl").stat().st_size > 48 * 512 * 1024
    assert max(collected, written) < 8 * 1024 * 1024, (collected, written)
