"""The worker's per-minute history: attempts that ended ``done`` or ``failed``, counted in
memory and added to the ``taskclaim.TaskHistory`` table (what the admin's charts read)
with one upsert per heartbeat, never one write per task.

The executors count an outcome once it is written (:meth:`History.count`; a deferred
completion once its batch lands, :meth:`History.count_written`), keyed by model, queue
and the second of the process's monotonic clock. :meth:`History.flush` (the heartbeat,
about every 10 s, and the worker's shutdown) reads the database clock once and files
each second under the database minute it fell in (that clock minus the seconds elapsed
since, so a skewed worker clock shifts nothing; a count near a minute's edge may land
in the neighbouring minute), then adds the minutes in one statement
(:meth:`~django_taskclaim.backends.history.HistorySQL.add`). Once an hour it also deletes
the rows older than
:data:`~django_taskclaim.backends.history.KEEP_DAYS` (7).

What it does not promise: a worker that dies (SIGKILL, power loss) loses the counts of
its last heartbeat interval; a flush that fails is retried at the next one with its
counts kept (a flush whose commit is lost with the connection may then count twice);
a flush one of whose rows the database refuses for what it holds (``DataError``,
``IntegrityError``) writes each model and queue on its own and drops only the refused
ones, with a warning (one row's fault is one row's); a queue name longer than the
table's column is stored cut, ending with a digest of the whole
(:func:`~django_taskclaim.backends.history.stored_queue`);
rows finished outside a worker (admin actions, user code calling ``complete()``) are
not counted. The charts are a picture of the workers' throughput, not a ledger.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import DatabaseError, DataError, IntegrityError, connections

from django_taskclaim.backends.history import KEEP_DAYS, HistoryRow, history_sql, stored_queue
from django_taskclaim.db import db_now, retry_transient
from django_taskclaim.worker.attempts import AttemptJournal
from django_taskclaim.worker.service import one_line

logger = logging.getLogger("django_taskclaim.worker")

#: Seconds between two deletions of old rows by one worker.
PRUNE_EVERY = 3600.0
#: Counts kept in memory at most (distinct model, queue and second) while the database
#: cannot be written: beyond, the oldest are dropped (and that is logged).
MAX_KEYS = 100_000

_KINDS = {"done": 0, "failed": 1}


def _queue(task: Any) -> str:
    """The queue of ``task``: its loaded ``queue_name``, else ``""`` (never a query)."""
    value = task.__dict__.get("queue_name")
    return "" if value is None else str(value)


class History:
    """Counts of finished attempts per (model label, queue, monotonic second); safe to
    use from any thread. Owned by the worker's :class:`~.ledger.Ledger`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: Each attempt's story, written with the counts (:mod:`.attempts`).
        self.attempts = AttemptJournal()
        self._counts: dict[tuple[str, str, int], list[int]] = {}
        self._flushing = threading.Lock()
        self._pruned_at: float | None = None
        self._failing = False

    def _add(self, label: str, queue: str, kind: int, n: int = 1) -> None:
        key = (label, queue, int(time.monotonic()))
        with self._lock:
            cell = self._counts.get(key)
            if cell is None:
                cell = self._counts[key] = [0, 0]
            cell[kind] += n

    def count(self, task: Any, outcome: Any) -> None:
        """An attempt of ``task`` ended with ``outcome`` (an ``Outcome``): count it if
        that is ``done`` or ``failed``; anything else (retry, lost, deferred…) is not a
        finished attempt and is ignored."""
        kind = _KINDS.get(outcome)  # an Outcome is a str: found by its value
        if kind is not None:
            self._add(task._meta.label, _queue(task), kind)

    def count_written(self, tasks: list[Any], lost: list[Any] | None) -> None:
        """A batch of deferred completions was written: count ``tasks`` but ``lost``
        (``None``: nothing was written) as done."""
        self.attempts.written(tasks, lost)
        if lost is None:
            return
        not_written = {id(t) for t in lost}
        per_queue: dict[tuple[str, str], int] = {}
        for task in tasks:
            if id(task) not in not_written:
                key = (task._meta.label, _queue(task))
                per_queue[key] = per_queue.get(key, 0) + 1
        for (label, queue), n in per_queue.items():  # one lock per queue, not per task
            self._add(label, queue, 0, n)

    def pending(self) -> int:
        """Attempts counted and not written yet."""
        with self._lock:
            return sum(d + f for d, f in self._counts.values())

    def _take(self) -> dict[tuple[str, str, int], list[int]]:
        with self._lock:
            counts, self._counts = self._counts, {}
            return counts

    def _put_back(self, counts: dict[tuple[str, str, int], list[int]]) -> None:
        with self._lock:
            for key, (done, failed) in counts.items():
                cell = self._counts.setdefault(key, [0, 0])
                cell[0] += done
                cell[1] += failed
            excess = len(self._counts) - MAX_KEYS
            if excess > 0:
                for key in sorted(self._counts, key=lambda k: k[2])[:excess]:
                    del self._counts[key]
                logger.warning("history counts dropped seconds=%s (database unreachable)", excess)

    def rows(
        self, counts: dict[tuple[str, str, int], list[int]], now: datetime
    ) -> list[HistoryRow]:
        """``counts`` filed under the database minute each second fell in, ``now`` being
        the database clock read at the monotonic time of this call."""
        mono = time.monotonic()
        minutes: dict[tuple[str, str, datetime], list[int]] = {}
        for (label, queue, second), (done, failed) in counts.items():
            when = now - timedelta(seconds=max(0.0, mono - second - 0.5))
            if when.tzinfo is not None:
                when = when.astimezone(UTC)
            key = (label, stored_queue(queue), when.replace(second=0, microsecond=0))
            cell = minutes.setdefault(key, [0, 0])
            cell[0] += done
            cell[1] += failed
        return [(m, q, minute, d, f) for (m, q, minute), (d, f) in minutes.items() if d or f]

    @staticmethod
    def write(rows: list[HistoryRow], using: str) -> None:
        """Add ``rows`` (distinct keys) to the history table in one upsert, in autocommit;
        a deadlock or serialization failure is retried (bounded), anything else raised.
        Counts are added to the rows there, so concurrent writers lose nothing."""
        sql = history_sql(connections[using])
        if sql is None or not rows:
            return

        def add() -> None:
            with connections[using].cursor() as cursor:
                sql.add(cursor, rows)

        retry_transient(add, using, what="history")

    def _write_each(
        self, rows: list[HistoryRow], counts: dict[tuple[str, str, int], list[int]], using: str
    ) -> tuple[int, dict[tuple[str, str, int], list[int]]]:
        """``rows`` written one upsert per (model, queue), after their one upsert was
        refused. A group refused for its data (``DataError``, ``IntegrityError``) is
        dropped with a warning naming it; any other error is raised with the ``counts``
        not written yet attached (``exc.history_counts``) for the caller to keep. Returns
        the attempts written and the counts left (none)."""
        groups: dict[tuple[str, str], list[HistoryRow]] = {}
        for row in rows:
            groups.setdefault((row[0], row[1]), []).append(row)
        written = 0
        settled: set[tuple[str, str]] = set()
        try:
            for (label, queue), part in groups.items():
                try:
                    self.write(part, using)
                except (DataError, IntegrityError) as exc:
                    logger.warning(
                        "history counts dropped model=%s queue=%r attempts=%s error=%s",
                        label[:100],
                        queue[:100],
                        sum(r[3] + r[4] for r in part),
                        one_line(exc),
                    )
                else:
                    written += sum(r[3] + r[4] for r in part)
                settled.add((label, queue))
        except DatabaseError as exc:
            exc.history_counts = {  # type: ignore[attr-defined]
                k: v for k, v in counts.items() if (k[0], stored_queue(k[1])) not in settled
            }
            raise
        return written, {}

    def flush(self, using: str) -> int:
        """Write the attempts noted (:meth:`.AttemptJournal.flush`), then add the counts to
        the history table (one read of the database clock, one upsert; hourly, one delete
        of the rows older than ``KEEP_DAYS``); return the attempts counted. Never raises:
        a failure is logged (a warning the first time in a row, then debug) and its counts
        are kept for the next flush."""
        with self._flushing:  # the heartbeat and the shutdown never write the same counts
            self.attempts.flush(using)  # never raises
            counts = self._take()
            written = 0
            try:
                sql = history_sql(connections[using])
                if sql is None:
                    return 0
                if counts:
                    rows = self.rows(counts, db_now(using))
                    try:
                        self.write(rows, using)
                        written = sum(r[3] + r[4] for r in rows)
                        counts = {}
                    except (DataError, IntegrityError):
                        # Some row of the upsert was refused for what it holds: write
                        # each model and queue on its own, so that only the counts at
                        # fault are lost, never those of every model this worker serves.
                        written, counts = self._write_each(rows, counts, using)
                now = time.monotonic()
                if self._pruned_at is None or now - self._pruned_at >= PRUNE_EVERY:
                    self._pruned_at = now
                    with connections[using].cursor() as cursor:
                        sql.prune(cursor, KEEP_DAYS)
            except DatabaseError as exc:
                self._put_back(getattr(exc, "history_counts", counts))
                log = logger.debug if self._failing else logger.warning
                self._failing = True
                log("history not written (kept for the next heartbeat) error=%s", one_line(exc))
                return 0
            self._failing = False
            return written
