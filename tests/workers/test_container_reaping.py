"""A host reaps the containers of episodes it no longer holds (issue 48: on separate hosts each has its own Docker
daemon, so nobody else can). Every container the service starts names its episode and the process whose claim it
serves (``nexus-eval.worker``: the run's, the grade's); the worker's sweeper, at its start and every sweep
(``workers.faults.recovery.reap_lost_containers``), removes a container whose episode another process holds now
or nobody holds, and keeps one this process still holds. Real containers on the real engine (marked ``docker``);
the database is a SQLite file."""

from __future__ import annotations

from datetime import timedelta

import pytest

from agent_runner.backends.scripted import ScriptedModel
from db import store as db_store
from db.claims import claim_episode
from db.finishing import finish_episode
from db.models import utcnow
from db.process_identity import worker_identity
from env.sandbox.config import EPISODE_LABEL, WORKER_LABEL, SandboxConfig
from jobs.settings import LIVENESS
from jobs.spec import JobSpec
from jobs.submit import create_job_rows, load_job_tasks, plan_job
from tests.agent_runner.conftest import RecordingEnvironment
from tests.db.test_liveness import _job
from tests.support.db_fixtures import sqlite_db_fixture  # noqa: F401  (fixtures)
from tests.support.worker_fixtures import oracle_job
from workers.execution import EpisodeHooks, execute_episode
from workers.faults.recovery import lost_containers
from workers.faults.sweeper import Sweeper

#: a worker on another host that took the episode over (its kernel part is not this one's: alive by its heartbeat)
OTHER = "gpu-node-7/4242/000000000000-1"
FINISH = "<function=finish>\n<parameter=command>submit</parameter>\n</function>"


class Box:
    """A container as the rule sees it: its labels."""

    def __init__(self, episode: str, worker: str | None = None) -> None:
        self.labels = {EPISODE_LABEL: episode, **({WORKER_LABEL: worker} if worker else {})}


def test_the_rule_keeps_only_what_is_held_for_it():
    holders = {"mine": "me", "taken": OTHER, "done": None, "legacy": OTHER}
    boxes = {
        "mine": Box("mine", "me"),
        "taken": Box("taken", "me"),
        "done": Box("done", "me"),
        "legacy": Box("legacy"),  # made before containers named their holder: kept while anyone holds it
        "unknown": Box("not-in-this-database", "me"),  # another deployment's: never ours to judge
    }
    lost = lost_containers(list(boxes.values()), holders)
    assert [b.labels[EPISODE_LABEL] for b in lost] == ["taken", "done"]


def test_a_run_and_a_grade_label_their_containers_with_the_claims_holder(sqlite_db, monkeypatch):
    spec = JobSpec.from_dict(oracle_job(["humanfmt__humanfmt-1"], ["dense"], ["true_eviction"]))
    _, (episode_id,) = create_job_rows(sqlite_db, plan_job(spec, load_job_tasks(spec)))
    seen: dict = {}

    def environment(task, **kw):
        seen.update(kw["labels"])
        return RecordingEnvironment()

    hooks = EpisodeHooks(wrap_model=lambda _m: ScriptedModel([FINISH]), open_environment=environment)
    assert execute_episode(sqlite_db, episode_id, hooks=hooks).ran
    assert seen[EPISODE_LABEL] == episode_id and seen[WORKER_LABEL] == worker_identity()

    import env.grading
    import env.tasks.images
    from env.sandbox.config import SandboxError

    grading_labels: dict = {}

    def start(_image, **kw):
        grading_labels.update(kw["labels"])
        raise SandboxError("recorded, not started")

    monkeypatch.setattr(env.grading.Sandbox, "start", start)
    monkeypatch.setattr(env.tasks.images, "ensure_task_image", lambda task, *a, **k: "image")
    episode = JobSpec.model_validate(spec.model_dump()).episode_config(
        "humanfmt__humanfmt-1", "dense", spec.scopes[0], spec.protocols[0], 0
    )
    task = load_job_tasks(spec)[0]
    env.grading.grade(task, "diff --git a/x b/x\n", config=episode.grade_config(job="j", episode="e", worker="g/1/k"))
    assert grading_labels[WORKER_LABEL] == "g/1/k" and grading_labels["nexus-eval.role"] == "grade"


@pytest.mark.docker
def test_a_worker_reaps_at_start_and_every_sweep_the_containers_of_episodes_it_no_longer_holds(
    sqlite_db, docker_client, base_image
):
    from env.sandbox.container import Sandbox

    me = worker_identity()
    job_id, (mine, taken, done, legacy) = _job(sqlite_db, 4)
    with sqlite_db.session() as s:
        mine_claim = claim_episode(s, mine, worker=me)
        claim_episode(s, taken, worker=OTHER)  # its claim belongs to another worker now (a takeover)
        done_claim = claim_episode(s, done, worker=me)
        claim_episode(s, legacy, worker=OTHER)
    with sqlite_db.session() as s:
        assert finish_episode(s, done_claim, "infra_failure", error="finished")
    config = SandboxConfig(ttl_s=600)
    boxes = {}
    try:
        for episode, labels in [(mine, {WORKER_LABEL: me}), (taken, {WORKER_LABEL: me}), (done, {WORKER_LABEL: me})]:
            boxes[episode] = Sandbox.start(
                base_image, config=config, job=job_id, episode=episode, labels=labels, client=docker_client
            )
        boxes[legacy] = Sandbox.start(base_image, config=config, job=job_id, episode=legacy, client=docker_client)

        def left() -> set[str]:
            found = docker_client.containers.list(
                all=True, ignore_removed=True, filters={"label": f"nexus-eval.job={job_id}"}
            )
            return {box.labels[EPISODE_LABEL] for box in found}

        sweeper = Sweeper(
            sqlite_db.url,
            LIVENESS,
            queues="gpu",
            send_run=lambda _id: pytest.fail("nothing is stranded"),
            send_grade=lambda _id: pytest.fail("nothing is stranded"),
            embedded=False,
            docker_check=lambda: None,
        )
        sweeper.sweep_once()  # the worker's start (its first sweep)
        assert left() == {mine, legacy}
        with sqlite_db.session() as s:  # then another worker takes over the run this one holds
            later = utcnow() + timedelta(seconds=1)
            assert claim_episode(s, mine, worker=OTHER, stale_after_s=0, now=later) is not None
            assert db_store.get_episode(s, mine).worker == OTHER != mine_claim.worker
        sweeper.sweep_once()  # a later sweep
        assert left() == {legacy}
    finally:
        for box in boxes.values():
            box.close()
