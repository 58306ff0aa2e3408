"""A worker's sends through a Redis restart (issue 48): the grade hand-off, made while Redis is down, goes out once
Redis is back instead of failing after ~5 s. Redis is the test's own (``tests/support/own_services.py``), stopped and
started again by the test.

Why it failed: kombu retries a publish under ``task_publish_retry_policy`` only on a connection that was open; a
worker process that had not published since its fork opened it inside the publish, gave up after
``broker_connection_timeout`` (4 s) and raised a library error that the retry does not catch. Outside a worker,
Celery's result backend happened to wait for Redis first (``Backend.on_task_call``), which is why ``submit`` never
showed it: the tests run the send as a worker's pool process does (``in_a_worker_process``)."""

from __future__ import annotations

import base64
import json
import subprocess
import threading
import time

import pytest
import redis
from celery._state import _set_task_join_will_block, task_join_will_block
from kombu.exceptions import OperationalError

from db import sqlite_url
from jobs.queue import GRADE_TASK, make_app, send
from jobs.settings import ServiceSettings
from tests.support.own_services import OwnRedis
from workers.celery_tasks import _senders

pytestmark = [pytest.mark.services, pytest.mark.slow]
DOWN_S = 8.0  # the outage: longer than kombu's 4 s connect timeout, well inside the policy's 117 s


@pytest.fixture
def in_a_worker_process():
    """What Celery's prefork pool sets in each pool process (``celery.concurrency.prefork.process_initializer``):
    a task's sends skip the result backend's subscription."""
    before = task_join_will_block()
    _set_task_join_will_block(True)
    yield
    _set_task_join_will_block(before)


def queued(url: str, queue: str) -> list[tuple[str, list]]:
    """The (task name, args) of each message waiting in ``queue`` (kombu's Redis layout: a list per queue)."""
    client = redis.Redis.from_url(url)
    messages = [json.loads(raw) for raw in client.lrange(queue, 0, -1)]
    client.close()
    return [(m["headers"]["task"], json.loads(base64.b64decode(m["body"]))[0]) for m in messages]


def test_a_grade_hand_off_made_while_redis_is_down_goes_out_once_redis_is_back(tmp_path, in_a_worker_process):
    with OwnRedis() as own:
        app = make_app(ServiceSettings(broker_url=own.url, db_url=sqlite_url(tmp_path / "results.db")))
        hand_off = _senders(app)["send_grade"]  # what episode_task calls after an agent exit, and the sweeper
        own.shutdown()
        back = threading.Timer(DOWN_S, own.start)
        back.start()
        started = time.monotonic()
        try:
            hand_off("episode-1")
            took = time.monotonic() - started
        finally:
            back.join(60)
        assert DOWN_S - 1 < took < DOWN_S + 30, took  # it waited the outage out, and went out soon after
        assert queued(own.url, "grade") == [(GRADE_TASK, ["episode-1"])]
        app.close()


def test_a_send_the_broker_refuses_is_not_waited_out(tmp_path, in_a_worker_process):
    """A broker that answers but refuses the write (here an ACL) is no outage: the error comes at once, so
    `submit` names the job and `nexus-eval resume` without waiting out the retry window."""
    with OwnRedis() as own:
        acl = ["redis-cli", "-p", str(own.port), "ACL", "SETUSER", "default", "-lpush", "-rpush"]
        subprocess.run(acl, check=True, capture_output=True, timeout=20)
        app = make_app(ServiceSettings(broker_url=own.url, db_url=sqlite_url(tmp_path / "results.db")))
        started = time.monotonic()
        with pytest.raises(OperationalError, match="no permissions"):
            send(app, GRADE_TASK, ("episode-1",))
        assert time.monotonic() - started < 5
        app.close()
