"""Recording one attempt of a Task: its start, its errors and its outcome.

:func:`start` opens the attempt in memory (no write of its own) and :func:`lost_attempts`
names the earlier attempts that never recorded an outcome. The outcome is written by the
core's fenced lifecycle writes, on the claim token: :func:`success_fields` is what a
success hands to the worker's batched, fenced completion
(:class:`~django_taskclaim.settle.outcome.BatchableResult`); :func:`finish_failed` records a
failed attempt with :func:`~django_taskclaim.settle.outcome.retry` or
:func:`~django_taskclaim.settle.outcome.fail`, after the delay of :func:`backoff`;
:func:`give_up` ends a task whose attempts were used up by lost workers. Error texts are
capped by :func:`~django_taskclaim.settle.writes.format_error`, the rule of ``last_error``.
"""

from __future__ import annotations

import logging
import re
import time
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django_taskclaim.backends import for_alias
from django_taskclaim.config.options import get_options, retry_delay
from django_taskclaim.contrib.tasks import announce
from django_taskclaim.contrib.tasks.exceptions import WorkerLost
from django_taskclaim.db import db_now
from django_taskclaim.exceptions import Retry
from django_taskclaim.settle.writes import format_error

if TYPE_CHECKING:
    from django_taskclaim.contrib.tasks.models import QueuedTask

logger = logging.getLogger("django_taskclaim.tasks")

#: Errors kept per task (oldest dropped first); each traceback is capped too.
MAX_ERRORS = 100


def backoff(alias: str, attempts: int) -> float:
    """Seconds before the next attempt after ``attempts`` attempts of a task of ``alias``.

    The core's rule (:func:`~django_taskclaim.config.options.retry_delay`: ``retry_backoff *
    2 ** (attempts - 1)``, capped at ``retry_backoff_max``, spread by ``± retry_jitter``)
    with the backend's ``OPTIONS``; when the alias is no longer configured, the task
    model's own backoff (the ``TASKCLAIM_RETRY_*`` settings), as the core worker uses.
    """
    backend = announce.backend_for(alias)
    if backend is None:
        from django_taskclaim.contrib.tasks.models import (
            QueuedTask,  # deferred: models need the app registry
        )

        return get_options(QueuedTask).backoff(attempts)
    base, cap, jitter = backend.retry_settings()
    return retry_delay(attempts, base=base, cap=cap, jitter=jitter)


def error_entry(exc: BaseException | None, cls: type[BaseException], text: str = "") -> dict:
    """A stored ``TaskError``: the exception's class path (``cls`` when ``exc`` is
    ``None``) and its formatted traceback (else ``text``), capped like ``last_error``.
    A traceback ends with a newline, as Django's own backends store it (the lines of
    ``traceback.format_exception``, joined)."""
    if exc is not None:
        cls = type(exc)
        # format_error() (the rule of last_error) strips the final newline: put it back.
        traceback = format_error(exc) + "\n"
    else:
        traceback = format_error(text)
    return {
        "exception_class_path": f"{cls.__module__}.{cls.__qualname__}",
        "traceback": traceback,
    }


def with_errors(row: QueuedTask, *new: dict) -> list[dict]:
    """The row's stored errors followed by ``new``, the last :data:`MAX_ERRORS` of them."""
    old = row.errors if isinstance(row.errors, list) else []
    return [*old, *new][-MAX_ERRORS:]


#: The holder named in ``last_error`` by whoever took the row back: the reaper ("lease
#: expired; held by W", "released from worker W") or a supervisor that saw its child
#: exit ("worker W exited (signal SIGKILL); released by its supervisor").
_HOLDER = re.compile(r"(?:held by|from worker|^worker) (\S+)")


def lost_attempts(row: QueuedTask) -> list[dict]:
    """Error entries of the earlier attempts that never recorded an outcome.

    Every attempt that records an outcome adds its worker to ``worker_ids``; attempts
    are counted at claim (a release that gives an unstarted row back uncounts it). So the
    claims before this one that left no trace are ``attempts - 1 - len(worker_ids)``:
    their workers died or lost their lease. The last one's worker is named in
    ``last_error`` by whoever took the row back; earlier ones are unknown (``?``).
    Rows written by an older version mark an open attempt with ``attempt_open``.
    Each entry carries its worker under ``worker_id`` until :func:`start` takes it.
    """
    ids = row.worker_ids if isinstance(row.worker_ids, list) else []
    missing = max(0, row.attempts - 1 - len(ids))
    if not missing and row.attempt_open:
        missing = 1  # an older version's attempt, started (and listed) but never finished
        ids = ids[:-1]
    if not missing:
        return []
    found = _HOLDER.search(row.last_error or "")
    last_holder = found.group(1) if found else "?"
    why = row.last_error or "its worker stopped or lost its lease"
    entries = []
    for k in range(missing):
        number = len(ids) + k + 1
        holder = last_holder if k == missing - 1 else "?"
        entry = error_entry(
            None,
            WorkerLost,
            f"attempt {number} on worker {holder} did not record an outcome: {why}",
        )
        entries.append(entry | {"worker_id": holder})
    return entries


