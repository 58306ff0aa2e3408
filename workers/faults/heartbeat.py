"""A heartbeat thread: marks a held episode alive every few seconds, whatever the episode is doing.

Liveness must not depend on how long a turn takes (a 100K-token prefill, a slow test run): the thread beats
``db.claims.heartbeat`` every ``every_s`` seconds from the moment the episode is claimed until it is let go.
Another worker takes an episode over only when its beats stop for ``stale_after_s`` (``db.liveness``), that is
when the process died, hung hard, or lost the database for longer than that. When the claim is lost (the
episode was cancelled or taken over) the thread stops and says so in ``lost``; the run finds out at its next
write anyway.
"""

from __future__ import annotations

import logging
import threading

from db import Database
from db.claims import Claim, ClaimLost, heartbeat

log = logging.getLogger(__name__)


class Heartbeat:
    """``with Heartbeat(db, claim, every_s=15): ...`` beats while the block runs."""

    def __init__(self, db: Database, claim: Claim, *, every_s: float) -> None:
        self.db, self.claim, self.every_s = db, claim, every_s
        self.lost: str | None = None
        self.beats = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"heartbeat-{claim.episode_id}", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                with self.db.session() as s:
                    heartbeat(s, self.claim)
                self.beats += 1
            except ClaimLost as exc:
                self.lost = str(exc)
                return
            except Exception as exc:  # a database outage: keep trying; a long one lets another worker take over
                log.warning("heartbeat of episode %s failed: %s", self.claim.episode_id, exc)

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
