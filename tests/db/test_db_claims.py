"""Idempotent execution: one claim wins, a redelivered or taken-over run never writes a second result."""

from __future__ import annotations

import subprocess
import sys
import threading
from dataclasses import dataclass
from datetime import timedelta

import pytest

from db import Episode, Turn, job_rows
from db import store as st
from db.models import utcnow
from db.process_identity import local_worker_is_dead, worker_identity
from tests.support.db_fixtures import any_db_fixture, sqlite_db_fixture  # noqa: F401  (fixtures)


@dataclass(frozen=True)
class Key:
    task_id: str
    method: str = "nexus"
    scope: str = "prefill_decode"
    protocol: str = "full_context"
    seed: int = 0


def _episodes(db, n: int = 1) -> list[str]:
    with db.session() as s:
        job = job_rows.create_job(s, config={}, config_hash="c" * 64, package_versions={}, git_revision="x")
        return [r.id for r in job_rows.add_episodes(s, job.id, [Key(f"t{i}") for i in range(n)])]


def _race(db, n_threads: int, work) -> list:
    """Run ``work(session)`` in n threads at once, each in its own session; return their results."""
    barrier = threading.Barrier(n_threads)
    results: list = [None] * n_threads
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            barrier.wait(timeout=30)
            with db.session() as s:
                results[i] = work(s, i)
        except BaseException as exc:  # collected and re-raised in the main thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    return results


def test_claim_record_finish(any_db):
    (ep,) = _episodes(any_db)
    with any_db.session() as s:
        claim = st.claim_episode(s, ep, celery_task_id="task-1")
        assert claim is not None and claim.worker == worker_identity() and claim.attempt == 1
        assert st.claim_episode(s, ep, worker="host/2") is None  # held by a live worker
    # (generated, held after, allocated after, peak held, peak allocated): the peaks come in different turns
    turns = [(10, 1000, 1500, 4000, 5000), (20, 3000, 3500, 6000, 7000), (5, 2000, 2500, 7000, 6500)]
    for i, (gen, held, allocated, peak_held, peak_allocated) in enumerate(turns):
        with any_db.session() as s:
            st.record_turn(
                s,
                claim,
                i,
                tokens_generated=gen,
                tokens_appended=100,
                prompt_tokens=100 * (i + 1),
                kv_held_bytes=held,
                kv_allocated_bytes=allocated,
                kv_peak_held_bytes=peak_held,
                kv_peak_allocated_bytes=peak_allocated,
                completion=f"turn {i}",
                action={"name": "bash", "arguments": {"cmd": "ls"}},
            )
    with any_db.session() as s, pytest.raises(TypeError, match="unknown turn field"):
        st.record_turn(s, claim, 3, token_count=1)
    with any_db.session() as s:
        with pytest.raises(ValueError, match="not one of"):
            st.finish_episode(s, claim, "resolvd")
        assert st.finish_episode(s, claim, "submitted", exit_status="submitted", patch="diff --git", agent_s=1.5)
    with any_db.session() as s:
        assert st.finish_episode(s, claim, "submitted", patch="second") is False  # duplicate delivery
        row = s.get(Episode, ep)
        assert (row.status, row.patch, row.celery_task_id, row.n_claims) == ("submitted", "diff --git", "task-1", 1)
        assert (row.n_turns, row.generated_tokens, row.appended_tokens, row.prompt_tokens) == (3, 35, 300, 600)
        # the episode's peaks are the largest of its turns' peaks, never a post-turn snapshot
        assert (row.kv_peak_held_bytes, row.kv_peak_allocated_bytes) == (7000, 7000) and row.finished_at is not None
        stored = [
            (t.kv_held_bytes, t.kv_allocated_bytes, t.kv_peak_held_bytes, t.kv_peak_allocated_bytes) for t in row.turns
        ]
        assert stored == [t[1:] for t in turns]
        assert st.claim_episode(s, ep) is None  # finished: a redelivery is a no-op
        assert s.get(type(row.job), row.job_id).status == "running"  # the grade is still to come
        assert st.record_grade(s, ep, "resolved")
        assert s.get(type(row.job), row.job_id).status == "done"


def test_kv_peaks_stay_none_when_no_turn_reported_one(sqlite_db):
    """A backend without a visible cache (oracle, openai) stores no KV figures: the episode's peaks stay None."""
    (ep,) = _episodes(sqlite_db)
    with sqlite_db.session() as s:
        claim = st.claim_episode(s, ep)
    with sqlite_db.session() as s:
        st.record_turn(s, claim, 0, tokens_generated=3, completion="x")
        assert st.finish_episode(s, claim, "submitted", exit_status="submitted")
    with sqlite_db.session() as s:
        row = s.get(Episode, ep)
        assert (row.n_turns, row.kv_peak_held_bytes, row.kv_peak_allocated_bytes) == (1, None, None)