def start(row: QueuedTask, lost: list[dict]) -> None:
    """Open the attempt in memory only — no write of its own: worker ids, timestamps and
    a lost-attempt error are recorded with the attempt's outcome, in the same fenced
    UPDATE (batched with other completions by the worker). Until then the row is
    ``processing`` (RUNNING) and its lease names the worker."""
    worker = row.locked_by or "?"
    previous = row.worker_ids if isinstance(row.worker_ids, list) else []
    if row.attempt_open and previous:
        previous = previous[:-1]  # an older version listed the open attempt already
    if lost:
        previous = [*previous, *(entry.pop("worker_id", "?") for entry in lost)]
        row.errors = with_errors(row, *lost)
    row.worker_ids = [*previous, worker]
    first = row.started_at  # None before the first attempt
    began = _db_clock(row._state.db or "default", time.monotonic())
    row.__dict__[_ATTEMPT] = (first, began, bool(lost))
    row.last_attempted_at = began
    row.started_at = first or began


#: Set by :func:`start` on the row: (``started_at`` before this attempt, this attempt's
#: start on the database clock, whether the attempt added errors of lost attempts).
_ATTEMPT = "_taskclaim_attempt"


def _attempt(row: QueuedTask) -> tuple[datetime | None, datetime, bool]:
    found = row.__dict__.get(_ATTEMPT)
    if found is None:  # not started by start(): the attempt begins now
        found = (row.started_at, _db_clock(row._state.db or "default", time.monotonic()), True)
    return found


#: (database clock reading, monotonic clock at that reading) per database alias.
_CLOCK: dict[str, tuple[datetime, float]] = {}
#: How long one reading of the database clock serves (then it is read again).
CLOCK_READING_TTL = 60.0


def _db_clock(using: str, at: float) -> datetime:
    """The database clock's time at monotonic instant ``at``: one reading of the
    database's ``now()`` per minute, plus the monotonic time elapsed since (so the
    attempt's start is written as a plain value that batches well, yet on the database's
    clock, never the worker's wall clock).

    Where the clock is an in-process call with millisecond steps (SQLite:
    :attr:`~django_taskclaim.backends.base.DatabaseSQL.clock_in_process`) it is read
    every time: a reading plus elapsed time could land a fraction of a millisecond after
    the ``finished_at`` the same attempt's completion then writes."""
    if for_alias(using).clock_in_process:
        return db_now(using)
    reading = _CLOCK.get(using)
    if reading is None or time.monotonic() - reading[1] > CLOCK_READING_TTL:
        reading = _CLOCK[using] = (db_now(using), time.monotonic())
    return reading[0] + timedelta(seconds=at - reading[1])


def _attempt_fields(row: QueuedTask) -> dict[str, Any]:
    """What a failed attempt's write records besides the outcome: the worker ids and
    errors so far, and the attempt's start on the database clock."""
    first, began, _lost = _attempt(row)
    return {
        "worker_ids": row.worker_ids,
        "errors": row.errors if isinstance(row.errors, list) else [],
        "attempt_open": False,
        "last_attempted_at": began,
        "started_at": first or began,
    }


def success_fields(row: QueuedTask, value: Any) -> dict[str, Any]:
    """What a successful attempt writes with its completion: the return value, the
    worker ids and the timestamps — and only when they changed, the errors (lost
    attempts found at this claim) and ``attempt_open`` (a row an older version left
    open)."""
    first, began, lost = _attempt(row)
    fields = {
        "return_value": value,
        "worker_ids": row.worker_ids,
        "last_attempted_at": began,
        "started_at": first or began,
    }
    if lost:
        fields["errors"] = row.errors if isinstance(row.errors, list) else []
    if row.attempt_open:
        fields["attempt_open"] = False
    return fields


def finish_failed(row: QueuedTask, exc: BaseException, *, permanent: bool) -> str:
    """Record a failed attempt in one fenced write and return the row's state: retried
    (``"ready"``) after ``Retry``'s own delay or the backoff, or ``"failed"`` when
    ``permanent`` or once the row's ``max_attempts`` attempts are used. A lost claim
    raises :class:`~django_taskclaim.exceptions.ClaimLost` and writes nothing."""
    fields = {**_attempt_fields(row), "errors": with_errors(row, error_entry(exc, type(exc)))}
    if permanent or row.attempts >= row.max_attempts:
        reason = (
            str(exc)
            if permanent
            else (
                f"gave up after {row.attempts} attempt(s) (max_attempts={row.max_attempts}): "
                f"{type(exc).__name__}: {exc}"
            )
        )
        row.fail(reason, **fields)
        logger.info(
            "task failed id=%s path=%s attempts=%s error=%r",
            row.pk,
            row.task_path,
            row.attempts,
            exc,
        )
        announce.failed_for_good(row)
        return "failed"
    # Retry's explicit delay (seconds; a timedelta given to Retry is converted) wins.
    delay = exc.delay if isinstance(exc, Retry) else None
    if delay is None:
        delay = backoff(row.backend_name, row.attempts)
    row.retry(delay=delay, error=exc, **fields)
    logger.info(
        "task will retry id=%s path=%s attempt=%s delay=%.3f error=%r",
        row.pk,
        row.task_path,
        row.attempts,
        delay,
        exc,
    )
    return "ready"


def give_up(row: QueuedTask, lost: list[dict]) -> str:
    """End FAILED, without running it, a row claimed beyond its ``max_attempts`` (its
    earlier attempts' workers were lost): one fenced write recording the lost attempts,
    then ``task_finished``. Returns ``"failed"``."""
    ids = row.worker_ids if isinstance(row.worker_ids, list) else []
    holders = [entry.pop("worker_id", "?") for entry in lost]
    row.fail(
        f"gave up: attempt {row.attempts} exceeds max_attempts={row.max_attempts}"
        + (f"; {lost[-1]['traceback']}" if lost else ""),
        errors=with_errors(row, *lost),
        worker_ids=[*ids, *holders],
        attempt_open=False,
    )
    announce.failed_for_good(row)
    return "failed"
