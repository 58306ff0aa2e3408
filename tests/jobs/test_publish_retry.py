"""``jobs.queue.send``, every publish of ours: a broker outage is ridden out for the retry policy's window, also when
kombu gives up at once because the process's connection was not open yet (issue 48); then the error is raised.
The clock and the sleeps are the test's own (no broker: ``tests/workers/test_broker_outage_sends.py`` has Redis)."""

from __future__ import annotations

import pytest
from kombu.exceptions import OperationalError

from jobs.queue import GRADE_TASK, PUBLISH_RETRY_POLICY, publish_window_s, send


class Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.now += s


class Transport:
    """What ``send`` asks the app's connection: the errors that mean "the broker cannot be reached"."""

    connection_errors = (ConnectionRefusedError,)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass


def kombu_error(cause: Exception) -> OperationalError:
    """kombu's library error, raised from the transport's own (``Connection._reraise_as_library_errors``)."""
    try:
        raise OperationalError(str(cause)) from cause
    except OperationalError as exc:
        return exc


class FlakyBroker:
    """Test double for the Celery app's send side: kombu's error for the first ``down`` sends, each taking
    ``cost_s`` of the clock (kombu's own 4 s connect attempts), then a result."""

    def __init__(self, clock: Clock, down: int, cost_s: float = 4.0, cause: Exception | None = None) -> None:
        self.clock, self.down, self.cost_s, self.tries = clock, down, cost_s, 0
        self.cause = cause or ConnectionRefusedError(111, "Connection refused")

    def connection_for_write(self) -> Transport:
        return Transport()

    def send_task(self, name, args, retry):
        assert retry is True  # kombu's own retries still cover a connection that breaks mid-publish
        self.tries += 1
        self.clock.now += self.cost_s
        if self.tries <= self.down:
            raise kombu_error(self.cause)
        return ("sent", name, args)


def test_the_window_is_the_policy_s_waits():
    assert PUBLISH_RETRY_POLICY["max_retries"] == 60
    assert publish_window_s() == pytest.approx(0.5 + 1.0 + 1.5 + 57 * 2.0)  # 117 s


def test_a_send_refused_while_the_broker_restarts_goes_out_once_it_answers():
    clock = Clock()
    broker = FlakyBroker(clock, down=5)
    assert send(broker, GRADE_TASK, ("e1",), sleep=clock.sleep, clock=lambda: clock.now) == (
        "sent",
        GRADE_TASK,
        ("e1",),
    )
    assert broker.tries == 6 and clock.slept == [0.5, 1.0, 1.5, 2.0, 2.0]  # the policy's waits between tries


def test_a_broker_down_for_longer_than_the_window_raises_kombu_s_error_within_it():
    clock = Clock()
    broker = FlakyBroker(clock, down=10_000)
    with pytest.raises(OperationalError, match="Connection refused"):
        send(broker, GRADE_TASK, ("e1",), sleep=clock.sleep, clock=lambda: clock.now)
    assert publish_window_s() - 10 < clock.now <= publish_window_s() + 4.0  # the window, and one try past it at most
    assert broker.tries < PUBLISH_RETRY_POLICY["max_retries"]


def test_a_command_the_broker_refuses_and_other_errors_are_raised_at_once():
    refused = FlakyBroker(Clock(), down=1, cause=PermissionError("NOPERM no permissions to run the 'lpush' command"))
    with pytest.raises(OperationalError, match="NOPERM"):  # waiting would not change it: `submit` says so now
        send(refused, GRADE_TASK, ("e1",), sleep=lambda s: None)
    assert refused.tries == 1

    class Broken(FlakyBroker):
        def send_task(self, name, args, retry):
            self.tries += 1
            raise ConnectionError("not kombu's: a bug or a test double")

    broken = Broken(Clock(), down=1)
    with pytest.raises(ConnectionError):
        send(broken, GRADE_TASK, ("e1",), sleep=lambda s: None)
    assert broken.tries == 1
