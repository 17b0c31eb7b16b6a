"""The periodic scheduler inside the worker (``--no-scheduler`` turns it off).

Every worker process runs one (none in ``--burst``): it wakes at the next slot of the
schedules registered in the process (``@periodic``, found by
:func:`~django_taskclaim.periodic.discover`), reads the database clock and enqueues
what is due (:class:`~django_taskclaim.periodic.slots.Planner`). However many run, a
slot is enqueued once (the insert-as-lock); as long as one runs, none is lost. The
enqueued work runs as an ordinary claimed task.
"""

from __future__ import annotations

import logging
import random
import threading

from django.db import DatabaseError
from django.db.models import Model

from django_taskclaim.db import db_now
from django_taskclaim.periodic import discover, schedules
from django_taskclaim.worker.service import Service, one_line

logger = logging.getLogger("django_taskclaim.worker")

#: Longest sleep between two looks at the database clock, in seconds.
MAX_SLEEP = 5.0
#: Shortest sleep, and the spread added after a slot's instant so that the schedulers of
#: many workers do not all insert the same slot in the same millisecond.
MIN_SLEEP = 0.01
JITTER = 0.1


class Scheduler(Service):
    """Enqueue the due slots of this process's schedules until ``halt`` or ``stopping``."""

    def __init__(
        self,
        *,
        using: str,
        worker_id: str,
        halt: threading.Event | None = None,
        stopping: threading.Event,
        served: list[type[Model]],
    ) -> None:
        super().__init__("taskclaim-scheduler", worker_id=worker_id, using=using, halt=halt)
        from django_taskclaim.periodic.slots import (
            Planner,  # deferred: models need the app registry
        )

        discover()
        self.schedules = schedules()
        self.planner = Planner(self.schedules, using=using, by=worker_id)
        self.stopping = stopping
        self.served = {m._meta.label for m in served}

    def loop(self) -> None:
        """Tick until stopped; a database outage is logged once and retried with
        backoff, any other error logged with its traceback: the thread never dies of it."""
        if not self.schedules:
            return
        logger.info(
            "scheduler started worker=%s schedules=%s",
            self.worker_id,
            ",".join(s.name for s in self.schedules),
        )
        unserved = {s.target_label for s in self.schedules} - self.served
        if unserved:
            logger.info(
                "scheduler enqueues rows this worker does not run worker=%s models=%s: "
                "run a worker for them too",
                self.worker_id,
                ",".join(sorted(unserved)),
            )
        while not self.stopped and not self.stopping.is_set():
            try:
                delay = self.once()
                self.recovered("scheduler reconnected worker=%s", self.worker_id)
            except DatabaseError as exc:
                self.failed(exc, "scheduler failed worker=%s error=%s", self.worker_id)
                if self.wait_to_retry(self.retry_delay()):
                    break
                continue
            except Exception as exc:
                logger.error(
                    "scheduler failed worker=%s error=%s",
                    self.worker_id,
                    one_line(exc),
                    exc_info=exc,
                )
                delay = MAX_SLEEP
            if self.wait(delay):
                break

    def once(self) -> float:
        """Enqueue what is due now (database clock); return seconds until the next
        slot (plus jitter), at most :data:`MAX_SLEEP`."""
        now = db_now(self.using)
        self.planner.tick(now)
        following = self.planner.next_due(now)
        if following is None:
            return MAX_SLEEP
        wait = (following - now).total_seconds() + random.uniform(0, JITTER)
        return min(MAX_SLEEP, max(MIN_SLEEP, wait))
