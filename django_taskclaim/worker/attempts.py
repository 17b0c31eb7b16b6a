"""The worker's journal of attempts: each attempt's story (worker, start, runtime, outcome,
error) for the ``taskclaim.TaskAttempt`` table that a task's admin page shows.

The executors note an attempt when its outcome is known (:meth:`AttemptJournal.note`; a
completion written later in a batch, when its batch lands: :meth:`AttemptJournal.written`).
``TASKCLAIM_ATTEMPT_LOG`` says which: ``"errors"`` (the default) those that did not end
``done``, ``"all"`` every one, ``"off"`` none (then noting costs one comparison). Nothing is
written per task: :meth:`AttemptJournal.flush` (called with the per-minute history, about
every 10 s, and at shutdown) inserts what was noted in one statement, then deletes, in one
more, the attempts of those rows beyond the last ``TASKCLAIM_ATTEMPTS_KEPT``; hourly, the
attempts older than 7 days. A start is filed by the database clock (the flush's reading less
the seconds elapsed since, on the worker's monotonic clock): a skewed worker clock shifts
nothing.

What it does not promise: it is a journal for people, not a ledger. A worker that dies
(SIGKILL) loses what it noted since its last flush, and the attempt it died in is never
noted (the row's ``last_error`` names the worker it was reaped from); a flush that fails is
retried at the next one, at most :data:`MAX_PENDING` attempts kept meanwhile.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import DatabaseError, router
from django.db.models import Q

from django_taskclaim.config.settings import taskclaim_settings
from django_taskclaim.db import db_now
from django_taskclaim.settle.writes import format_error
from django_taskclaim.worker.service import one_line

logger = logging.getLogger("django_taskclaim.worker")

#: Days an attempt is kept at most (as the per-minute history).
KEEP_DAYS = 7
#: Seconds between two deletions of old attempts by one worker.
PRUNE_EVERY = 3600.0
#: Attempts kept in memory at most while the database cannot be written (oldest dropped).
MAX_PENDING = 10_000
#: Characters of an error kept per attempt (the row's ``last_error`` keeps the last one).
ERROR_CHARS = 2_000

#: What the journal calls each outcome of ``settle()``.
_OUTCOMES = {
    "done": "done",
    "ready": "retried",
    "failed": "failed",
    "cancelled": "cancelled",
    "lost": "lost",
    "error": "not recorded",
    "abandoned": "not recorded",
    "unknown": "unknown",
}


@dataclass
class Noted:
    """One attempt, as noted: which row, which attempt, its monotonic start and end."""

    label: str
    pk: str
    number: int
    started: float
    ended: float
    outcome: str
    error: str


def _mode() -> str:
    mode = taskclaim_settings.ATTEMPT_LOG
    return mode if mode in ("off", "errors", "all") else "errors"  # E009 says why


class AttemptJournal:
    """The attempts one worker process noted and has not written yet; safe from any
    thread. Owned by the worker's :class:`~.history.History`."""

    def __init__(self, worker_id: str = "") -> None:
        self.worker_id = worker_id
        self.mode = _mode()
        self._lock = threading.Lock()
        self._noted: list[Noted] = []
        self._deferred: dict[int, Noted] = {}  # id(task) -> a completion not written yet
        self._pruned_at: float | None = None
        self._failing = False

    def note(self, task: Any, outcome: str, error: BaseException | None, started: float) -> None:
        """The attempt of ``task`` that started at ``started`` (monotonic) ended with
        ``outcome`` (a ``settle()`` outcome; ``"deferred"``: its completion is written
        later, see :meth:`written`)."""
        if self.mode == "off" or (self.mode == "errors" and outcome in ("done", "deferred")):
            return
        entry = Noted(
            label=task._meta.label,
            pk=str(task.pk),
            number=int(getattr(task, "attempts", 0) or 0),
            started=started,
            ended=time.monotonic(),
            outcome=_OUTCOMES.get(str(outcome), str(outcome)[:16]),
            error=format_error(error)[:ERROR_CHARS] if error is not None else "",
        )
        with self._lock:
            if outcome == "deferred":
                entry.outcome = "done"
                if len(self._deferred) >= MAX_PENDING:  # batches that never landed
                    self._deferred.clear()
                self._deferred[id(task)] = entry
            else:
                self._noted.append(entry)

    def written(self, tasks: list[Any], lost: list[Any] | None) -> None:
        """A batch of deferred completions was written (``lost``: those its fence
        refused; ``None``: nothing was written, they are retried or given back)."""
        if not self._deferred:
            return
        refused = {id(t) for t in lost or ()}
        with self._lock:
            for task in tasks:
                entry = self._deferred.pop(id(task), None)
                if entry is None or lost is None:
                    continue
                if id(task) in refused:
                    entry.outcome = "lost"
                self._noted.append(entry)

    def pending(self) -> int:
        with self._lock:
            return len(self._noted)

    def flush(self, using: str) -> int:
        """Write what was noted (one INSERT, then one DELETE of the attempts beyond the
        last ``TASKCLAIM_ATTEMPTS_KEPT`` of those rows; hourly one DELETE of those older
        than :data:`KEEP_DAYS`); return how many were written. Never raises: a failure is
        logged (a warning the first time in a row) and what was noted is kept."""
        from django_taskclaim.models import TaskAttempt  # the app registry first

        with self._lock:
            noted, self._noted = self._noted, []
        if not noted and self.mode == "off":
            return 0
        db = router.db_for_write(TaskAttempt) or using
        try:
            if noted:
                now, mono = db_now(db), time.monotonic()
                TaskAttempt.objects.using(db).bulk_create(
                    [self._row(TaskAttempt, n, now, mono) for n in noted]
                )
                self._bound(TaskAttempt, noted, db)
            if self._pruned_at is None or time.monotonic() - self._pruned_at >= PRUNE_EVERY:
                self._pruned_at = time.monotonic()
                cutoff = db_now(db) - timedelta(days=KEEP_DAYS)
                TaskAttempt.objects.using(db).filter(started_at__lt=cutoff).delete()
        except DatabaseError as exc:
            with self._lock:
                self._noted = (noted + self._noted)[-MAX_PENDING:]
            log = logger.debug if self._failing else logger.warning
            self._failing = True
            log("attempts not written (kept for the next heartbeat) error=%s", one_line(exc))
            return 0
        self._failing = False
        return len(noted)

    def _row(self, model: Any, n: Noted, now: datetime, mono: float) -> Any:
        return model(
            model=n.label[:100],
            row=n.pk[:191],
            number=n.number,
            worker=self.worker_id[:255],
            started_at=now - timedelta(seconds=max(0.0, mono - n.started)),
            runtime=round(max(0.0, n.ended - n.started), 6),
            outcome=n.outcome,
            error=n.error,
        )

    @staticmethod
    def _bound(model: Any, noted: list[Noted], db: str) -> None:
        """Delete the attempts of the rows just written beyond their last ``KEPT``."""
        kept = taskclaim_settings.ATTEMPTS_KEPT
        newest: dict[tuple[str, str], int] = {}
        for n in noted:
            key = (n.label[:100], n.pk[:191])
            newest[key] = max(newest.get(key, 0), n.number)
        old = Q()
        for (label, pk), number in newest.items():
            if number > kept:
                old |= Q(model=label, row=pk, number__lte=number - kept)
        if old:
            model.objects.using(db).filter(old).delete()
