"""Periodic reaping inside the worker (``--no-reap`` turns it off).

Once per ``TASKCLAIM_REAP_INTERVAL`` across all hosts (a lease lock on
:data:`REAP_LOCK_KEY`, left to lapse), one worker recovers the rows whose lease expired
(:func:`~django_taskclaim.recovery.reap.recover`). The lock only says who reaps and when
the next reap is due: its lease ends then. A worker that finds it held waits until it
ends (database clock) and tries again at once, so when the holder died whoever is alive
takes over on time: while any worker lives, an expired lease waits at most one interval
(plus :data:`TAKEOVER_JITTER` and a statement) for its reap. A worker makes its first
attempt soon after it starts (:data:`FIRST_REAP`), so a fleet whose workers keep dying
young still recovers. A worker that falls silent is never declared dead here: its rows
wait for their lease (NO EARLY RE-RUN). The same worker then prunes the rate-limit rings
of queues and keys that were idle for a whole window
(:func:`~django_taskclaim.flow.rate_prune.prune_idle_rings`).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable

from django.db import DatabaseError
from django.db.models import Model

from django_taskclaim.config.settings import taskclaim_settings
from django_taskclaim.db import DbNow
from django_taskclaim.flow.rate_prune import prune_idle_rings
from django_taskclaim.locks import LeaseLock
from django_taskclaim.recovery.reap import recover
from django_taskclaim.telemetry import instruments
from django_taskclaim.worker.dbconn import close
from django_taskclaim.worker.service import Service, one_line

logger = logging.getLogger("django_taskclaim.worker")

REAP_LOCK_KEY = "taskclaim:reap"

#: Seconds (low, high) after its start at which a worker first tries to reap: drawn
#: uniformly, so a fleet started at once does not meet at the reap lock together; never
#: later than the periodic draw would have been.
FIRST_REAP = (0.05, 0.5)
#: Seconds the reap lock is taken for while its holder reaps (at most the interval): once
#: the reap is done it is extended to the next due time. A holder that dies mid-reap
#: delays the next reap by this much, not by a whole interval; a reap that takes longer
#: may meet another worker's (harmless: every reap statement re-checks its rows).
REAP_HOLD = 2.0
#: Longest extra wait (seconds, drawn uniformly; at most a twentieth of the interval)
#: after the reap lock's lease ends: the workers waiting for it do not all try at once.
TAKEOVER_JITTER = 0.25


def first_wait(interval: float) -> float:
    """Seconds before a worker's first reap: soon after its start (:data:`FIRST_REAP`),
    or sooner when the reap interval is shorter."""
    return min(random.uniform(*FIRST_REAP), interval * random.uniform(0.8, 1.2))


def lease_left(key: str, using: str) -> float:
    """Seconds until the lease of the lease lock ``key`` ends, on the database clock (0
    when it has ended or the key has no row)."""
    from django_taskclaim.models import Lease  # deferred: models need the app registry

    row = (
        Lease.objects.using(using)
        .filter(key=key)
        .annotate(clock=DbNow())
        .values_list("locked_until", "clock")
        .first()
    )
    if row is None or row[0] is None:
        return 0.0
    return max(0.0, (row[0] - row[1]).total_seconds())


class Reaping(Service):
    """Reap every ``TASKCLAIM_REAP_INTERVAL`` while holding the reap lock, else as soon
    as its lease ends (the first attempt soon after start) until stopped; nothing while
    the worker is ``stopping``. A database error is logged once per outage and retried
    at the next interval, any other error logged with its traceback: the thread never
    dies of it."""

    def __init__(
        self,
        models: list[type[Model]],
        *,
        using: str,
        lock_db: str,
        worker_id: str,
        halt: threading.Event | None = None,
        stopping: threading.Event,
        on_requeued: Callable[[], None],
    ) -> None:
        super().__init__(
            "taskclaim-reaper", worker_id=worker_id, using=using, halt=halt, databases=(lock_db,)
        )
        self.models = models
        self.lock_db = lock_db
        self.stopping = stopping
        self.on_requeued = on_requeued

    def loop(self) -> None:
        wait = first_wait(float(taskclaim_settings.REAP_INTERVAL))
        while not self.wait(wait):
            interval = float(taskclaim_settings.REAP_INTERVAL)
            wait = interval * random.uniform(0.8, 1.2)  # after an error, or while stopping
            if self.stopping.is_set():
                continue
            try:
                wait = self.once(interval)
                self.recovered()
            except DatabaseError as exc:
                self.failed(exc, "periodic reap failed worker=%s error=%s", self.worker_id)
            except Exception as exc:
                logger.error(
                    "periodic reap failed worker=%s error=%s",
                    self.worker_id,
                    one_line(exc),
                    exc_info=exc,
                )

    def once(self, interval: float) -> float:
        """Reap unless another worker did within ``interval`` (the lock is not released:
        it is held for :data:`REAP_HOLD` while reaping, then extended to ``interval``
        after the reap began, and lapses then: one reap per interval across all hosts).
        Returns the seconds until this worker tries again: until that end after its
        reap, else until the lock's lease ends (at most ``interval``), plus a little
        jitter."""
        began = time.monotonic()
        hold = min(interval, REAP_HOLD)
        lock = LeaseLock(REAP_LOCK_KEY, hold, owner=self.worker_id, using=self.lock_db)
        if not lock.acquire():
            left = lease_left(REAP_LOCK_KEY, self.lock_db)
            logger.debug(
                "reap skipped worker=%s: another worker holds the reap lock for %.3fs",
                self.worker_id,
                left,
            )
            return min(left, interval) + random.uniform(0, min(TAKEOVER_JITTER, interval / 20))
        result = recover(self.models, using=self.using)
        if result.total and (telemetry := instruments()) is not None:
            telemetry.recovered(result.per_model)
        if result.requeued:
            self.on_requeued()
        # Under the same lock: the rate-limit rings of queues and keys idle for a window
        # (docs/rate-limits.md, "Idle rings"); a model without such a limit costs nothing.
        pruned = prune_idle_rings(self.models, using=self.using)
        if pruned:
            logger.info("pruned idle rate-limit rings worker=%s slots=%s", self.worker_id, pruned)
        # The lock now says when the next reap is due: one interval after this one began.
        due = interval - (time.monotonic() - began)
        if due > hold and (lock.seconds_left <= 0 or not lock.renew(due)):
            return min(lease_left(REAP_LOCK_KEY, self.lock_db), interval)
        return max(due, 0.0)


def reap_before_burst(models: list[type[Model]], *, using: str, worker_id: str) -> None:
    """``--burst``: recover expired leases once before draining, so rows of crashed
    workers are part of what a burst run drains (``--no-reap`` skips it)."""
    try:
        result = recover(models, using=using)
    except DatabaseError as exc:
        close(using)
        logger.warning("reap before burst failed worker=%s error=%s", worker_id, one_line(exc))
        return
    if result.total and (telemetry := instruments()) is not None:
        telemetry.recovered(result.per_model)
    if result.total:
        logger.info(
            "reaped before burst worker=%s requeued=%s failed=%s",
            worker_id,
            result.requeued,
            result.failed,
        )
