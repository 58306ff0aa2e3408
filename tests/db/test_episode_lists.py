"""``db.episode_lists`` (the episode grid and ``episodes`` in SQL) equals the Python-side lists it replaced.

The reference is what the dashboard did before: ``db.store.result_attempts`` (rows by key) through
``dashboard.list_queries.EPISODES.parse(...).apply`` (filter, stable sort, missing values last). A job of varied rows
(ties, NULL costs, task ids that differ in case and hold ``_``/``%``, reruns of broken runs, resamples, interactive
attempts) is listed both ways for every sort key and order, every filter value and some combinations, on SQLite and
(``services``) PostgreSQL.
"""

from __future__ import annotations

import json
import random
import re
from collections import Counter

import pytest
from sqlalchemy import Engine, event, select
from sqlalchemy.dialects import postgresql, sqlite

from dashboard.list_queries import EPISODES
from db import episode_lists, job_rows
from db import store as db_store
from db.models import Episode
from tests.support.db_fixtures import any_db_fixture  # noqa: F401  (fixture)

TASKS = ["django__django-1", "Django__django-10", "astropy_x", "sym%py-2", "a-b", "a_b", "zeta"]
METHODS = ["dense", "nexus", "snapkv", "h2o"]
SCOPES = ["prefill_only", "prefill_decode"]
PROTOCOLS = ["true_eviction", "full_context"]
VERDICTS = ["resolved", "unresolved", "empty_patch", "submitted", "queued", "running"]
# (statuses of the key's attempts in order, the driver of each): which one is the result differs per shape
SHAPES = [
    (("resolved",), ("agent",)),
    (("timeout", "unresolved"), ("agent", "agent")),  # a rerun of a broken run is the result
    (("unresolved", "resolved"), ("agent", "agent")),  # a resample: attempt 1 stays the result
    (("infra_failure", "cancelled"), ("agent", "agent")),  # every attempt broke: the newest
    (("unresolved", "resolved"), ("agent", "steered")),  # interactive: not the result unless counted
    (("resolved",), ("interactive",)),  # only interactive: no result
]


@pytest.fixture
def varied(any_db):
    """(db, job id): about 80 keys of random configurations and shapes, seeded."""
    rng = random.Random(35)
    with any_db.session() as s:
        job = job_rows.create_job(s, config={}, config_hash="h", package_versions={}, git_revision="")
        job_id = job.id
        keys = {(rng.choice(TASKS), rng.choice(METHODS), rng.choice(SCOPES), rng.choice(PROTOCOLS), rng.randrange(3))
                for _ in range(110)}  # fmt: skip
        for task, method, scope, protocol, seed in sorted(keys):
            statuses, drivers = rng.choice(SHAPES)
            if statuses == ("resolved",) and drivers == ("agent",):
                statuses = (rng.choice(VERDICTS),)
            for attempt, (status, driver) in enumerate(zip(statuses, drivers, strict=True), start=1):
                s.add(Episode(
                    job_id=job_id, task_id=task, method=method, scope=scope, protocol=protocol, seed=seed,
                    attempt=attempt, driver=driver, status=status,
                    episode_key=job_rows.episode_key(task, method, scope, protocol, seed),
                    n_turns=rng.choice([None, 3, 5, 5, 12]), prompt_tokens=rng.choice([None, 100, 100, 2000]),
                    generated_tokens=rng.choice([None, 7, 50, 50]), wall_s=rng.choice([None, 1.5, 7.0, 7.0, 30.25]),
                    kv_peak_held_bytes=rng.choice([None, 500, 2**20, 2**20]),
                    kv_peak_allocated_bytes=rng.choice([None, 900, 2**21]), config={},
                ))  # fmt: skip
    return any_db, job_id


def _python(rows, sort="task", order="asc", **filters) -> list[str]:
    return [r.id for r in EPISODES.parse(sort, order, filters).apply(rows)]


def _sql(s, job_id, sort="task", order="asc", limit=None, offset=0, **filters) -> list[str]:
    return [r.id for r in episode_lists.page(s, job_id, filters=filters, sort=sort, order=order, limit=limit,
                                             offset=offset)]  # fmt: skip


