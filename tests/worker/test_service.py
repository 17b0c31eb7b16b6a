"""The one base of the worker's background threads: its stop, its waits, its outage loop."""

from __future__ import annotations

import logging
import threading
import time

from django.db import OperationalError

from django_taskclaim.worker.service import Service, one_line


class Failing(Service):
    """Fails ``times`` times with a database error, then succeeds until stopped."""

    def __init__(self, times: int) -> None:
        super().__init__("taskclaim-test", worker_id="w1", using="default")
        self.times = times
        self.tries = 0
        self.succeeded = threading.Event()

    def loop(self) -> None:
        while not self.stopped:
            self.tries += 1
            if self.tries <= self.times:
                self.failed(
                    OperationalError(f"down {self.tries}\nmore"), "test failed w=%s e=%s", "w1"
                )
                self.wait(0.001)
                continue
            self.recovered("test resumed w=%s", "w1")
            self.succeeded.set()
            self.wait(3600)

    def close_connections(self) -> None:
        pass


def test_one_line_keeps_the_type_and_the_first_line():
    assert one_line(OperationalError("first\nsecond")) == "OperationalError: first"
    assert one_line(ValueError()) == "ValueError:"


def test_a_run_of_failures_warns_once_then_logs_at_debug_and_its_end_once(caplog):
    service = Failing(times=3)
    with caplog.at_level(logging.DEBUG, logger="django_taskclaim.worker"):
        service.start()
        assert service.succeeded.wait(10)
        service.stop()
        service.join(5)
    lines = [(r.levelno, r.getMessage()) for r in caplog.records if "test " in r.getMessage()]
    assert lines == [
        (logging.WARNING, "test failed w=w1 e=OperationalError: down 1"),
        (logging.DEBUG, "test failed w=w1 e=OperationalError: down 2"),
        (logging.DEBUG, "test failed w=w1 e=OperationalError: down 3"),
        (logging.INFO, "test resumed w=w1"),
    ]
    assert service.outage.failures == 0


def test_stop_ends_every_wait_at_once():
    service = Failing(times=0)
    service.start()
    assert service.succeeded.wait(10)
    started = time.monotonic()
    service.stop()
    service.join(5)
    assert not service.is_alive()
    assert time.monotonic() - started < 5
    assert service.wait_to_retry(3600)  # stopped: no wait at all
