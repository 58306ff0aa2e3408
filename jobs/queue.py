"""The Celery app both sides share: queues, routes, task names and the reliability settings long episodes need.

A sender (``submit``, ``rerun``, the dashboard) publishes by task name through this app and never imports the
worker's tasks; a worker process registers them (``workers.celery_app`` loads ``workers.celery_tasks``). Nothing
is built at import: :func:`make_app` builds an app from :class:`jobs.settings.ServiceSettings`, and
:func:`get_app` keeps this process's one app.
"""

from __future__ import annotations

from celery import Celery
from kombu import Exchange, Queue

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
        # publishing (submit, the grade hand-off) rides out a short broker outage instead of failing
        task_publish_retry_policy={"max_retries": 60, "interval_start": 0.5, "interval_step": 0.5, "interval_max": 2.0},
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