def test_every_sort_and_filter_equals_the_python_list(varied):
    db, job_id = varied
    with db.session() as s:
        rows = db_store.result_attempts(s, [job_id])
        assert len(rows) > 60
        for sort in EPISODES.sorts:
            for order in ("asc", "desc"):
                assert _sql(s, job_id, sort, order) == _python(rows, sort, order), (sort, order)
        values = {name: sorted({getattr(r, name) for r in rows}) for name in ("status", "method", "scope", "protocol")}
        for name, seen in values.items():
            for value in [*seen, "nosuch"] if name != "status" else seen:
                assert _sql(s, job_id, **{name: value}) == _python(rows, **{name: value}), (name, value)
        for needle in ("DJANGO", "django__django-1", "_", "%", "a-", "A_B", "1", "zzz", "  zeta  ", ""):
            assert _sql(s, job_id, task=needle) == _python(rows, task=needle), needle
        combos = [
            ("wall_s", "desc", {"method": "nexus", "task": "a"}),
            ("turns", "asc", {"status": "resolved", "scope": "prefill_only"}),
            ("kv_peak_held_bytes", "desc", {"protocol": "full_context", "task": "_"}),
        ]
        for sort, order, filters in combos:
            expected = _python(rows, sort, order, **filters)
            assert _sql(s, job_id, sort, order, **filters) == expected
            assert episode_lists.count(s, job_id, filters) == len(expected)
            for offset in (0, 3, len(expected)):  # a page is a slice of the same order
                assert _sql(s, job_id, sort, order, limit=4, offset=offset, **filters) == expected[offset : offset + 4]


def test_facets_are_the_counts_and_dropdown_values(varied):
    db, job_id = varied
    with db.session() as s:
        rows = db_store.result_attempts(s, [job_id])
        facets = episode_lists.facets(s, job_id)
        assert facets.total == len(rows) == episode_lists.count(s, job_id)
        assert facets.statuses == dict(Counter(r.status for r in rows))
        for name in ("status", "method", "scope", "protocol"):
            assert facets.values[name] == sorted({getattr(r, name) for r in rows}), name


def _result_ids_by_rule(rows, include_interactive: bool) -> set[str]:
    """The rule written out over every attempt (docs/numbers.md): a key's result is its first agent attempt that did
    not break, else its newest agent attempt; with interactive attempts, a key's newest one that did not break
    replaces it."""
    broken = {"timeout", "infra_failure", "cancelled"}
    by_key = {}
    for r in sorted(rows, key=lambda r: (r.episode_key, r.attempt)):
        by_key.setdefault(r.episode_key, []).append(r)
    chosen = set()
    for attempts in by_key.values():
        agent = [r for r in attempts if r.driver == "agent"]
        pick = next((r for r in agent if r.status not in broken), agent[-1] if agent else None)
        ran = [r for r in attempts if r.driver != "agent" and r.status not in broken]
        if include_interactive and ran:
            pick = ran[-1]
        if pick is not None:
            chosen.add(pick.id)
    return chosen


def test_result_attempts_follow_the_rule_with_and_without_interactive_attempts(varied):
    db, job_id = varied
    with db.session() as s:
        every = db_store.episodes_for_job(s, job_id)
        assert any(r.driver != "agent" for r in every) and any(r.attempt > 1 for r in every)  # the rule is exercised
        for include in (False, True):
            numbers = db_store.result_attempt_numbers([job_id], include_interactive=include)
            got = set(s.execute(select(Episode.id).join(numbers, db_store.at_numbers(numbers))).scalars())
            assert got == _result_ids_by_rule(every, include), include
            assert {r.id for r in db_store.result_attempts(s, [job_id], include_interactive=include)} == got
            assert {r.id for r in db_store.result_rows(s, [job_id], include_interactive=include)} == got


@pytest.mark.parametrize(
    ("statuses", "method", "results_only"),
    [
        (None, None, False),
        ({"resolved", "unresolved"}, None, False),
        (None, "nexus", True),
        ({"timeout"}, "h2o", False),
    ],
)
def test_attempts_equal_what_episodes_listed(varied, statuses, method, results_only):
    db, job_id = varied
    with db.session() as s:
        results = {r.id for r in db_store.result_attempts(s, [job_id])}
        expected = [
            (r.id, r.attempt, r.driver, r.id in results)
            for r in db_store.episodes_for_job(s, job_id)
            if (statuses is None or r.status in statuses)
            and (method is None or r.method == method)
            and (not results_only or r.id in results)
        ]
        got = episode_lists.attempts(s, job_id, statuses=statuses, method=method, results_only=results_only, chunk=7)
        assert [(r.id, r.attempt, r.driver, r.result) for r in got] == expected
        assert all(type(r.result) is bool for r in episode_lists.attempts(s, job_id))