def test_grade_once_then_regrade(any_db):
    (ep,) = _episodes(any_db)
    with any_db.session() as s:
        claim = st.claim_episode(s, ep)
    with any_db.session() as s:
        assert st.record_grade(s, ep, "resolved") is False  # still running: nothing to grade
        assert st.finish_episode(s, claim, "step_limit", exit_status="step_limit", patch="p")
    with any_db.session() as s:
        assert st.record_grade(s, ep, "unresolved", test_log="FAILED", grader="swebench", report={"f2p": [0, 1]})
        assert st.record_grade(s, ep, "resolved", test_log="again") is False  # redelivered grade task
        row = s.get(Episode, ep)
        assert (row.status, row.exit_status, row.test_log, row.result) == (
            "unresolved",
            "step_limit",
            "FAILED",
            {"grade": {"f2p": [0, 1]}},
        )
    with any_db.session() as s:
        assert st.record_grade(s, ep, "resolved", test_log="PASSED", regrade=True)
        assert s.get(Episode, ep).status == "resolved"


def test_takeover_of_dead_worker(any_db):
    (ep,) = _episodes(any_db)
    with any_db.session() as s:
        dead = st.claim_episode(s, ep, worker="gpu-node-7/4242")
    with any_db.session() as s:
        st.record_turn(s, dead, 0, completion="partial")
    with any_db.session() as s:
        assert st.claim_episode(s, ep, worker="gpu-node-8/1") is None  # another host: not judged dead
        new = st.claim_episode(s, ep, worker="gpu-node-8/1", is_dead=lambda w: w == "gpu-node-7/4242")
        assert new is not None and new.took_over_from == "gpu-node-7/4242"
    with any_db.session() as s:
        assert s.get(Episode, ep).turns == []  # the dead run's partial turns are discarded
        with pytest.raises(st.ClaimLost):
            st.record_turn(s, dead, 1, completion="zombie")
    with any_db.session() as s:
        st.record_turn(s, new, 0, completion="fresh")
        assert st.finish_episode(s, dead, "submitted", patch="zombie") is False
        assert st.finish_episode(s, new, "submitted", patch="fresh")
    with any_db.session() as s:
        row = s.get(Episode, ep)
        assert (row.patch, row.worker, row.n_claims, [t.completion for t in row.turns]) == (
            "fresh",
            "gpu-node-8/1",
            2,
            ["fresh"],
        )


def test_takeover_after_stale_heartbeat(sqlite_db):
    (ep,) = _episodes(sqlite_db)
    with sqlite_db.session() as s:
        st.claim_episode(s, ep, worker="far-away/1", now=utcnow() - timedelta(minutes=30))
    with sqlite_db.session() as s:
        assert [r.id for r in st.stale_episodes(s, 600)] == [ep] and st.stale_episodes(s, 3600) == []
        assert st.claim_episode(s, ep, stale_after_s=3600) is None
        assert st.claim_episode(s, ep, stale_after_s=600) is not None


def test_local_worker_is_dead():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    host, _, kernel = worker_identity().split("/")
    assert local_worker_is_dead(f"{host}/{proc.pid}/{kernel}") is True
    assert local_worker_is_dead(worker_identity()) is False
    assert local_worker_is_dead(f"{host}/{proc.pid}") is False  # stored before the kernel part: never by its pid
    # the hostname decides nothing: another UTS name in this pid namespace (a network-namespace host) is this table
    assert local_worker_is_dead(f"not-{host}/{proc.pid}/{kernel}") is True


def test_fail_running_episode(sqlite_db):
    (ep,) = _episodes(sqlite_db)
    with sqlite_db.session() as s:
        claim = st.claim_episode(s, ep)
    with sqlite_db.session() as s:
        assert st.fail_running_episode(s, ep, "timeout", "hard time limit", claim_token="other") is False
        assert st.fail_running_episode(s, ep, "timeout", "hard time limit (3600 s)", claim_token=claim.token)
    with sqlite_db.session() as s:
        assert st.finish_episode(s, claim, "submitted") is False
        row = s.get(Episode, ep)
        assert (row.status, row.error) == ("timeout", "hard time limit (3600 s)")


def test_racing_claims_one_winner(any_db):
    (ep,) = _episodes(any_db)
    claims = _race(any_db, 8, lambda s, i: st.claim_episode(s, ep, worker=f"w{i}/1"))
    winners = [c for c in claims if c is not None]
    assert len(winners) == 1
    with any_db.session() as s:
        row = s.get(Episode, ep)
        assert (row.worker, row.n_claims) == (winners[0].worker, 1)


