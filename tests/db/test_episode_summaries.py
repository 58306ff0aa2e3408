"""The summaries an episode stores at finish (what compare's cost columns and the lists read instead of its turns)
equal a recomputation from its stored turn rows, whichever writer ended it; so the fast path cannot drift from
the slow one."""

from __future__ import annotations

from statistics import mean

from sqlalchemy import select

from db import job_rows
from db import store as st
from db.finishing import fail_running_episode
from db.models import Episode, Turn
from tests.db.test_db_store import Key
from tests.support.db_fixtures import any_db_fixture  # noqa: F401  (fixture)
from tests.support.sweep_fixtures import store_sweep

SUMMARIES = ("n_turns", "prompt_tokens", "generated_tokens", "kv_peak_held_bytes", "kv_peak_allocated_bytes")


def _recomputed(session, episode_id: str) -> dict:
    """The summaries from the turn rows, written out independently of ``db.finishing.turn_totals``."""
    turns = session.execute(select(Turn).where(Turn.episode_id == episode_id)).scalars().all()
    held = [t.kv_held_bytes for t in turns if t.kv_held_bytes is not None]
    kept = [
        t.physical_after["mean"] / t.logical_length
        for t in turns
        if t.physical_after and t.physical_after.get("mean") is not None and t.logical_length
    ]
    peaks_held = [t.kv_peak_held_bytes for t in turns if t.kv_peak_held_bytes is not None]
    peaks_allocated = [t.kv_peak_allocated_bytes for t in turns if t.kv_peak_allocated_bytes is not None]
    return {
        "n_turns": len(turns),
        "prompt_tokens": sum(t.prompt_tokens for t in turns),
        "generated_tokens": sum(t.tokens_generated for t in turns),
        "kv_peak_held_bytes": max(peaks_held, default=None),
        "kv_peak_allocated_bytes": max(peaks_allocated, default=None),
        "mean_kv_held_bytes": mean(held) if held else None,
        "kept_fraction": mean(kept) if kept else None,
    }


def _stored(session, episode_id: str) -> dict:
    e = session.get(Episode, episode_id)
    return {name: getattr(e, name) for name in (*SUMMARIES, "mean_kv_held_bytes", "kept_fraction")}


def _close(a: dict, b: dict) -> bool:
    """Equal, floats to 1e-12 relative (a mean summed in another order)."""
    for k in a:
        x, y = a[k], b[k]
        if isinstance(x, float) and isinstance(y, float):
            if abs(x - y) > 1e-12 * max(abs(x), abs(y), 1.0):
                return False
        elif x != y:
            return False
    return True


def test_every_finished_episode_of_a_sweep_stores_its_turns_summaries(any_db):
    sweep = store_sweep(any_db)
    with any_db.session() as s:
        for episode_id in sweep.episode_ids.values():
            stored, recomputed = _stored(s, episode_id), _recomputed(s, episode_id)
            assert _close(stored, recomputed), (episode_id, stored, recomputed)
            assert stored["kept_fraction"] is not None and stored["mean_kv_held_bytes"] is not None


def test_a_failed_run_and_a_taken_over_run_store_the_turns_they_kept(any_db):
    with any_db.session() as s:
        job = job_rows.create_job(s, config={}, config_hash="c" * 64, name="t")
        a, b = job_rows.add_episodes(s, job.id, [Key("a", "snapkv"), Key("b", "snapkv")])
        ids = a.id, b.id
    turns = [
        {"logical_length": 100, "physical_after": {"min": 1, "mean": 20, "max": 30}, "kv_held_bytes": 800},
        {"logical_length": 0, "physical_after": {"min": 1, "mean": 5, "max": 9}, "kv_held_bytes": None},
        {"logical_length": 200, "physical_after": None, "kv_held_bytes": 1600, "prompt_tokens": 7},
    ]
    for episode_id in ids:
        with any_db.session() as s:
            claim = st.claim_episode(s, episode_id)
        for i, turn in enumerate(turns):
            with any_db.session() as s:
                st.record_turn(s, claim, i, **turn)
    with any_db.session() as s:
        assert fail_running_episode(s, ids[0], "timeout", "slow")
    with any_db.session() as s:  # a dead worker's run is taken over: its turns are dropped, the new run's kept
        claim = st.claim_episode(s, ids[1], stale_after_s=None, is_dead=lambda _w: True)
    with any_db.session() as s:
        st.record_turn(s, claim, 0, **turns[0])
    with any_db.session() as s:
        st.finish_episode(s, claim, "submitted")
    with any_db.session() as s:
        first, second = _stored(s, ids[0]), _stored(s, ids[1])
        assert _close(first, _recomputed(s, ids[0]))
        assert (first["mean_kv_held_bytes"], first["kept_fraction"]) == (1200.0, 0.2)  # the NULL and 0 left out
        assert _close(second, _recomputed(s, ids[1])) and second["n_turns"] == 1


def test_the_grades_network_flag_is_read_in_sql_without_loading_the_result(any_db):
    """Compare's offline-verdict note reads ``needs_network`` from a row loaded without ``result``."""
    with any_db.session() as s:
        job = job_rows.create_job(s, config={}, config_hash="c" * 64, name="t")
        rows = job_rows.add_episodes(s, job.id, [Key(t, "dense") for t in ("a", "b", "c")])
        ids, job_id = [r.id for r in rows], job.id
    for episode_id, report in zip(ids, [{"needs_network": True}, {"needs_network": False}, None], strict=True):
        with any_db.session() as s:
            claim = st.claim_episode(s, episode_id)
        with any_db.session() as s:
            st.finish_episode(s, claim, "submitted")
        with any_db.session() as s:
            st.record_grade(s, episode_id, "unresolved", report=report)
    with any_db.session() as s:
        flags = {e.id: e.needs_network for e in st.result_attempts(s, [job_id])}
    assert [flags[i] for i in ids] == [True, False, None]


def test_the_config_values_compare_reads_come_from_sql_alike_for_both_row_kinds(any_db):
    """``result_rows`` (plain rows) and ``result_attempts`` (ORM rows) give compare the same config values, read in
    SQL: density, backend, the pre-issue-19 sampler seed and the seed."""
    old = {"backend": "hf", "seed": 1, "agent": {"seed": 0, "max_steps": 3}, "eviction": {"density": 0.2}}
    new = {"backend": "oracle", "seed": 2, "agent": {"max_steps": 3}, "eviction": {"density": 0.5}}
    with any_db.session() as s:
        job = job_rows.create_job(s, config={}, config_hash="c" * 64, name="t")
        job_rows.add_episodes(s, job.id, [Key("a", "snapkv")], config=old)
        job_rows.add_episodes(s, job.id, [Key("b", "snapkv")], config=new)
        job_rows.add_episodes(s, job.id, [Key("c", "dense")], config={})
        job_id = job.id
    names = ("config_density", "config_backend", "config_agent_seed", "config_seed", "needs_network")
    expected = [(0.2, "hf", 0, 1, None), (0.5, "oracle", None, 2, None), (None, None, None, None, None)]
    with any_db.session() as s:
        plain = [tuple(getattr(r, n) for n in names) for r in st.result_rows(s, [job_id])]
        orm = [tuple(getattr(r, n) for n in names) for r in st.result_attempts(s, [job_id])]
    assert plain == orm == expected
