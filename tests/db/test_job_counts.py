"""One result rule, every reader: ``jobs.counts``, the status table, the progress lines and their "is it done",
the dashboard's job page and progress API, the job's episode grid, ``compare``, ``rerun`` all count each key's
*result* attempt (``db.attempt_roles``) and keep resamples, interactive and steered attempts apart.

A seeded random walk through every writer (claim, finish, fail, give back, release, grade, regrade, rerun of a
broken run, resample, interactive attempt, steering, cancel) checks after each step that every reader agrees with
the rule written out in Python over all attempts (:func:`db.attempt_roles.roles_of`), on SQLite and PostgreSQL."""

from __future__ import annotations

import random
from collections import Counter, defaultdict
from io import StringIO

from rich.console import Console
from sqlalchemy import select

from dashboard import queries
from db import episode_lists, job_rows, progress
from db import store as st
from db.attempt_roles import AttemptFacts, Role, roles_of
from db.finishing import fail_running_episode
from db.job_status import recount, summarize
from db.liveness import give_back, release
from db.models import AGENT_EXIT_STATUSES, GRADE_STATUSES, Episode, Job
from nexus_eval.commands._job_progress import EndedLines
from results.compare import compare_jobs
from tests.db.test_db_store import Key
from tests.support.db_fixtures import any_db_fixture, sqlite_db_fixture  # noqa: F401  (fixtures)
from workers.embedded import job_finished, progress_table


def _rows(db, job_id: str) -> list:
    with db.session() as s:
        columns = (Episode.id, Episode.episode_key, Episode.attempt, Episode.driver, Episode.status)
        query = select(*columns, Episode.method, Episode.scope, Episode.protocol).where(Episode.job_id == job_id)
        # ordered: the seeded walk draws from this list, so the same seed walks the same way on every database
        return list(s.execute(query.order_by(Episode.episode_key, Episode.attempt)))


def _by_rule(rows) -> dict[str, str]:
    """{episode id: role} by the rule written out over every attempt of every key."""
    by_key = defaultdict(list)
    for r in rows:
        by_key[r.episode_key].append(r)
    roles = {}
    for attempts in by_key.values():
        rule = roles_of(AttemptFacts(r.attempt, r.driver, r.status) for r in attempts)
        roles.update({r.id: rule[r.attempt].value for r in attempts})
    return roles


def _expected(rows) -> tuple[Counter, dict[str, Counter], dict]:
    """(result statuses, role -> statuses apart, (method, scope, protocol) -> role -> statuses)."""
    roles = _by_rule(rows)
    result: Counter = Counter()
    apart: dict[str, Counter] = defaultdict(Counter)
    groups: dict = defaultdict(lambda: defaultdict(Counter))
    for r in rows:
        role = roles[r.id]
        if role == Role.replaced:
            continue
        (result if role == Role.result else apart[role])[r.status] += 1
        groups[(r.method, r.scope, r.protocol)][role][r.status] += 1
    return result, {k: v for k, v in apart.items() if v}, groups


def _check_every_reader(db, job_id: str, did: list[str]) -> None:
    rows = _rows(db, job_id)
    roles = _by_rule(rows)
    result, apart, groups = _expected(rows)
    with db.session() as s:
        job = s.get(Job, job_id)
        assert job.counts == recount(s, job_id), did
        summary = summarize(s, job)
        assert summary.counts == dict(result), did
        assert summary.apart == {k: dict(v) for k, v in apart.items()}, did
        assert {g: {r: dict(c) for r, c in by.items()} for g, by in progress.group_counts(s, job_id).items()} == {
            g: {r: dict(c) for r, c in by.items()} for g, by in groups.items()
        }, did
        shown = {i: st for i, st, _role in progress.shown_statuses(s, job_id)}
        assert shown == {r.id: r.status for r in rows if roles[r.id] != Role.replaced}, did
        page = queries.progress(s, job_id)
        assert page["counts"] == dict(result) and page["total"] == sum(result.values()), did
        assert page["apart"] == {k: dict(v) for k, v in apart.items()}, did
        assert episode_lists.facets(s, job_id).statuses == dict(result), did
        assert {e.id for e in st.result_attempts(s, [job_id])} == {i for i, r in roles.items() if r == Role.result}
        resamples = {e.id for e in st.resample_attempts(s, [job_id])}
        assert resamples == {r.id for r in rows if roles[r.id] == Role.resample and r.status not in _BROKEN}, did
        table = compare_jobs(s, [job_id])
    cells = [c for row in table.rows for c in row.cells.values() if not c.reused_dense]
    counted = sum(c.n + c.pending + c.ungraded + c.cancelled for c in cells)
    assert counted == sum(result.values()), did  # every key's result, once
    unfinished = any(st in ("queued", "running") or st in AGENT_EXIT_STATUSES for st in [*result, *_flat(apart)])
    assert job_finished(db, job_id) == (job.status == "cancelled" or not unfinished), did