def test_bad_names_say_what_is_allowed(varied):
    db, job_id = varied
    with db.session() as s:
        with pytest.raises(ValueError, match="unknown sort key 'nope'.*kv_peak_allocated_bytes"):
            episode_lists.page(s, job_id, sort="nope")
        with pytest.raises(ValueError, match="unknown order 'up'; allowed: asc, desc"):
            episode_lists.page(s, job_id, order="up")
        with pytest.raises(ValueError, match="unknown episode filter.*colour.*allowed: status, method"):
            episode_lists.page(s, job_id, filters={"colour": "red"})
        with pytest.raises(ValueError, match="limit"):
            episode_lists.page(s, job_id, limit=0)


def test_the_names_are_the_dashboards():
    assert tuple(episode_lists.SORTS) == tuple(EPISODES.sorts)
    assert set(episode_lists.FILTERS) == set(EPISODES.filters)


def test_text_sorts_by_code_point_on_postgresql_whatever_its_locale():
    class Bound:
        def __init__(self, name):
            self.dialect = type("D", (), {"name": name})()

    class FakeSession:
        def __init__(self, name):
            self.name = name

        def get_bind(self):
            return Bound(self.name)

    by_task = episode_lists._binary(FakeSession("postgresql"), Episode.task_id)
    assert 'COLLATE "C"' in str(by_task.compile(dialect=postgresql.dialect()))
    assert "COLLATE" not in str(episode_lists._binary(FakeSession("sqlite"), Episode.task_id).compile(
        dialect=sqlite.dialect()))  # fmt: skip
    assert episode_lists._binary(FakeSession("postgresql"), Episode.seed) is Episode.seed


# -- `nexus-eval episodes`: the same bytes, one query, printed as the rows arrive ---------------------------------


def _old_output(db, job_id, fmt, statuses=None, method=None, results_only=False) -> str:
    """What `episodes` printed before: two loads of the job, every row built, then printed at once."""
    columns = ("episode", "task", "method", "scope", "protocol", "seed", "attempt", "driver", "result", "status")
    with db.session() as s:
        results = {r.id for r in db_store.result_attempts(s, [job_id])}
        rows = [
            dict(
                zip(
                    columns,
                    (r.id, r.task_id, r.method, r.scope, r.protocol, r.seed, r.attempt, r.driver)
                    + (r.id in results, r.status),
                    strict=True,
                )
            )  # fmt: skip
            for r in db_store.episodes_for_job(s, job_id)
            if (statuses is None or r.status in statuses)
            and (method is None or r.method == method)
            and (not results_only or r.id in results)
        ]
    if fmt == "json":
        return json.dumps(rows, indent=1) + "\n"
    cell = lambda v: ("yes" if v else "") if isinstance(v, bool) else str(v)  # noqa: E731
    return "\t".join(columns) + "\n" + "".join("\t".join(cell(row[c]) for c in columns) + "\n" for row in rows)


@pytest.mark.parametrize(
    ("args", "statuses", "method", "results_only"),
    [((), None, None, False), (("--status", "resolved,timeout", "--method", "nexus"), {"resolved", "timeout"},
      "nexus", False), (("--results",), None, None, True), (("--status", "nosuch"), {"nosuch"}, None, False)],
)  # fmt: skip
def test_episodes_prints_the_same_bytes(varied, args, statuses, method, results_only):
    from tests.cli.test_cli import read_cli

    db, job_id = varied
    for fmt in ("tsv", "json"):
        printed = read_cli("episodes", job_id[:4], "--format", fmt, *args, db=db)
        assert printed == _old_output(db, job_id, fmt, statuses, method, results_only), fmt


def test_episodes_is_one_query_printed_as_it_is_read(varied, capsys, monkeypatch):
    from nexus_eval.commands import service_episodes

    db, job_id = varied
    listed = episode_lists.attempts
    lines_before: list[int] = []  # output lines already printed when each row came from the database
    out: list[str] = []

    def watched(*args, **kwargs):
        for row in listed(*args, **{**kwargs, "chunk": 3}):
            out.append(capsys.readouterr().out)
            lines_before.append("".join(out).count("\n"))
            yield row

    statements: list[str] = []
    count = lambda *a: statements.append(a[2])  # noqa: E731
    monkeypatch.setattr(episode_lists, "attempts", watched)
    event.listen(Engine, "before_cursor_execute", count)
    try:
        service_episodes.episodes(job_id, None, None, False, "tsv", db.url)
    finally:
        event.remove(Engine, "before_cursor_execute", count)
    out.append(capsys.readouterr().out)
    assert "".join(out) == _old_output(db, job_id, "tsv")
    assert lines_before == list(range(1, len(lines_before) + 1))  # the header, then each row before the next is read
    assert len([q for q in statements if re.search(r"\bFROM episodes\b", q)]) == 1
