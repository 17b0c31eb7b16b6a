"""The worker's journal of attempts: each attempt's story (worker, start, runtime, outcome,
error) for the ``taskclaim.TaskAttempt`` table that a task's admin page shows.

The executors note an attempt when its outcome is known (:meth:`AttemptJournal.note`). A
completion written later in a batch is noted before it is buffered
(:meth:`AttemptJournal.deferring`) and its outcome known when its batch lands
(:meth:`AttemptJournal.written`): done, or lost — the fence refused it, the claim was taken
back (its lease lapsed) and the row runs again — or not recorded (the worker stopped with
the database away): so in ``"errors"`` mode too every completion is followed to its batch,
since one that did not land explains the row's next run.
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
        #: id(task) -> (task, its attempt's start and end, monotonic): a completion
        #: buffered, not written yet (the task is kept, so that its id is not reused
        #: meanwhile). The entry itself is made only if the attempt is to be recorded.
        self._deferred: dict[int, tuple[Any, float, float]] = {}
        self._pruned_at: float | None = None
        self._failing = False

    def _entry(
        self,
        task: Any,
        outcome: str,
        error: BaseException | None,
        started: float,
        ended: float | None = None,
    ) -> Noted:
        return Noted(
            label=task._meta.label,
            pk=str(task.pk),
            number=int(getattr(task, "attempts", 0) or 0),
            started=started,
            ended=time.monotonic() if ended is None else ended,
            outcome=_OUTCOMES.get(str(outcome), str(outcome)[:16]),
            error=format_error(error)[:ERROR_CHARS] if error is not None else "",
        )

    def note(self, task: Any, outcome: str, error: BaseException | None, started: float) -> None:
        """The attempt of ``task`` that started at ``started`` (monotonic) ended with
        ``outcome`` (a ``settle()`` outcome). ``"deferred"`` notes nothing: a completion
        written later is noted by :meth:`deferring`, before it is buffered."""
        if self.mode == "off" or outcome == "deferred":
            return
        if self.mode == "errors" and outcome == "done":
            return
        entry = self._entry(task, outcome, error, started)
        with self._lock:
            self._noted.append(entry)

    def deferring(self, task: Any, started: float) -> None:
        """The body of ``task`` (started at ``started``, monotonic) returned and its
        completion is about to be buffered, to be written in a batch: its outcome is
        known when the batch lands (:meth:`written`). Called before the completion is
        buffered, since its batch may land before the executor goes on. In ``"errors"``
        mode too: a completion that does not land is an attempt that did not end done."""
        if self.mode == "off":
            return
        ended = time.monotonic()  # the rest only if it is recorded (a hot path: per job)
        with self._lock:
            if len(self._deferred) >= MAX_PENDING:  # batches that never landed
                self._deferred.clear()
            self._deferred[id(task)] = (task, started, ended)

    def written(self, tasks: list[Any], lost: list[Any] | None) -> None:
        """A batch of deferred completions was written (``lost``: those its fence
        refused, noted ``lost``; ``None``: nothing was written, the worker stopped with
        the database away: noted ``not recorded``, their rows run again after their
        leases)."""
        if not self._deferred:
            return
        refused = {id(t) for t in lost or ()}
        with self._lock:
            for task in tasks:
                found = self._deferred.pop(id(task), None)
                if found is None or found[0] is not task:
                    continue
                if lost is None:
                    outcome = "error"  # not recorded
                elif id(task) in refused:
                    outcome = "lost"
                elif self.mode == "errors":
                    continue  # done: recorded only in "all" mode
                else:
                    outcome = "done"
                self._noted.append(self._entry(task, outcome, None, found[1], found[2]))

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
