"""The measuring dtype of a replay row (``Replay.dtype``): part of the row's key beside the model, so a float32 and a
bfloat16 replay of one configuration are two rows, a rerun replaces only the row of its own dtype, and the keys
stored before dtypes were recorded stay valid."""

from __future__ import annotations

import hashlib
import json

import pytest
from sqlalchemy import select

from agent_runner.measuring_dtypes import MEASURING_DTYPES
from db import job_rows
from db import store as st
from db.measure_models import Replay
from db.replays import config_key, record_replay, replay_keys
from jobs.spec import JobSpec
from tests.support.db_fixtures import any_db_fixture, sqlite_db_fixture  # noqa: F401  (fixtures)

CONFIG = {"method": "snapkv", "density": 0.2, "scope": "prefill_only"}
MODEL = "smollm2-135m"


def _sha(obj) -> str:
    """The key as stored before dtypes were recorded, written out here: sha256 of the canonical JSON."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode("utf-8")).hexdigest()


def test_config_key_is_unchanged_without_a_dtype_and_distinct_for_each_dtype():
    assert config_key(CONFIG) == config_key(CONFIG, None, None) == _sha(CONFIG)
    assert config_key(CONFIG, MODEL) == config_key(CONFIG, MODEL, None) == _sha({"config": CONFIG, "model": MODEL})
    keys = {config_key(CONFIG, model, dtype) for model in (None, MODEL) for dtype in (None, *MEASURING_DTYPES)}
    assert len(keys) == 6  # every (model, dtype) its own key
    assert config_key(CONFIG, MODEL, "bfloat16") == _sha({"config": CONFIG, "model": MODEL, "dtype": "bfloat16"})
    assert config_key(CONFIG, None, "float32") == _sha({"config": CONFIG, "model": None, "dtype": "float32"})
    assert config_key(dict(reversed(list(CONFIG.items()))), MODEL, "float32") == config_key(CONFIG, MODEL, "float32")


def _source(db):
    spec = JobSpec.from_dict({"backend": "expert", "methods": ["dense"], "seeds": [0], "tasks": {"suite": "mini"}})
    with db.session() as s:
        job = job_rows.create_job(s, config=spec.model_dump(mode="json"), config_hash=spec.config_hash())
        (row,) = job_rows.add_episodes(s, job.id, spec.episodes(["t1"]))
        return job.id, row.id


def _record(db, episode_id, dtype, nll, *, model=MODEL):
    with db.session() as s:
        source = st.get_episode(s, episode_id)
        score = {"tokens": 10, "nll_mean": nll, "top1": 0.5, "turns": [], "seconds": 0.1}
        return record_replay(s, source, method="snapkv", scope="prefill_only", protocol="true_eviction",
                             config=CONFIG, status="ok", score=score, model=model, dtype=dtype).id  # fmt: skip


def test_a_float32_and_a_bfloat16_replay_of_one_configuration_keep_a_row_each(any_db):
    job, episode = _source(any_db)
    _record(any_db, episode, "float32", 1.0)
    _record(any_db, episode, "bfloat16", 2.0)
    _record(any_db, episode, None, 3.0)  # not recorded: a row of its own, never taken for either
    rerun = _record(any_db, episode, "float32", 1.5)  # replaces the float32 row alone
    with any_db.session() as s:
        rows = s.execute(select(Replay).order_by(Replay.id)).scalars().all()
        by_dtype = {r.dtype: (r.nll_mean, r.config_key) for r in rows}
        keys = {(k.dtype, k.config_key) for k in replay_keys(s, [job])}
    assert len(rows) == 3 and rows[-1].id == rerun
    assert {d: v[0] for d, v in by_dtype.items()} == {"float32": 1.5, "bfloat16": 2.0, None: 3.0}
    assert by_dtype["bfloat16"][1] == config_key(CONFIG, MODEL, "bfloat16")
    assert by_dtype[None][1] == config_key(CONFIG, MODEL)  # the key a row stored before dtypes had
    assert keys == {(d, v[1]) for d, v in by_dtype.items()}  # replay_keys names each row's dtype


@pytest.mark.parametrize("dtype", ["float16", "fp32", "bf16", "auto", ""])
def test_a_dtype_that_is_not_a_measuring_dtype_is_refused(sqlite_db, dtype):
    _, episode = _source(sqlite_db)
    with pytest.raises(ValueError, match="measuring dtype"):
        _record(sqlite_db, episode, dtype, 1.0)
    with sqlite_db.session() as s:
        assert s.execute(select(Replay)).scalars().all() == []