_BROKEN = {"timeout", "infra_failure", "cancelled"}


def _flat(apart: dict[str, Counter]) -> list[str]:
    return [status for by in apart.values() for status in by]


def _step(db, rng: random.Random, job_id: str, claims: dict) -> str:
    """One random write through the store's functions; returns what it did."""
    rows = _rows(db, job_id)
    row = rng.choice(rows)
    episode_id, status = row.id, row.status
    with db.session() as s:
        if status == "queued":
            claims[episode_id] = st.claim_episode(s, episode_id)
            return "claim"
        if status == "running" and episode_id in claims:
            claim = claims.pop(episode_id)
            pick = rng.random()
            if row.driver == "interactive" and pick < 0.3:
                st.record_turn(s, claim, 0, steered=True)  # an operator replaced an action
                claims[episode_id] = claim
                return "steer"
            if pick < 0.5:
                st.finish_episode(s, claim, rng.choice(sorted(AGENT_EXIT_STATUSES | GRADE_STATUSES)))
                return "finish"
            if pick < 0.65:
                fail_running_episode(s, episode_id, rng.choice(["timeout", "infra_failure"]), "slow")
                return "fail"
            if pick < 0.8:
                give_back(s, claim)
                return "give back"
            release(s, episode_id, stale_after_s=0.0, is_dead=lambda _w: True)
            return "release"
        if status in AGENT_EXIT_STATUSES:
            st.record_grade(s, episode_id, rng.choice(sorted(GRADE_STATUSES)))
            return "grade"
        if status in GRADE_STATUSES and rng.random() < 0.3:
            st.record_grade(s, episode_id, "unresolved", regrade=True)
            return "regrade"
        if status not in ("queued", "running"):
            pick = rng.random()
            if pick < 0.25:
                st.new_attempt(s, episode_id, driver="interactive")
                return "interactive"
            if pick < 0.45:
                st.rerun_job(s, job_id, sorted(_BROKEN - {"cancelled"}))  # `rerun --failed`
                return "rerun failed"
            # a rerun of this attempt (a resample of a verdict, a retry of a broken run), newest or not
            st.new_attempt(s, episode_id)
            return "rerun"
    return "nothing"


def test_every_reader_counts_by_the_one_result_rule(any_db):
    rng = random.Random(44)
    print("seed 44")
    with any_db.session() as s:
        job = job_rows.create_job(s, config={"grade": True}, config_hash="c" * 64, name="walk")
        job_rows.add_episodes(s, job.id, [Key(f"t{i}", m) for i in range(3) for m in ("dense", "snapkv")])
        job_id = job.id
    claims: dict = {}
    did: list[str] = []
    for _ in range(220):
        did.append(_step(any_db, rng, job_id, claims))
        _check_every_reader(any_db, job_id, did[-6:])
    wanted = {"claim", "finish", "fail", "grade", "regrade", "rerun", "rerun failed", "interactive", "steer"}
    assert wanted | {"release", "give back"} <= set(did), Counter(did)
    roles = set(_by_rule(_rows(any_db, job_id)).values())
    assert {Role.result, Role.resample, Role.interactive, Role.steered, Role.replaced} <= roles, roles
    with any_db.session() as s:
        job_rows.cancel_job(s, job_id)
    _check_every_reader(any_db, job_id, ["cancel"])
    with any_db.session() as s:
        assert s.get(Job, job_id).status == "cancelled"


def _finish(db, episode_id: str, status: str) -> None:
    with db.session() as s:
        claim = st.claim_episode(s, episode_id)
    with db.session() as s:
        st.finish_episode(s, claim, status)


