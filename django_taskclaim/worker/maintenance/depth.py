"""Queue depth samples, taken by the heartbeat thread (:mod:`.heartbeat`) between beats.

Rows do not remember when they were ready, so the admin's "queue depth" chart draws
samples: every ``TASKCLAIM_DEPTH_SAMPLE_INTERVAL`` seconds (``None``: never) each worker
process tries, per model it serves, the lease lock ``taskclaim:depth:<label>`` (one
statement, held for most of the interval and left to lapse). The one that wins counts
that model's ``ready`` and ``processing`` rows and stores them under the current minute
of the database clock, in one statement (:meth:`~django_taskclaim.backends.depth.DepthSQL.sample`:
at most one sample per model and minute, whoever writes it). So a fleet takes about one
sample per model per interval, whatever its size; a process that wins also deletes, at
most hourly, the model's samples older than :data:`KEEP_HOURS`. Nothing here runs on the
claim or completion path, and a failure is logged and never stops the heartbeat.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import Any

from django.db import DatabaseError, connections
from django.db.models import Model

from django_taskclaim.backends.depth import SampledTable, depth_sql
from django_taskclaim.config.options import get_options
from django_taskclaim.config.settings import taskclaim_settings
from django_taskclaim.exceptions import LockUsageError
from django_taskclaim.locks import LeaseLock
from django_taskclaim.worker.service import one_line

logger = logging.getLogger("django_taskclaim.worker")

__all__ = ["KEEP_HOURS", "LOCK_PREFIX", "DepthSampler", "depth_sampler"]

#: Hours of samples kept (the chart shows the last 24).
KEEP_HOURS = 48.0
#: Seconds between two prunes of one model's samples by one process.
PRUNE_EVERY = 3600.0
#: The lease lock of a model's samples: this prefix and the model's label.
LOCK_PREFIX = "taskclaim:depth:"
#: The share of the interval a won sample lock is held: the next try of some worker after
#: it lapses wins, so a fleet samples about once per interval.
HOLD_SHARE = 0.9


class DepthSampler:
    """Takes the depth samples of ``models`` on database ``using`` for one worker
    process: :meth:`tick` between heartbeats. Not a thread."""

    def __init__(self, models: Iterable[type[Model]], *, using: str, worker_id: str) -> None:
        self.models = sorted(models, key=lambda m: m._meta.label)
        self.using = using
        self.worker_id = worker_id
        self._next = 0.0  # monotonic time of the next try: the first tick tries
        self._pruned: dict[str, float] = {}
        self._failing = False

    def tick(self) -> int:
        """Try each model's sample lock if the interval is up, and take the samples won;
        return how many were taken. Never raises: a failure is logged (a warning the first
        time in a row) and the next try is an interval later."""
        interval = taskclaim_settings.DEPTH_SAMPLE_INTERVAL
        now = time.monotonic()
        if not interval or now < self._next:
            return 0
        self._next = now + interval
        taken = 0
        try:
            sql = depth_sql(connections[self.using])
            if sql is None:
                return 0
            for model in self.models:
                if self._won(model, interval):
                    self._sample(sql, model)
                    taken += 1
        except (DatabaseError, LockUsageError) as exc:
            log = logger.debug if self._failing else logger.warning
            self._failing = True
            log("queue depth not sampled worker=%s error=%s", self.worker_id, one_line(exc))
            return taken
        self._failing = False
        return taken

    def _won(self, model: type[Model], interval: float) -> bool:
        """Whether this process takes ``model``'s sample now: it won its lease lock."""
        lock = LeaseLock(
            LOCK_PREFIX + model._meta.label,
            ttl=interval * HOLD_SHARE,
            owner=self.worker_id[:255],
            using=self.using,
        )
        return lock.acquire()

    def _sample(self, sql: Any, model: type[Model]) -> None:
        opts = get_options(model)
        conn = connections[self.using]
        qn = conn.ops.quote_name
        of = SampledTable(
            label=opts.label,
            table=qn(model._meta.db_table),
            status=qn(opts.status_column),
            ready=opts.value("ready"),
            processing=opts.value("processing"),
        )
        with conn.cursor() as cursor:
            sql.sample(cursor, of)
            now = time.monotonic()
            last = self._pruned.get(opts.label)
            if last is None or now - last >= PRUNE_EVERY:
                self._pruned[opts.label] = now
                sql.prune(cursor, opts.label, KEEP_HOURS)


def depth_sampler(
    models: Iterable[type[Model]], *, using: str, worker_id: str
) -> DepthSampler | None:
    """The sampler of a worker process serving ``models`` on ``using``; ``None`` when it
    serves none. The interval is read live on every tick (``None`` there: no sample)."""
    chosen = list(models)
    if not chosen:
        return None
    return DepthSampler(chosen, using=using, worker_id=worker_id)
