"""The background renewal of a :class:`~.lease.LeaseLock` (``auto_renew``)."""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from django.db import DatabaseError, connections

if TYPE_CHECKING:
    from django_taskclaim.locks.lease import LeaseLock

logger = logging.getLogger("django_taskclaim.locks")


class Renewer(threading.Thread):
    """Renews a lease every ``interval`` seconds on the thread's own connection.

    Never renews past the lease's local deadline; a statement that hangs (a black-holed
    network) does not keep :attr:`LeaseLock.held` true, and ``stop()`` does not wait for
    it beyond its timeout (the thread is a daemon)."""

    def __init__(self, lock: LeaseLock, interval: float) -> None:
        super().__init__(name=f"taskclaim-lease-{lock.key}", daemon=True)
        self.lock = lock
        self.interval = interval
        self._stop_event = threading.Event()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop_event.set()
        if self is not threading.current_thread():
            self.join(timeout)

    def run(self) -> None:
        lock = self.lock
        try:
            while not self._stop_event.wait(self.interval):
                if not lock.held:
                    if lock.token is not None and not lock.state.lost:
                        lock._mark_lost("its deadline passed: the database did not answer in time")
                    return
                try:
                    ok = lock.renew()
                except DatabaseError as exc:
                    logger.warning(
                        "lease renewal failed key=%s error=%s (held for %.1fs more at most)",
                        lock.key,
                        str(exc).strip().splitlines()[0] if str(exc).strip() else exc,
                        lock.seconds_left,
                    )
                    connections[lock.using].close()
                    continue
                if not ok:
                    return
        finally:
            connections[lock.using].close()
