"""Batched acknowledgements: completions buffered in the ledger, written together.

A task whose body returned no result fields (or a
:class:`~django_taskclaim.lifecycle.BatchableResult`) is not completed at once: its
completion waits in the :class:`~.ledger.Ledger` for up to ``--ack-window`` seconds
and is written with the others in one fenced UPDATE
(:func:`~django_taskclaim.lifecycle.complete_many`). Until then the heartbeat keeps its
lease; a crash before the write means the task runs again (at least once).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from django.db import DatabaseError

from ..exceptions import ClaimLost
from ..lifecycle import complete_many, complete_pending
from ..types import Claimable
from .dbconn import backoff, close, connection_trouble, one_line
from .ledger import Ledger

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
        #: Set when a new buffer starts: the heartbeat then has a new deadline to keep.
        self.new_deadline = threading.Event()

    def defer(self, task: Claimable) -> None:
        """The ``defer`` hook of :func:`~django_taskclaim.lifecycle.settle`: buffer the
        completion of ``task`` to be written with others within ``window`` seconds."""
        if self.ledger.defer_ack(task):
            self.new_deadline.set()

    @property
    def enabled(self) -> bool:
        return self.window > 0

    def flush(self, *, due_only: bool = False) -> None:
        """Write the buffered completions (with ``due_only``: only once the oldest has
        waited ``window`` or the buffer is full). A connection error is retried with
        backoff until the worker halts; the write is fenced and its outcome checked, so
        a repeat is harmless. Another error: written one by one."""
        tasks = self.ledger.take_acks(window=self.window if due_only else None, size=self.size)
        if not tasks:
            return
        failures = 0
        while True:
            try:
                lost = complete_many(tasks)
                break
            except DatabaseError as exc:
                close(self.using)
                if not connection_trouble(exc):
                    # Not an outage: the batched statement itself fails (a pk type or a
                    # backend it does not suit). Never retried as is: one by one.
                    logger.error(
                        "batched completion failed tasks=%s worker=%s error=%s: "
                        "writing them one by one",
                        len(tasks),
                        self.worker_id,
                        one_line(exc),
                        exc_info=exc,
                    )
                    lost = self.one_by_one(tasks)
                    break
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
                    return
        if logger.isEnabledFor(logging.DEBUG):
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
            except DatabaseError as exc:
                left.append(task)
                close(self.using)
                logger.error(
                    "completion not recorded task=%s:%s worker=%s error=%s "
                    "(its lease will expire and it will run again)",
                    type(task)._meta.label,
                    task.pk,
                    self.worker_id,
                    one_line(exc),
                )
        return left
