"""The deadlines of the bodies one worker process runs (``ClaimMeta.timeout``, a row's
``task_timeout``: :mod:`django_taskclaim.settle.deadline`).

An executor arms a body's deadline as it starts it (:meth:`Deadlines.arm`) and disarms it
as the body returns (:meth:`Deadlines.disarm`, which says whether it fired). One thread,
started with the first deadline armed, waits for the next one; at a deadline it marks
the instance overdue, sets its cancellation flag (``task.cancel_requested()``, the
``cancel`` argument) and raises ``CancelledError`` into an async body. The executor then
records the attempt as a failure with ``TimeoutError`` (:meth:`Deadlines.past`).

A body that ignores the flag keeps running; its lease is kept by the heartbeat, so the
row is never run again meanwhile (NO EARLY RE-RUN; a body that stalls the whole process
stops the heartbeat too: :mod:`.leasewatch`). Once it is ``grace`` seconds past its
deadline (``TASKCLAIM_TIMEOUT_GRACE``, else the model's lease):

- in a ``--processes`` child, the supervisor kills the process and replaces it: each
  armed body is reported to it on a pipe (``report_fd``: one JSON line as it starts,
  one as it returns; see :mod:`.supervisor`), so the supervisor acts on its own clock
  even if this process is stuck;
- at every heartbeat (:meth:`Deadlines.beat`) the worker logs each such body.

A model that can have no deadline (no timeout, no ``task_timeout`` field) costs one
lookup per body: nothing is armed, reported or started.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from django.db.models import Model

from django_taskclaim.config.options import get_options
from django_taskclaim.settle.deadline import (
    TIMEOUT_FIELD,
    deadline_error,
    grace,
    mark_overdue,
    timeout_of,
)
from django_taskclaim.settle.outcome import Attempt, cancel_flag
from django_taskclaim.telemetry import timed_out

logger = logging.getLogger("django_taskclaim.worker")


class _Armed:
    """One running body with a deadline."""

    __slots__ = ("due", "fired", "grace", "key", "task", "timeout")

    def __init__(self, task: Any, timeout: float, grace: float, started: float) -> None:
        self.task = task
        self.timeout = timeout
        self.grace = grace
        self.due = started + timeout
        self.fired = False
        self.key = f"{type(task)._meta.label}:{task.pk}:{task.version}"


class Deadlines:
    """The armed deadlines of one process; thread-safe."""

    def __init__(
        self,
        *,
        worker_id: str,
        lease_for: Callable[[type[Model]], float],
        cancel_async: Callable[[Any], bool],
        report_fd: int | None = None,
    ) -> None:
        self.worker_id = worker_id
        self.lease_for = lease_for
        self.cancel_async = cancel_async
        self.report_fd = report_fd
        self._changed = threading.Condition()
        self._report_lock = threading.Lock()
        self._armed: dict[int, _Armed] = {}  # id(task) -> its deadline
        self._thread: threading.Thread | None = None

    @property
    def supervised(self) -> bool:
        """Whether a supervisor watches the deadlines of this process."""
        return self.report_fd is not None

    def arm(self, task: Any) -> None:
        """The body of ``task`` starts now: watch its deadline, if it has one."""
        opts = get_options(task)
        if opts.timeout is None and not opts.has(TIMEOUT_FIELD):  # no deadline possible
            return
        timeout = timeout_of(task)
        if timeout is None:
            return
        entry = _Armed(task, timeout, grace(self.lease_for(type(task))), time.monotonic())
        with self._changed:
            self._armed[id(task)] = entry
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._watch, name="taskclaim-deadlines", daemon=True
                )
                self._thread.start()
            self._changed.notify_all()
        self._report(
            {
                "op": "arm",
                "key": entry.key,
                "label": type(task)._meta.label,
                "pk": str(task.pk),
                "version": task.version,
                "timeout": timeout,
                "kill_in": timeout + entry.grace,
            }
        )

    def disarm(self, task: Any) -> float | None:
        """The body of ``task`` returned: stop watching it. Returns its deadline (seconds)
        if the body ran past it, else ``None``."""
        if id(task) not in self._armed:  # never armed (only this thread arms its body)
            return None
        with self._changed:
            entry = self._armed.pop(id(task), None)
        if entry is None:
            return None
        self._report({"op": "disarm", "key": entry.key})
        return entry.timeout if entry.fired else None

    @staticmethod
    def past(task: Any, done: Attempt, timeout: float) -> Attempt:
        """What the attempt of a body that ran past ``timeout`` is: the failure
        ``TimeoutError`` whatever the body returned or raised, unless the body finished
        its row itself (that write, fenced, stands)."""
        opts = get_options(task)
        if opts.state_of(getattr(task, opts.status_field)) != "processing":
            return done
        timed_out(task)
        return Attempt(error=deadline_error(timeout))

    def beat(self) -> None:
        """Called at every heartbeat: log each body still running ``grace`` seconds past
        its deadline (its lease is kept meanwhile: it is never run twice at once)."""
        now = time.monotonic()
        with self._changed:
            late = [e for e in self._armed.values() if e.fired and now >= e.due + e.grace]
        for entry in late:
            task = entry.task
            logger.warning(
                "task still running past its deadline task=%s:%s attempt=%s timeout=%gs "
                "over=%.1fs worker=%s: it ignores its cancellation flag; its lease is kept "
                "so it is not run again while it runs%s",
                type(task)._meta.label,
                task.pk,
                task.attempts,
                entry.timeout,
                now - entry.due,
                self.worker_id,
                " (its supervisor replaces this process)"
                if self.supervised
                else "; stop this worker (SIGTERM) to requeue it after --grace",
            )

    def _watch(self) -> None:
        """Fire each deadline as it comes (the thread of this process's deadlines)."""
        while True:
            with self._changed:
                now = time.monotonic()
                due = [e for e in self._armed.values() if not e.fired and e.due <= now]
                for entry in due:
                    entry.fired = True
                    mark_overdue(entry.task, entry.timeout)
                if not due:
                    nxt = min((e.due for e in self._armed.values() if not e.fired), default=None)
                    self._changed.wait(None if nxt is None else max(0.0, nxt - now))
                    continue
            for entry in due:
                self._tell(entry)

    def _tell(self, entry: _Armed) -> None:
        """Tell a body its deadline passed: its flag, ``CancelledError`` if async."""
        task = entry.task
        cancel_flag(task).set()
        on_loop = self.cancel_async(task)
        logger.warning(
            "task ran past its deadline task=%s:%s attempt=%s timeout=%gs worker=%s: "
            "asked to stop (%s); the attempt fails with TimeoutError",
            type(task)._meta.label,
            task.pk,
            task.attempts,
            entry.timeout,
            self.worker_id,
            "CancelledError" if on_loop else "cancellation flag",
        )

    def _report(self, message: dict[str, Any]) -> None:
        """One line to the supervisor (if any); a supervisor gone is not an error (this
        process then stops on its own: :mod:`.process`)."""
        if self.report_fd is None:
            return
        data = (json.dumps(message, separators=(",", ":")) + "\n").encode()
        with self._report_lock:
            try:
                os.write(self.report_fd, data)  # one write under PIPE_BUF: never interleaved
            except OSError as exc:
                logger.debug("deadline report not sent worker=%s error=%s", self.worker_id, exc)
