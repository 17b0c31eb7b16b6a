"""The background renewal of a :class:`~.lease.LeaseLock` (``auto_renew``).

:class:`Renewer` renews on a plain interval; :class:`ScheduledRenewer` (the one
``LeaseLock`` starts) on a cadence counted from the sends, with a watchdog;
:func:`safety_margin` is how long before its ttl a holder considers its lease over (the
lock's local deadline, which both the lock and the watchdog read). A renewer knows the
lock it renews only as a :class:`RenewedLease` (the lease module imports this one, never
the other way round)."""

from __future__ import annotations

import logging
import math
import random
import threading
import time
from typing import Protocol

from django.db import DatabaseError, connections

from django_taskclaim.db import is_lock_timeout, is_transient
from django_taskclaim.exceptions import LockUsageError
from django_taskclaim.locks.state import LeaseState

logger = logging.getLogger("django_taskclaim.locks")

#: Longest pause before a renewal that did not land (a lock wait timed out, the row was
#: busy, the connection failed) is tried again.
RENEW_RETRY_PAUSE = 0.05
#: Shortest auto-renewal interval (anything shorter is a busy loop on the database).
MIN_RENEW_EVERY = 0.01
#: Fewest renewal attempts per ttl (``auto_renew=True`` makes four): one that does not land
#: is tried again before the lease can end.
RENEWALS_PER_TTL = 3


def renew_interval(auto_renew: object, ttl: float) -> float | None:
    """Seconds between two renewals of a lease of ``ttl`` for a lock's ``auto_renew``:
    ``False``: none; ``True``: ``ttl / 4``; a number from :data:`MIN_RENEW_EVERY` to
    ``ttl /`` :data:`RENEWALS_PER_TTL`: that. Raise :class:`LockUsageError` otherwise."""
    longest = ttl / RENEWALS_PER_TTL
    if isinstance(auto_renew, bool):
        return ttl / 4 if auto_renew else None
    if (
        isinstance(auto_renew, int | float)
        and math.isfinite(auto_renew)
        and MIN_RENEW_EVERY <= auto_renew <= longest
    ):
        return float(auto_renew)
    raise LockUsageError(
        f"auto_renew is True/False or an interval from {MIN_RENEW_EVERY:g} s to "
        f"ttl/{RENEWALS_PER_TTL} = {longest:g} s, well below ttl={ttl:g} s "
        f"(a renewal that does not land must be retried in time), got {auto_renew!r}"
    )


class RenewedLease(Protocol):
    """What a renewer needs of the lock it renews (a :class:`~.lease.LeaseLock`): its
    key, database and ttl, what it knows of its lease, a renewal (plain, or with its
    row-lock wait bounded) and the marking of the lease as lost."""

    key: str
    using: str
    ttl: float

    @property
    def token(self) -> int | None: ...

    @property
    def state(self) -> LeaseState: ...

    @property
    def held(self) -> bool: ...

    @property
    def seconds_left(self) -> float: ...

    def renew(self, ttl: float | None = None) -> bool: ...

    def _renew(self, *, lock_wait: float | None, ttl: float | None = None) -> bool: ...

    def _mark_lost(self, why: str, *, token: int | None = None) -> None: ...


def safety_margin(ttl: float) -> float:
    """How long before ``ttl`` (counted from the *send* of the statement that took or
    renewed the lease) a holder considers its lease over: 10 % of the ttl, at most 1 s.

    The database wrote the lease's end after it received the statement, so the lease
    ends no earlier than send + ttl; the margin covers the rate difference of two
    clocks over one ttl, and the time to act on :attr:`LeaseLock.held`."""
    return min(1.0, ttl * 0.1)


class Renewer(threading.Thread):
    """Renews a lease every ``interval`` seconds on the thread's own connection.

    Never renews past the lease's local deadline; a statement that hangs (a black-holed
    network) does not keep :attr:`LeaseLock.held` true, and ``stop()`` does not wait for
    it beyond its timeout (the thread is a daemon)."""

    def __init__(self, lock: RenewedLease, interval: float) -> None:
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


class ScheduledRenewer(Renewer):
    """The ``auto_renew`` thread: renewals on a fixed cadence counted from the sends
    (every ``interval`` ≤ ttl / 3, so at least three attempts per ttl), each one's row-lock
    wait bounded below the time left (it never queues behind contenders until the lease
    ends), one that did not land tried again within :data:`RENEW_RETRY_PAUSE`; and a
    watchdog that marks the lease lost (``lost``, the cancel flag, ``check()``) the moment
    its local deadline passes without a renewal, even while a statement hangs."""

    def __init__(self, lock: RenewedLease, interval: float) -> None:
        super().__init__(lock, interval)
        self._watchdog = threading.Thread(
            target=self._watch, name=f"taskclaim-lease-watch-{lock.key}", daemon=True
        )

    def stop(self, timeout: float = 5.0) -> None:
        super().stop(timeout)
        if self._watchdog.is_alive() and self._watchdog is not threading.current_thread():
            self._watchdog.join(timeout)

    def _watch(self) -> None:
        lock = self.lock
        while True:
            state = lock.state
            if state.token is None or state.lost:
                return
            left = state.deadline - time.monotonic()
            if left <= 0:
                lock._mark_lost("no renewal landed before its deadline", token=state.token)
                return
            if self._stop_event.wait(left):
                return

    def run(self) -> None:
        lock = self.lock
        conn = connections[lock.using]
        self._watchdog.start()
        try:
            try:  # connect now: the first renewal must not pay for it
                conn.ensure_connection()
            except DatabaseError:
                conn.close()
            state = lock.state
            sent = state.deadline - lock.ttl + safety_margin(lock.ttl)
            next_at = sent + self.interval
            while not self._stop_event.wait(max(0.0, next_at - time.monotonic())):
                if not lock.held:
                    return
                started = time.monotonic()
                try:
                    ok = lock._renew(lock_wait=min(self.interval, lock.seconds_left / 2))
                except DatabaseError as exc:
                    busy = is_lock_timeout(exc, lock.using) or is_transient(exc, lock.using)
                    logger.log(
                        logging.DEBUG if busy else logging.WARNING,
                        "lease renewal did not land key=%s error=%s (held for %.2fs more at most)",
                        lock.key,
                        str(exc).strip().splitlines()[0] if str(exc).strip() else exc,
                        lock.seconds_left,
                    )
                    if not busy:
                        conn.close()
                    pause = min(self.interval, RENEW_RETRY_PAUSE) * random.uniform(0.5, 1.0)
                    next_at = time.monotonic() + pause
                    continue
                if not ok:
                    return
                next_at = started + self.interval
        finally:
            conn.close()
