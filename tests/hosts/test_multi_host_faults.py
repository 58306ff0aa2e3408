"""Workers on separate hosts sharing Redis and PostgreSQL, and the faults only separate hosts have (issue 48).

One bed for the module (``tests.support.hosts``): S serves Redis (password) and PostgreSQL; A and B are worker hosts
with their own hostnames, pid namespaces and Docker daemons; graders run where each test says. Each test runs its own
job through the real CLI and ``nexus-eval worker`` processes, strikes, and ends with the promise of docs/service.md:
every episode finished and graded exactly once (one newest attempt per key, a verdict on each, nothing queued or
running, the job done), the job's stored counts equal to a recount from its rows, and no container of the job left
on any host's Docker daemon once the hosts that died are back.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import text

import docker
from db import connect, job_rows
from db import store as db_store
from db.job_status import recount
from db.models import GRADE_STATUSES
from tests.conftest import docker_status, require
from tests.support.hosts import HostBed, wait_for
from tests.support.worker_fixtures import job_done, oracle_job, submit_file, write_job
from tests.workers.test_fault_recovery import _poll, _quietly  # 20 Hz polls; a read while the database is down

pytestmark = [pytest.mark.services, pytest.mark.docker, pytest.mark.slow]
TASKS = ["humanfmt__humanfmt-1", "dslib__dslib-1"]
# liveness in seconds rather than minutes, so each fault plays out within the test (docs/service.md has the defaults)
FAST = {
    "NEXUS_EVAL_HEARTBEAT": "1",
    "NEXUS_EVAL_STALE_AFTER": "6",
    "NEXUS_EVAL_SWEEP": "2",
    "NEXUS_EVAL_DB_RETRY": "90",
    "NEXUS_EVAL_DOCKER_WAIT": "60",
    "NEXUS_EVAL_GRADE_RESEND": "10",
}


@pytest.fixture(scope="module")
def bed(tmp_path_factory):
    require(*docker_status())
    with HostBed(tmp_path_factory.mktemp("hosts"), images=TASKS) as bed:
        bed.db = connect(bed.postgres.url)  # the operator's reads, over the test's own link to S
        yield bed
        bed.db.dispose()


@pytest.fixture
def hosts(bed):
    """The bed, with every host's processes stopped and every link and daemon back after the test."""
    yield bed
    for host in bed.hosts.values():
        for process in host.processes:
            process.kill()
        host.processes.clear()
        if host.name != "S":
            bed.join(host.name)
        if host.dockerd is not None and not host.dockerd.answers():
            host.dockerd.start()


def _job(bed: HostBed, folder: Path, methods: list[str]) -> str:
    job = write_job(folder / "job.yaml", **oracle_job(TASKS, methods, ["true_eviction"]))
    return submit_file(job, bed.env(**FAST))


def _rows(bed: HostBed, job_id: str) -> list:
    with bed.db.session() as s:
        return db_store.episodes_for_job(s, job_id, full=True)


def _held_by(bed: HostBed, job_id: str, host: str, statuses=("running",)) -> list:
    prefix = f"{host.lower()}-host/"
    return [r for r in _rows(bed, job_id) if r.status in statuses and (r.worker or "").startswith(prefix)]


def _containers(bed: HostBed, job_id: str) -> dict[str, int]:
    """The job's containers on each daemon: every worker host's own, and the machine's (S's grader uses it)."""
    daemons = {h.name: h.dockerd.host for h in bed.worker_hosts()} | {"S": None}
    counts = {}
    for name, url in daemons.items():
        client = docker.DockerClient(base_url=url, timeout=30) if url else docker.from_env(timeout=30)
        try:
            counts[name] = len(client.containers.list(all=True, filters={"label": f"nexus-eval.job={job_id}"}))
        finally:
            client.close()
    return counts


def assert_once(bed: HostBed, job_id: str, *, n_keys: int) -> dict:
    """The promise, and the evidence for the closing table: statuses, claims, counts and containers left."""
    with bed.db.session() as s:
        job = job_rows.get_job(s, job_id)
        rows = db_store.episodes_for_job(s, job_id, full=True)
        newest = db_store.latest_attempts(s, [job_id], full=True)
        assert job.status == "done", job.status
        assert len(newest) == len({r.episode_key for r in rows}) == n_keys
        assert [r.id for r in rows if r.status in ("queued", "running")] == []
        assert all(r.status in GRADE_STATUSES and r.graded_at is not None for r in newest), [
            (r.id, r.status, r.error) for r in newest
        ]
        assert all(len(r.turns) == r.n_turns for r in newest)  # a dead run's partial turns were replaced
        assert job.counts == recount(s, job_id)  # the stored counts are the rows' counts
    wait_for(lambda: not any(_containers(bed, job_id).values()), 60, f"job {job_id}'s containers removed", bed)
    return {"claims": sorted(r.n_claims for r in newest), "statuses": sorted(r.status for r in newest)}