def test_status_says_what_compare_says_after_a_resample(sqlite_db):
    """Issue 44, item 1: an oracle job of 2 tasks, one verdict set to unresolved, `rerun JOB --status unresolved`
    drained: compare says dense 1/2 (the resample apart), and so must `status`, the jobs list and the job page
    (they counted each key's newest attempt: dense resolved 2)."""
    with sqlite_db.session() as s:
        job = job_rows.create_job(s, config={"grade": True}, config_hash="c" * 64, name="oracle")
        first, second = (r.id for r in job_rows.add_episodes(s, job.id, [Key("a", "dense"), Key("b", "dense")]))
        job_id = job.id
    _finish(sqlite_db, first, "resolved")
    _finish(sqlite_db, second, "resolved")
    with sqlite_db.session() as s:
        st.record_grade(s, second, "unresolved", regrade=True)
        (resample,) = st.rerun_job(s, job_id, ["unresolved"])
        resample_id = resample.id
    _finish(sqlite_db, resample_id, "resolved")

    with sqlite_db.session() as s:
        cell = compare_jobs(s, [job_id]).rows[0].cells["dense"]
        summary = summarize(s, s.get(Job, job_id))
        page = queries.progress(s, job_id)
        listed = queries.list_jobs(s).rows[0]
    assert (cell.resolved, cell.n, cell.resamples) == (1, 2, 1)
    assert summary.counts == {"resolved": 1, "unresolved": 1} and summary.status == "done"
    assert summary.apart == {"resample": {"resolved": 1}}
    assert page["counts"] == {"resolved": 1, "unresolved": 1} and page["finished"] == 2
    assert (listed.total, listed.finished, listed.counts) == (2, 2, {"resolved": 1, "unresolved": 1})

    out = StringIO()
    Console(file=out, width=200).print(progress_table(sqlite_db, job_id))
    text = out.getvalue()
    header, row = (line for line in text.splitlines() if "method" in line or "dense" in line)
    cells = dict(zip([c.strip() for c in header.split("┃")], [c.strip() for c in row.split("│")], strict=False))
    assert (cells["resolved"], cells["unresolved"], cells["done"]) == ("1", "1", "2/2"), text
    assert "1 resample (1 resolved)" in cells["apart"], text

    lines = StringIO()
    EndedLines(Console(file=lines, width=300)).poll(sqlite_db, job_id)
    said = lines.getvalue().splitlines()
    assert said[-1].startswith("[2/2] resample: resolved dense"), said
    assert "(1 resolved, 1 unresolved, 0 left)" in said[-1], said


def test_a_job_stored_without_counts_is_recounted_by_a_read_and_stored_by_a_write(any_db):
    with any_db.session() as s:
        job = job_rows.create_job(s, config={}, config_hash="c" * 64, name="old")
        job_rows.add_episodes(s, job.id, [Key("a", "dense"), Key("b", "dense")])
        job.counts = {"queued": 2}  # the form versions before issue 44 stored: newest attempts, no roles
        job_id = job.id
    with any_db.session() as s:
        assert summarize(s, s.get(Job, job_id)).counts == {"queued": 2}
        assert s.get(Job, job_id).counts == {"queued": 2}  # a read never writes
        (first, _) = st.episodes_for_job(s, job_id)
        claim = st.claim_episode(s, first.id)
    with any_db.session() as s:
        assert s.get(Job, job_id).counts == {"result": {"queued": 1, "running": 1}} == recount(s, job_id)
        assert claim is not None


def test_a_queued_resample_can_be_cancelled_from_the_job_page():
    """The job page's cancel button reads every attempt under way, not only the results'."""
    from dashboard.list_queries import job_actions

    assert not job_actions({"resolved": 2}, {"resolved": 2}).cancel
    assert job_actions({"resolved": 2}, {"resolved": 2}, {"resample": {"queued": 1}}).cancel


def test_the_status_table_and_the_job_page_word_the_apart_attempts_alike():
    """One wording (``db.attempt_roles.apart_text``): the job page said "2 resample" and sorted the roles
    alphabetically where the status table said "2 resamples" in the roles' order."""
    from datetime import UTC, datetime

    from db.attempt_roles import apart_text

    apart = {"steered": {"running": 1}, "resample": {"resolved": 1, "unresolved": 1}}
    row = queries.JobRow("j", None, "running", datetime.now(UTC), 2, 2, {"resolved": 2}, apart=apart)
    assert row.apart_text == apart_text(apart) == "2 resamples (1 resolved, 1 unresolved); 1 steered (1 running)"
