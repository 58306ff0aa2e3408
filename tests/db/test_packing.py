"""``db.packing``: the packed token streams and JSON read back bit-identical, refuse what would not, and
``packed_keep`` reads a stream's ``keep`` alone."""

from __future__ import annotations

import random

import pytest
from sqlalchemy import LargeBinary, select, type_coerce

from db import job_rows
from db import store as st
from db.models import Episode, Turn
from db.packing import pack_json, pack_tokens, packed_keep, unpack_json, unpack_tokens
from tests.db.test_db_store import Key
from tests.support.db_fixtures import any_db_fixture  # noqa: F401  (fixture)

STREAMS = [
    {"keep": 0, "append": [], "generated": []},
    {"keep": 2**32 - 1, "append": [0, 2**32 - 1], "generated": [151645]},
    {"keep": 77, "append": [random.Random(1).randrange(151936) for _ in range(5000)], "generated": [1] * 300},
]


@pytest.mark.parametrize("stream", STREAMS, ids=["empty", "extremes", "long"])
def test_a_stream_reads_back_bit_identical(stream):
    stored = pack_tokens(stream)
    assert unpack_tokens(stored) == stream and packed_keep(stored) == stream["keep"]
    assert len(stored) < 4 * (3 + len(stream["append"]) + len(stream["generated"])) + 16


@pytest.mark.parametrize(
    "bad",
    [
        {"keep": 1, "append": [-1], "generated": []},
        {"keep": 1, "append": [2**32], "generated": []},
        {"keep": 1, "append": [1.5], "generated": []},
        {"keep": 1, "append": [True], "generated": []},
        {"keep": -1, "append": [], "generated": []},
        {"keep": 1, "append": [], "generated": [], "extra": 1},
        {"keep": 1, "append": (1,), "generated": []},
    ],
)
def test_what_would_not_read_back_equal_is_refused(bad):
    with pytest.raises(ValueError, match="token stream"):
        pack_tokens(bad)


def test_json_round_trips_and_a_wrong_header_is_named():
    value = {"logical_length": 3, "kv_heads": 8, "layers": [[[8, 3]], [[1, 1], [0, 2]]], "x": 0.1, "é": None}
    assert unpack_json(pack_json(value)) == value
    with pytest.raises(ValueError, match="header"):
        unpack_json(pack_tokens(STREAMS[0]))
    with pytest.raises(ValueError, match="not a packed stream"):
        unpack_tokens(pack_json(value))


def test_the_columns_store_packed_bytes_and_read_dicts(any_db):
    retention = {"logical_length": 5, "kv_heads": 2, "layers": [[[2, 5]]]}
    with any_db.session() as s:
        job = job_rows.create_job(s, config={}, config_hash="c" * 64, name="t")
        (episode,) = job_rows.add_episodes(s, job.id, [Key("a", "dense")])
        claim = st.claim_episode(s, episode.id)
    for i, stream in enumerate([*STREAMS, None]):
        with any_db.session() as s:
            st.record_turn(s, claim, i, tokens=stream)
    with any_db.session() as s:
        st.finish_episode(s, claim, "submitted", retention=retention)
    with any_db.session() as s:
        rows = s.execute(select(Turn.tokens).where(Turn.episode_id == claim.episode_id).order_by(Turn.index))
        assert list(rows.scalars()) == [*STREAMS, None]
        raw = s.execute(select(type_coerce(Turn.tokens, LargeBinary)).order_by(Turn.index)).scalars().all()
        assert [packed_keep(r) for r in raw] == [0, 2**32 - 1, 77, None]
        assert bytes(raw[0][:2]) == b"T1"
        assert s.get(Episode, claim.episode_id).retention == retention