def _start_all(bed: HostBed, *, graders=("S",)) -> None:
    env = bed.env(**FAST)
    for name in ("A", "B"):
        bed.worker(name, env)
    for name in graders:
        bed.worker(name, env, queues="grade,default")


def test_a_host_killed_whole_mid_episode_is_taken_over_and_its_containers_reaped_when_it_boots(hosts, tmp_path):
    env = hosts.env(**FAST)
    hosts.worker("A", env)  # A alone first, so that it is A that holds an episode when it dies
    hosts.worker("S", env, queues="grade,default")
    job_id = _job(hosts, tmp_path, ["dense", "snapkv"])
    _poll(lambda: _held_by(hosts, job_id, "A"), 120, "an episode running on A", hosts.tails)
    victim = _held_by(hosts, job_id, "A")[0].id
    hosts.kill_host("A")  # its worker, and its Docker daemon with the episode's container in it
    hosts.worker("B", env)
    wait_for(lambda: job_done(hosts.db, job_id), 120, f"job {job_id} after A died", hosts)
    taken = next(r for r in _rows(hosts, job_id) if r.id == victim)
    assert taken.n_claims == 2 and taken.result["took_over_from"].startswith("a-host/")
    assert not taken.worker.startswith("a-host/")
    hosts.boot("A")
    hosts.worker("A", env)  # at its start it reaps the containers of episodes it no longer holds
    assert_once(hosts, job_id, n_keys=4)


def test_a_host_cut_off_past_the_deadline_and_back_is_refused_and_reaps_its_own_container(hosts, tmp_path):
    env = hosts.env(**FAST)
    a = hosts.worker("A", env)
    hosts.worker("S", env, queues="grade,default")
    job_id = _job(hosts, tmp_path, ["dense"])
    _poll(lambda: _held_by(hosts, job_id, "A"), 120, "an episode running on A", hosts.tails)
    victim = _held_by(hosts, job_id, "A")[0].id
    hosts.cut("A")
    hosts.worker("B", env)
    taken_over = lambda: any(r.id == victim and r.n_claims == 2 for r in _rows(hosts, job_id))  # noqa: E731
    wait_for(taken_over, 60, f"B taking {victim} over", hosts)
    hosts.join("A")  # back after the deadline: its late writes meet a claim that is no longer its own
    wait_for(lambda: job_done(hosts.db, job_id), 120, f"job {job_id}", hosts)
    taken = next(r for r in _rows(hosts, job_id) if r.id == victim)
    assert taken.n_claims == 2 and taken.result["took_over_from"].startswith("a-host/")
    assert_once(hosts, job_id, n_keys=2)  # A's container of the episode it lost is gone: A reaped it
    wait_for(lambda: "no longer holds" in a.tail(10**6), 90, "A's late write refused by the claim", hosts)


_HOLD_LOCK = """
import sys, time
from pathlib import Path
from db import connect
from db.claims import lock_job
from db.session_bounds import WORKER_BOUNDS
db = connect(sys.argv[1], upgrade=False, bounds=WORKER_BOUNDS)  # a worker's connection: the server's bounds on it
session = db.sessions()
session.begin()
lock_job(session, sys.argv[2])  # what claim, finish and takeover take first
print("locked", flush=True)
release = Path(sys.argv[3])
deadline = time.monotonic() + 300
while not release.exists() and time.monotonic() < deadline:
    time.sleep(0.2)
session.commit()
print("released", flush=True)
"""


def _hold_the_job_lock(bed: HostBed, job_id: str, release: Path):
    holder = bed.run("A", "lock", [sys.executable, "-c", _HOLD_LOCK, bed.postgres.url, job_id, str(release)], bed.env())
    wait_for(lambda: "locked" in holder.tail(), 60, "A holding the job lock", bed)
    return holder


def _lock_holders(bed: HostBed) -> int:
    with bed.db.session() as s:
        query = "SELECT count(*) FROM pg_stat_activity WHERE state = 'idle in transaction' AND client_addr = :a"
        return s.execute(text(query), {"a": bed.hosts["A"].address}).scalar_one()


