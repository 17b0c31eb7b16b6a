"""Batched acknowledgements: completions buffered in the ledger, written together.

A task whose body returned no result fields (or a
:class:`~django_taskclaim.settle.outcome.BatchableResult`) is not completed at once: its
completion waits in the :class:`~.ledger.Ledger` for up to ``--ack-window`` seconds
and is written with the others in one fenced UPDATE
(:func:`~django_taskclaim.settle.outcome.complete_many`) by the thread that finds it due: the
ack writer (started with the first buffered completion), an executor after its task, or
the claimer when it finds nothing to claim — never the heartbeat, whose lease renewals
must not wait behind a completion that waits on a row lock. Until the write lands the
heartbeat keeps the lease; a crash before it means the task runs again (at least once).

A completion the database refuses for the row itself (a value it cannot store: an
encoding, data, constraint or size error) is that row's permanent failure
(:func:`fail_unstorable`); its batch-mates are then written one by one, each once.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from django.db import DatabaseError

from django_taskclaim.exceptions import ClaimLost
from django_taskclaim.row.claimable import Claimable
from django_taskclaim.settle.batch import complete_many
from django_taskclaim.settle.transitions import Outcome, complete_pending, fail
from django_taskclaim.settle.writes import storable_text
from django_taskclaim.telemetry import instruments
from django_taskclaim.worker.dbconn import backoff, close, connection_trouble
from django_taskclaim.worker.ledger import Ledger
from django_taskclaim.worker.service import Service, one_line

logger = logging.getLogger("django_taskclaim.worker")

#: Write the buffer at once when it holds this many completions (or a claim batch).
FLUSH_SIZE = 100


class Acks:
    """Writes the ledger's buffered completions; safe to call from any thread."""

    def __init__(
        self, ledger: Ledger, *, window: float, batch: int, using: str, worker_id: str,
        halt: threading.Event,
    ) -> None:  # fmt: skip
        self.ledger = ledger
        self.window = window
        self.size = max(batch, FLUSH_SIZE)
        self.using = using
        self.worker_id = worker_id
        self.halt = halt
        #: Set when a new buffer starts: the ack writer then has a new deadline to keep.
        self.new_deadline = threading.Event()
        self._writer: AckWriter | None = None
        self._writer_lock = threading.Lock()
        self.telemetry = instruments()  # None without OpenTelemetry: nothing measured

    def defer(self, task: Claimable) -> None:
        """The ``defer`` hook of :func:`~django_taskclaim.settle.outcome.settle`: buffer the
        completion of ``task`` to be written with others within ``window`` seconds."""
        if self.ledger.defer_ack(task):
            self._start_writer()
            self.new_deadline.set()

    def _start_writer(self) -> None:
        if self._writer is not None:
            return
        with self._writer_lock:
            if self._writer is None:
                self._writer = AckWriter(self)
                self._writer.start()

    @property
    def enabled(self) -> bool:
        return self.window > 0

    def flush(self, *, due_only: bool = False) -> int:
        """Write the buffered completions (with ``due_only``: only once the oldest has
        waited ``window`` or the buffer is full); return how many were taken to write.
        A connection error is retried with backoff until the worker halts; the write is
        fenced and its outcome checked, so a repeat is harmless. Another error: written
        one by one."""
        tasks = self.ledger.take_acks(window=self.window if due_only else None, size=self.size)
        if not tasks:
            return 0
        try:
            lost = self._write(tasks)
        finally:
            self.ledger.acks_written(tasks)
        self.ledger.history.count_written(tasks, lost)  # for the admin's charts
        if self.telemetry is not None and lost is not None:
            self.telemetry.acked(tasks, lost)
        if lost is not None and logger.isEnabledFor(logging.DEBUG):
            lost_ids = {id(t) for t in lost}
            for task in tasks:
                if id(task) not in lost_ids:
                    logger.debug(
                        "task done task=%s:%s attempt=%s worker=%s",
                        type(task)._meta.label,
                        task.pk,
                        task.attempts,
                        self.worker_id,
                    )
        return len(tasks)

    def _write(self, tasks: list[Any]) -> list[Any] | None:
        """Write ``tasks``' completions, batched; return those not completed (None: the
        worker halted while the database was away, nothing written)."""
        failures = 0
        while True:
            try:
                return complete_many(tasks)
            except Exception as exc:
                close(self.using)
                if not (isinstance(exc, DatabaseError) and connection_trouble(exc)):
                    # Not an outage: the batched statement itself fails (a value one row
                    # cannot store, a pk type or a backend it does not suit). Never
                    # retried as is: one by one, so that only the guilty row fails.
                    logger.error(
                        "batched completion failed tasks=%s worker=%s error=%s: "
                        "writing them one by one",
                        len(tasks),
                        self.worker_id,
                        storable_text(one_line(exc)),
                    )
                    return self.one_by_one(tasks)
                failures += 1
                log = logger.warning if failures == 1 else logger.debug
                log(
                    "database error while recording completions tasks=%s worker=%s error=%s",
                    len(tasks),
                    self.worker_id,
                    one_line(exc),
                )
                if self.halt.wait(backoff(failures)):
                    logger.warning(
                        "completions not recorded tasks=%s worker=%s (their leases will "
                        "expire and they will run again)",
                        len(tasks),
                        self.worker_id,
                    )
                    return None

    def one_by_one(self, tasks: list[Any]) -> list[Any]:
        """Fenced completion per task (the fallback of a failing batched write); return
        the tasks not completed. Errors are logged, never retried forever: a task left
        unwritten is recovered after its lease like any lost completion."""
        left: list[Any] = []
        for task in tasks:
            try:
                complete_pending(task)
            except ClaimLost:
                left.append(task)
            except Exception as exc:
                left.append(task)
                close(self.using)
                if isinstance(exc, DatabaseError) and connection_trouble(exc):
                    logger.error(
                        "completion not recorded task=%s:%s worker=%s error=%s "
                        "(its lease will expire and it will run again)",
                        type(task)._meta.label,
                        task.pk,
                        self.worker_id,
                        one_line(exc),
                    )
                else:
                    fail_unstorable(task, exc, worker_id=self.worker_id)
        return left


