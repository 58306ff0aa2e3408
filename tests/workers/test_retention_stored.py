"""An hf episode stores its final cache's retention map (``episodes.retention``); a backend without a cache stores
None. execute_episode on the tiny model with a sandbox test double (no Docker), on a real SQLite file and (under
``services``) PostgreSQL, where the map is JSONB."""

from __future__ import annotations

import pytest

from agent_runner.loaded_models import host_for
from db import store as db_store
from jobs.spec import JobSpec
from jobs.submit import create_job_rows, load_job_tasks, plan_job
from nexus.retention import expand
from tests.agent_runner.conftest import RecordingEnvironment
from tests.support.db_fixtures import any_db_fixture, sqlite_db_fixture  # noqa: F401  (fixtures)
from tests.support.worker_fixtures import oracle_job
from workers.execution import EpisodeHooks, execute_episode

HOOKS = EpisodeHooks(open_environment=lambda task, **kw: RecordingEnvironment())


def _stored(db, spec: JobSpec) -> list:
    _, episode_ids = create_job_rows(db, plan_job(spec, load_job_tasks(spec)))
    rows = []
    for episode_id in episode_ids:
        outcome = execute_episode(db, episode_id, hooks=HOOKS)
        assert outcome.written, outcome.reason
        with db.session() as s:
            row = db_store.get_episode(s, episode_id)
            last = row.turns[-1]
            rows.append((row.method, row.protocol, row.retention, last.logical_length, last.physical_after, row.error))
    return rows


@pytest.mark.parametrize("protocol", ["true_eviction", "full_context"])
def test_an_hf_episode_stores_the_final_caches_retention_map(any_db, protocol):
    spec = JobSpec.from_dict(
        {
            "backend": "hf",
            "model": {"name": "tiny", "device": "cpu"},
            "methods": ["dense", "snapkv"],
            "scopes": ["prefill_decode"],
            "protocols": [protocol],
            "tasks": {"suite": "mini", "ids": ["humanfmt__humanfmt-1"]},
            "limits": {"max_steps": 2, "soft_step_limit": 2},
            "sampling": {"max_new_tokens": 16},
        }
    )
    rows = _stored(any_db, spec)
    text = host_for(spec.model).model.config.get_text_config()
    assert sorted(r[0] for r in rows) == ["dense", "snapkv"]
    for method, _, retention, logical, physical_after, error in rows:
        assert retention is not None, error
        # the final cache is the last turn's: same logical length, and the heads' held slots are its occupancy
        assert retention["logical_length"] == logical > 0
        assert retention["kv_heads"] == text.num_key_value_heads and len(retention["layers"]) == text.num_hidden_layers
        counts = expand(retention)
        occupancy = [sum(layer) / retention["kv_heads"] for layer in counts]
        assert sum(occupancy) / len(occupancy) == pytest.approx(physical_after["mean"])
        if method == "dense":
            assert retention["layers"] == [[[text.num_key_value_heads, logical]]] * text.num_hidden_layers
        else:
            assert all(0 in layer for layer in counts), "snapkv forgot nothing"


def test_a_backend_without_a_cache_stores_none(sqlite_db):
    spec = JobSpec.from_dict(oracle_job(["humanfmt__humanfmt-1"], ["dense"], ["true_eviction"]))
    ((_, _, retention, _, _, _),) = _stored(sqlite_db, spec)
    assert retention is None
