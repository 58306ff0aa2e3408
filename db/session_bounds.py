"""How long a PostgreSQL connection may wait on a peer that is gone: the bounds every connection of ours asks for,
and the stricter ones of a worker's (issue 48: a worker host cut off inside a transaction held the job lock, and
every other writer of the job waited, until the kernel's keepalive noticed about 2 h later).

``db.connection.make_engine`` hands them to psycopg (``connect_args``: libpq parameters, and the server's session
settings as ``-c name=value`` in the startup ``options``). docs/service.md, "A worker host cut off from PostgreSQL".
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from sqlalchemy.engine import URL


@dataclass(frozen=True)
class SessionBounds:
    """How long a PostgreSQL connection may wait on a peer that is gone, each bound defined once here.

    connect_timeout_s:     a connection attempt gives up after this (libpq ``connect_timeout``), not after the
                           kernel's SYN retries (about 2 min) when the server's host is cut off.
    keepalives_idle_s, keepalives_interval_s, keepalives_count:
                           TCP keepalives on both ends (libpq ``keepalives_*``; the server's ``tcp_keepalives_*``
                           and ``tcp_user_timeout``, per session): a peer that vanished is noticed after
                           idle + interval x count = 60 s (:attr:`dead_peer_s`) instead of the kernel's 2 h.
    idle_in_transaction_s: the server ends a session idle inside a transaction this long: its transaction rolls
                           back and its locks (the job row's, ``db.claims.lock_job``) are released. None: never.
    statement_timeout_s:   the server cancels a statement (a lock wait included) after this. None: never.
    """

    connect_timeout_s: int = 10
    keepalives_idle_s: int = 30
    keepalives_interval_s: int = 10
    keepalives_count: int = 3
    idle_in_transaction_s: float | None = None
    statement_timeout_s: float | None = None

    @property
    def dead_peer_s(self) -> int:
        return self.keepalives_idle_s + self.keepalives_interval_s * self.keepalives_count

    def server_settings(self) -> dict[str, str]:
        """The session settings the server applies (``-c name=value`` in the startup packet's ``options``)."""
        settings = {
            "tcp_keepalives_idle": str(self.keepalives_idle_s),
            "tcp_keepalives_interval": str(self.keepalives_interval_s),
            "tcp_keepalives_count": str(self.keepalives_count),
            "tcp_user_timeout": str(self.dead_peer_s * 1000),  # ms; also bounds data the peer never acknowledges
        }
        if self.idle_in_transaction_s is not None:
            settings["idle_in_transaction_session_timeout"] = str(round(self.idle_in_transaction_s * 1000))
        if self.statement_timeout_s is not None:
            settings["statement_timeout"] = str(round(self.statement_timeout_s * 1000))
        return settings

    def connect_args(self, url: URL) -> dict[str, object]:
        """psycopg's connection arguments; what the URL's query sets itself wins (its ``options`` come last, so a
        ``-c`` there overrides ours)."""
        args: dict[str, object] = {
            "connect_timeout": self.connect_timeout_s,
            "keepalives": 1,
            "keepalives_idle": self.keepalives_idle_s,
            "keepalives_interval": self.keepalives_interval_s,
            "keepalives_count": self.keepalives_count,
            "tcp_user_timeout": self.dead_peer_s * 1000,
        }
        args = {key: value for key, value in args.items() if key not in url.query}
        ours = " ".join(f"-c {name}={value}" for name, value in self.server_settings().items())
        given = url.query.get("options")
        args["options"] = f"{ours} {given}" if isinstance(given, str) and given.strip() else ours
        return args


#: every PostgreSQL connection: the connect timeout and keepalives, no session timeouts (a reader streams rows
#: through a server-side cursor while it prints them, possibly into a pager; a migration may run for minutes)
CONNECTION_BOUNDS = SessionBounds()
#: a worker's connections (its tasks, heartbeats and sweeps, ``workers.celery_tasks.database``): each of its
#: transactions is a few statements of milliseconds that never waits on anything but the database, so 30 s idle
#: inside one means its host is gone, and no statement of a claim, turn, finish, grade or sweep comes near 60 s
WORKER_BOUNDS = replace(CONNECTION_BOUNDS, idle_in_transaction_s=30.0, statement_timeout_s=60.0)