def test_racing_finishes_one_result(any_db):
    """A redelivered run (takeover) and the original finish at the same moment: one result row."""
    (ep,) = _episodes(any_db)
    with any_db.session() as s:
        first = st.claim_episode(s, ep, worker="a/1")
    with any_db.session() as s:
        second = st.claim_episode(s, ep, worker="b/2", is_dead=lambda w: True)
    claims = [first, second]
    written = _race(any_db, 2, lambda s, i: st.finish_episode(s, claims[i], "submitted", patch=f"from {i}"))
    assert written == [False, True]
    with any_db.session() as s:
        assert s.get(Episode, ep).patch == "from 1"


def test_many_workers_never_run_an_episode_twice(any_db):
    """4 workers each receive every message (worst-case redelivery); each episode runs exactly once."""
    episodes = _episodes(any_db, 6)
    ran: list[tuple[int, str]] = []
    lock = threading.Lock()

    def worker(_s, i):
        for ep in episodes:
            with any_db.session() as s:
                claim = st.claim_episode(s, ep, worker=f"w{i}/1")
            if claim is None:
                continue
            with any_db.session() as s:
                st.record_turn(s, claim, 0, completion=f"w{i}")
            with any_db.session() as s:
                assert st.finish_episode(s, claim, "submitted", patch=f"w{i}")
            with lock:
                ran.append((i, ep))

    _race(any_db, 4, worker)
    assert sorted(ep for _, ep in ran) == sorted(episodes)
    with any_db.session() as s:
        rows = [s.get(Episode, ep) for ep in episodes]
        assert all(r.status == "submitted" and r.n_claims == 1 and len(r.turns) == 1 for r in rows)
        assert s.query(Turn).count() == 6


def _process_worker(url: str, episodes: list[str], name: str) -> list[str]:
    """One worker process of test_processes_share_a_sqlite_file: claim and finish whatever it can."""
    from db import connect

    db = connect(url, upgrade=False)
    ran = []
    for ep in episodes:
        with db.session() as s:
            claim = st.claim_episode(s, ep, worker=f"{name}/1")
        if claim is None:
            continue
        with db.session() as s:
            st.record_turn(s, claim, 0, completion=name)
        with db.session() as s:
            if st.finish_episode(s, claim, "submitted", patch=name):
                ran.append(ep)
    db.dispose()
    return ran


@pytest.mark.slow
def test_processes_share_a_sqlite_file(sqlite_db):
    """The embedded default: separate processes on one SQLite file still run each episode exactly once."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    episodes = _episodes(sqlite_db, 12)
    with ProcessPoolExecutor(3, mp_context=multiprocessing.get_context("spawn")) as pool:
        results = list(pool.map(_process_worker, [sqlite_db.url] * 3, [episodes] * 3, ["p0", "p1", "p2"]))
    assert sorted(ep for ran in results for ep in ran) == sorted(episodes)
    with sqlite_db.session() as s:
        assert all(s.get(Episode, ep).n_claims == 1 for ep in episodes)


def test_cancel_racing_claims_leaves_everything_cancelled(any_db):
    """`cancel` while workers claim: no deadlock, no error, and nothing is left queued or running."""
    episodes = _episodes(any_db, 8)
    with any_db.session() as s:
        job_id = s.get(Episode, episodes[0]).job_id

    def work(s, i):
        if i == 0:
            return job_rows.cancel_job(s, job_id)
        return [st.claim_episode(s, ep, worker=f"w{i}/1") for ep in episodes[i - 1 :: 3]]

    _race(any_db, 4, work)
    with any_db.session() as s:
        assert {r.status for r in st.episodes_for_job(s, job_id)} == {"cancelled"}
        assert job_rows.job_summary(s, job_id).status == "cancelled"


def test_loaded_objects_see_the_new_state(sqlite_db):
    """The claim functions write with conditional UPDATEs; objects loaded in the same session must not go stale."""
    (ep,) = _episodes(sqlite_db)
    with sqlite_db.session() as s:
        row = st.get_episode(s, ep)
        assert row.status == "queued"
        claim = st.claim_episode(s, ep, celery_task_id="c1")
        assert (row.status, row.worker, row.n_claims, row.celery_task_id) == ("running", claim.worker, 1, "c1")
        st.record_turn(s, claim, 0, completion="x")
        assert st.finish_episode(s, claim, "submitted", patch="p")
        assert (row.status, row.patch, row.n_turns) == ("submitted", "p", 1)
        assert st.record_grade(s, ep, "resolved")
        assert st.get_episode(s, ep).status == "resolved" and row.status == "resolved"
        assert job_rows.cancel_job(s, row.job_id) is None and row.status == "resolved"  # nothing to cancel: unchanged
        assert job_rows.get_job(s, row.job_id).status != "cancelled"
