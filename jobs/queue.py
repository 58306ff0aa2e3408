"""The Celery app both sides share: queues, routes, task names and the reliability settings long episodes need.

A sender (``submit``, ``rerun``, the dashboard) publishes by task name through this app and never imports the
worker's tasks; a worker process registers them (``workers.celery_app`` loads ``workers.celery_tasks``). Nothing
is built at import: :func:`make_app` builds an app from :class:`jobs.settings.ServiceSettings`, and
:func:`get_app` keeps this process's one app.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from celery import Celery
from celery.result import AsyncResult
from kombu import Exchange, Queue
from kombu.exceptions import OperationalError

from jobs.settings import ServiceSettings

QUEUES = ("gpu", "grade", "default")
EPISODE_TASK = "nexus.episode"
GRADE_TASK = "nexus.grade"
RESUME_TASK = "nexus.resume_job"
PING_TASK = "nexus.ping"
TASK_ROUTES = {
    EPISODE_TASK: {"queue": "gpu"},
    GRADE_TASK: {"queue": "grade"},
    RESUME_TASK: {"queue": "default"},
    PING_TASK: {"queue": "default"},
}
#: how every publish (``submit``, the grade hand-off, the sweeper's sends) rides out a broker outage: Celery's
#: ``task_publish_retry_policy``, and :func:`send`'s own retries of a connection that is not open yet, 60 tries
#: 0.5 s apart growing to 2 s: about 2 minutes in all (:func:`publish_window_s`)
PUBLISH_RETRY_POLICY = {"max_retries": 60, "interval_start": 0.5, "interval_step": 0.5, "interval_max": 2.0}

log = logging.getLogger(__name__)


def make_app(settings: ServiceSettings | None = None) -> Celery:
    """A configured Celery app. Creating it loads nothing heavy (no model, no Docker)."""
    settings = settings or ServiceSettings.from_env()
    app = Celery(
        "nexus_eval",
        broker=settings.effective_broker,
        backend=settings.effective_result_backend,
        include=["workers.celery_tasks"],
    )
    # kombu's SQL transport hands its transport options to create_engine and has no visibility timeout
    transport = {} if settings.embedded else {"visibility_timeout": settings.effective_visibility_timeout}
    app.conf.update(
        task_queues=[Queue(name, Exchange(name, type="direct"), routing_key=name) for name in QUEUES],
        task_default_queue="default",
        task_default_exchange="default",
        task_default_routing_key="default",
        task_routes=TASK_ROUTES,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_track_started=True,
        result_extended=True,
        task_soft_time_limit=settings.soft_time_limit_s,
        task_time_limit=settings.hard_time_limit_s,
        broker_transport_options=transport,
        result_backend_transport_options={"visibility_timeout": settings.effective_visibility_timeout},
        broker_connection_retry_on_startup=True,
        broker_connection_max_retries=None,  # a Redis restart must not end the worker
        # publishing (submit, the grade hand-off) rides out a short broker outage instead of failing; :func:`send`
        # covers the case kombu does not retry (a connection that is not open yet)
        task_publish_retry_policy=PUBLISH_RETRY_POLICY,
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        worker_hijack_root_logger=False,
        worker_send_task_events=True,  # Flower's live view
        task_send_sent_event=True,
    )
    app.conf.nexus_settings = settings
    return app


_APP: list[Celery] = []  # this process's app, once built


def get_app(settings: ServiceSettings | None = None) -> Celery:
    """This process's app: built on the first call from ``settings`` (default: the environment), then the same
    one. Asking again with other settings is a programming error (one process talks to one broker)."""
    if not _APP:
        _APP.append(make_app(settings))
    elif settings is not None and settings != _APP[0].conf.nexus_settings:
        raise RuntimeError("this process's Celery app was already built with other settings")
    return _APP[0]


def publish_window_s(policy: dict = PUBLISH_RETRY_POLICY) -> float:
    """The seconds ``policy``'s retries wait in all (60 tries: 117 s)."""
    start, step, most = policy["interval_start"], policy["interval_step"], policy["interval_max"]
    return sum(min(start + i * step, most) for i in range(policy["max_retries"]))


def _unreachable(app: Celery, exc: OperationalError) -> bool:
    """Whether kombu's error comes from what its transport calls a connection error (the broker cannot be reached),
    not from a command the broker answered with a refusal."""
    with app.connection_for_write() as connection:  # no I/O: the connection is not opened
        return isinstance(exc.__cause__, connection.connection_errors)


def send(
    app: Celery,
    name: str,
    args: tuple,
    *,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> AsyncResult:
    """Publish task ``name(*args)`` through ``app``, riding out a broker that cannot be reached for
    :data:`PUBLISH_RETRY_POLICY`'s window; then kombu's ``OperationalError`` (the caller's fault handling takes over:
    ``NotEnqueued``, the sweeper's next send). A command the broker refuses is raised at once. Every publish of
    ours goes through here.

    Why not ``send_task(retry=True)`` alone: Celery hands the policy to kombu's ``Connection.ensure``, which
    retries a publish only on a connection that was open. A process whose pooled connection is not open (a
    prefork child's first send after the fork, one whose connection was dropped) opens it inside the publish
    with ``broker_connection_timeout`` (4 s), and kombu raises that failure as a library ``OperationalError``
    that ``ensure`` does not retry: a worker's grade hand-off failed after ~5 s of a Redis restart (issue 48).
    In a process that does not run tasks Celery's result backend happens to wait for Redis first, so only
    workers lost their sends."""
    policy = PUBLISH_RETRY_POLICY
    deadline, wait = clock() + publish_window_s(policy), policy["interval_start"]
    for attempt in range(policy["max_retries"] + 1):  # each try is bounded by kombu's own retries
        try:
            return app.send_task(name, args, retry=True)
        except OperationalError as exc:
            # waited out: refused, reset, timed out, still loading its data; raised at once: a command the broker
            # refuses (a permission, out of memory), which waiting does not change
            if not _unreachable(app, exc) or attempt == policy["max_retries"]:
                raise
            if clock() + wait > deadline:
                raise
            if attempt == 0:
                left = deadline - clock()
                log.warning("%s%s: the broker does not answer (%s); retrying for up to %.0f s", name, args, exc, left)
            sleep(wait)
            wait = min(wait + policy["interval_step"], policy["interval_max"])
    raise AssertionError("unreachable: the last try returns or raises")