class AckWriter(Service):
    """The ack writer: writes the buffer once its oldest completion has waited
    ``window`` (executors and the claimer also write it as they pass by). Its own thread
    and connection: a completion waiting on a row lock delays nothing else. Started with
    the first buffered completion; stopped with the worker's other threads (``halt``)."""

    def __init__(self, acks: Acks) -> None:
        super().__init__(
            "taskclaim-acks", worker_id=acks.worker_id, using=acks.using, halt=acks.halt
        )
        self.acks = acks

    def loop(self) -> None:
        acks = self.acks
        while not self.stopped:
            due = acks.ledger.acks_due_at(acks.window)
            acks.new_deadline.wait(3600.0 if due is None else max(0.0, due - time.monotonic()))
            acks.new_deadline.clear()
            if self.stopped:
                break
            try:
                acks.flush(due_only=True)
            except Exception as exc:  # never dies: the next deadline tries again
                logger.error(
                    "ack writer error worker=%s error=%s",
                    self.worker_id,
                    storable_text(one_line(exc)),
                    exc_info=exc,
                )
                self.close_connections()
                self.wait(1.0)


def fail_unstorable(task: Claimable, exc: BaseException, *, worker_id: str) -> Outcome:
    """The database refused ``task``'s outcome for the row itself (not an outage): a
    value it cannot store (encoding, NUL, data, constraint, size). The row fails for
    good, fenced on its claim token, with the reason in ``last_error``; it is never left
    ``processing`` to run again after its lease. Returns ``failed``, ``lost`` (the claim
    was taken back meanwhile) or ``error`` (not even the failure could be written: the
    row is then recovered after its lease, like any lost write)."""
    label = type(task)._meta.label
    reason = storable_text(f"the task's outcome could not be stored: {type(exc).__name__}: {exc}")
    for text in (reason, f"the task's outcome could not be stored ({type(exc).__name__})"):
        try:
            fail(task, text)
        except ClaimLost:
            return Outcome.LOST
        except Exception as again:
            error = again
            continue
        logger.error(
            "task failed: outcome not storable task=%s:%s attempt=%s worker=%s error=%s",
            label,
            task.pk,
            task.attempts,
            worker_id,
            storable_text(one_line(exc)),
        )
        return Outcome.FAILED
    logger.error(
        "task outcome not recorded task=%s:%s worker=%s error=%s (its lease will expire)",
        label,
        task.pk,
        worker_id,
        storable_text(one_line(error)),
    )
    return Outcome.ERROR