@pytest.mark.parametrize("link", ["back", "gone_for_good"])
def test_a_host_cut_off_holding_the_job_lock_stops_no_one_for_long(hosts, tmp_path, link):
    """Held, then released (the link returns and the holder commits); or held for good (the server ends the
    session at its idle-in-transaction bound, 30 s, and the lock goes with it)."""
    job_id = _job(hosts, tmp_path, ["dense"])
    release = tmp_path / "release"
    holder = _hold_the_job_lock(hosts, job_id, release)
    hosts.cut("A")
    started = time.monotonic()
    env = hosts.env(**FAST)
    hosts.worker("B", env)
    hosts.worker("S", env, queues="grade,default")
    if link == "back":
        time.sleep(5)
        assert [r.status for r in _rows(hosts, job_id)] == ["queued", "queued"]  # every writer waits on the lock
        hosts.join("A")
        release.touch()
        wait_for(lambda: "released" in holder.tail(), 60, "the holder's commit", hosts)
    wait_for(lambda: job_done(hosts.db, job_id), 120, f"job {job_id} past the held lock", hosts)
    took = time.monotonic() - started
    assert took < (40 if link == "back" else 60), took  # not the ~2 h of TCP keepalive
    if link == "gone_for_good":
        assert took > 25, took  # it did wait for the server's bound (30 s, from the holder's last statement)
        assert _lock_holders(hosts) == 0  # the server ended the cut-off session
    assert_once(hosts, job_id, n_keys=2)


def test_redis_killed_and_restarted_during_hand_offs_loses_no_grade(hosts, tmp_path):
    """SIGKILL, not a clean shutdown: a hand-off in the last second before it may be lost with the AOF's last write,
    and is then sent again by a sweeper (``NEXUS_EVAL_GRADE_RESEND``, 10 s here)."""
    _start_all(hosts)
    job_id = _job(hosts, tmp_path, ["dense", "snapkv", "nexus"])
    _poll(lambda: any(r.status != "queued" for r in _rows(hosts, job_id)), 120, "the first episode", hosts.tails)
    hosts.redis.kill()
    time.sleep(5)
    hosts.redis.start()
    wait_for(lambda: job_done(hosts.db, job_id), 180, f"job {job_id} after the Redis restart", hosts)
    assert "Connection to broker lost" in hosts.tails(10**6)  # the outage was met, and ridden out
    assert_once(hosts, job_id, n_keys=6)


def test_postgres_restarted_mid_job_on_the_server_host(hosts, tmp_path):
    _start_all(hosts)
    job_id = _job(hosts, tmp_path, ["dense", "snapkv", "nexus"])
    _poll(lambda: any(r.status != "queued" for r in _rows(hosts, job_id)), 120, "the first episode", hosts.tails)
    hosts.postgres.stop("fast")
    time.sleep(5)
    hosts.postgres.start()
    wait_for(_quietly(lambda: job_done(hosts.db, job_id)), 180, f"job {job_id} after the restart", hosts)
    assert "database unreachable" in hosts.tails(10**6)  # every database call was retried through the outage
    assert_once(hosts, job_id, n_keys=6)
    assert all(r.attempt == 1 for r in _rows(hosts, job_id))  # nothing was acknowledged into nothing and retried


def test_a_grade_in_flight_on_a_host_that_dies_is_graded_once_elsewhere(hosts, tmp_path):
    env = hosts.env(**FAST)
    hosts.worker("A", env, queues="grade")  # A grades; B runs the episodes
    hosts.worker("B", env)
    job_id = _job(hosts, tmp_path, ["dense"])
    grading_on_a = lambda: _held_by(hosts, job_id, "A", ("submitted", "step_limit"))  # noqa: E731
    _poll(grading_on_a, 120, "a grade held by A", hosts.tails)
    victim = grading_on_a()[0].id
    hosts.kill_host("A")
    hosts.worker("S", env, queues="grade,default")
    wait_for(lambda: job_done(hosts.db, job_id), 120, f"job {job_id} after A died grading", hosts)
    graded = next(r for r in _rows(hosts, job_id) if r.id == victim)
    assert graded.status in GRADE_STATUSES and graded.worker.startswith("s-host/")
    hosts.boot("A")
    hosts.worker("A", env, queues="grade")
    assert_once(hosts, job_id, n_keys=2)
