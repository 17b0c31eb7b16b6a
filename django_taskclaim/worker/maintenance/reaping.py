"""Periodic reaping inside the worker (``--no-reap`` turns it off).

At most once per ``TASKCLAIM_REAP_INTERVAL`` across all hosts (a lease lock on
:data:`REAP_LOCK_KEY`, left to lapse), one worker recovers the rows whose lease expired
(:func:`~django_taskclaim.recovery.reap.recover`). A worker makes its first attempt a few
seconds after it starts (:data:`FIRST_REAP`), not a whole interval later, so a fleet whose
workers keep dying young still recovers. A worker that falls silent is never declared
dead here: its rows wait for their lease (NO EARLY RE-RUN). The same worker then prunes
the rate-limit rings of queues and keys that were idle for a whole window
(:func:`~django_taskclaim.flow.rate_prune.prune_idle_rings`).
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable

from django.db import DatabaseError
from django.db.models import Model

from django_taskclaim.config.settings import taskclaim_settings
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
FIRST_REAP = (0.5, 3.0)


def first_wait(interval: float) -> float:
    """Seconds before a worker's first reap: soon after its start (:data:`FIRST_REAP`),
    or sooner when the reap interval is shorter."""
    return min(random.uniform(*FIRST_REAP), interval * random.uniform(0.8, 1.2))


class Reaping(Service):
    """Reap every ``TASKCLAIM_REAP_INTERVAL`` (jittered; the first soon after start)
    until stopped; nothing while the worker is ``stopping``. A database error is logged
    once per outage and retried at the next interval, any other error logged with its
    traceback: the thread never dies of it."""

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
        first = True
        while True:
            interval = float(taskclaim_settings.REAP_INTERVAL)
            wait = first_wait(interval) if first else interval * random.uniform(0.8, 1.2)
            first = False
            if self.wait(wait):
                break
            if self.stopping.is_set():
                continue
            try:
                self.once(interval)
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

    def once(self, interval: float) -> None:
        """Reap unless another worker did within ``interval`` (the lock is not released:
        it lapses after ``interval``, so one reap per interval runs across all hosts)."""
        lock = LeaseLock(REAP_LOCK_KEY, interval, owner=self.worker_id, using=self.lock_db)
        if not lock.acquire():
            logger.debug(
                "reap skipped worker=%s: another worker holds the reap lock", self.worker_id
            )
            return
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
