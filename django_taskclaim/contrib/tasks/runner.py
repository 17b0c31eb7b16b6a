"""The handler the worker calls for each claimed ``QueuedTask`` row: one attempt of a Task.

:func:`execute` is ``QueuedTask.ClaimMeta.handler``. It records the attempt, imports the
task function by path, decodes the arguments, runs the function (coroutines on an event
loop) and records the outcome with the fenced lifecycle writes, so a worker that lost
its claim writes nothing.
"""

from __future__ import annotations

import inspect
import json
import logging
import random
import re
import time
import traceback
from datetime import datetime, timedelta
from typing import Any

from django.tasks import TaskContext, TaskResult, task_backends
from django.tasks.exceptions import InvalidTaskBackend
from django.tasks.signals import task_finished, task_started
from django.utils.json import normalize_json

from django_taskclaim.conf import taskclaim_settings
from django_taskclaim.exceptions import Fail, Retry
from django_taskclaim.lifecycle import MAX_ERROR_CHARS, BatchableResult

from .backend import TaskClaimBackend
from .exceptions import (
    ArgumentsUndecodable,
    ReturnValueNotSerializable,
    TaskUnavailable,
    WorkerLost,
)
from .models import QueuedTask
from .results import import_task, task_for_row, to_result

logger = logging.getLogger("django_taskclaim.tasks")

#: Errors kept per task (oldest dropped first); each traceback is capped too.
MAX_ERRORS = 100


def _backend(alias: str) -> TaskClaimBackend | None:
    try:
        backend = task_backends[alias]
    except InvalidTaskBackend:
        return None
    return backend if isinstance(backend, TaskClaimBackend) else None


def _sender(alias: str) -> type:
    backend = _backend(alias)
    return type(backend) if backend is not None else TaskClaimBackend


def backoff(alias: str, attempts: int) -> float:
    """Seconds before the next attempt after ``attempts`` attempts of a task of ``alias``.

    ``retry_backoff * 2 ** (attempts - 1)``, capped at ``retry_backoff_max``, spread by
    ``± retry_jitter``; options come from the backend's ``OPTIONS``, falling back to the
    ``TASKCLAIM_RETRY_*`` settings when the alias is no longer configured.
    """
    backend = _backend(alias)
    if backend is not None:
        base, cap, jitter = backend.retry_settings()
    else:
        base = float(taskclaim_settings.RETRY_BACKOFF)
        cap = float(taskclaim_settings.RETRY_BACKOFF_MAX)
        jitter = float(taskclaim_settings.RETRY_JITTER)
    delay = min(cap, base * (2 ** max(0, attempts - 1)))
    if jitter:
        delay *= 1 + random.uniform(-jitter, jitter)
    return max(0.0, delay)


def _cap(text: str) -> str:
    if len(text) > MAX_ERROR_CHARS:
        return text[: MAX_ERROR_CHARS // 2] + "\n…\n" + text[-MAX_ERROR_CHARS // 2 :]
    return text


def error_entry(exc: BaseException | None, cls: type[BaseException], text: str = "") -> dict:
    """A stored ``TaskError``: the exception's class path and its formatted traceback."""
    if exc is not None:
        cls = type(exc)
        text = "".join(traceback.format_exception(exc))
    return {"exception_class_path": f"{cls.__module__}.{cls.__qualname__}", "traceback": _cap(text)}


def _errors(row: QueuedTask, *new: dict) -> list[dict]:
    old = row.errors if isinstance(row.errors, list) else []
    return [*old, *new][-MAX_ERRORS:]


def _decode(row: QueuedTask, func: Any, takes_context: bool) -> tuple[list[Any], dict[str, Any]]:
    """The stored arguments, checked against the function's signature."""
    args, kwargs = row.args, row.kwargs
    if not isinstance(args, list):
        raise ArgumentsUndecodable(
            f"stored positional arguments of {row.task_path} are not a JSON array: {args!r:.200}"
        )
    if not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
        raise ArgumentsUndecodable(
            f"stored keyword arguments of {row.task_path} are not a JSON object: {kwargs!r:.200}"
        )
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError):
        return args, kwargs
    try:
        signature.bind(*([None] if takes_context else []), *args, **kwargs)
    except TypeError as exc:
        raise ArgumentsUndecodable(
            f"stored arguments do not match {row.task_path}{signature}: {exc}"
        ) from exc
    return args, kwargs


_HOLDER = re.compile(r"(?:held by|from worker) (\S+)")


def lost_attempts(row: QueuedTask) -> list[dict]:
    """Error entries of the earlier attempts that never recorded an outcome.

    Every attempt that records an outcome adds its worker to ``worker_ids``; attempts
    are counted at claim (a release that gives an unstarted row back uncounts it). So the
    claims before this one that left no trace are ``attempts - 1 - len(worker_ids)``:
    their workers died or lost their lease. The last one's worker is named in
    ``last_error`` by whoever took the row back; earlier ones are unknown (``?``).
    Rows written by an older version mark an open attempt with ``attempt_open``.
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


def _start(row: QueuedTask, lost: list[dict]) -> None:
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
        row.errors = _errors(row, *lost)
    row.worker_ids = [*previous, worker]
    row.attempt_open = True
    row.__dict__[_FIRST_START] = row.started_at  # None before the first attempt
    row.__dict__[_STARTED] = time.monotonic()
    began = _db_clock(row._state.db or "default", row.__dict__[_STARTED])
    row.last_attempted_at = began
    row.started_at = row.started_at or began


_STARTED = "_taskclaim_attempt_started"
_FIRST_START = "_taskclaim_first_start"


#: (database clock reading, monotonic clock at that reading) per database alias.
_CLOCK: dict[str, tuple[datetime, float]] = {}
#: How long one reading of the database clock serves (then it is read again).
CLOCK_READING_TTL = 60.0


def _db_clock(using: str, at: float) -> datetime:
    """The database clock's time at monotonic instant ``at``: one reading of the
    database's ``now()`` per minute, plus the monotonic time elapsed since (so the
    attempt's start is written as a plain value that batches well, yet on the database's
    clock, never the worker's wall clock)."""
    reading = _CLOCK.get(using)
    if reading is None or time.monotonic() - reading[1] > CLOCK_READING_TTL:
        from django_taskclaim.monitoring import db_now

        reading = _CLOCK[using] = (db_now(using), time.monotonic())
    return reading[0] + timedelta(seconds=at - reading[1])


def _attempt_fields(row: QueuedTask) -> dict[str, Any]:
    """What the attempt's outcome write records besides the outcome: the worker ids and
    errors so far, and the attempt's start on the database clock."""
    using = row._state.db or "default"
    began = _db_clock(using, row.__dict__.get(_STARTED, time.monotonic()))
    return {
        "worker_ids": row.worker_ids,
        "errors": row.errors if isinstance(row.errors, list) else [],
        "attempt_open": False,
        "last_attempted_at": began,
        "started_at": row.__dict__.get(_FIRST_START) or began,
    }


def _finish_failed(row: QueuedTask, exc: BaseException, *, permanent: bool) -> str:
    """Record a failed attempt: retry with backoff, or FAILED once out of attempts."""
    fields = {**_attempt_fields(row), "errors": _errors(row, error_entry(exc, type(exc)))}
    delay: float | None = None
    if isinstance(exc, Retry):
        delay = exc.delay
    if permanent or row.attempts >= row.max_attempts:
        reason = (
            str(exc)
            if permanent
            else (
                f"gave up after {row.attempts} attempt(s) (max_attempts={row.max_attempts}): "
                f"{type(exc).__name__}: {exc}"
            )
        )
        row.fail(_cap(reason), **fields)
        logger.info(
            "task failed id=%s path=%s attempts=%s error=%r",
            row.pk,
            row.task_path,
            row.attempts,
            exc,
        )
        task_finished.send(_sender(row.backend_name), task_result=to_result(row))
        return "failed"
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


def execute(row: QueuedTask) -> str | BatchableResult:
    """Run one attempt of the claimed Task row and record its outcome; return the state.

    Guarantees: every write is fenced on the claim token (a worker that lost the claim
    writes nothing); the return value is stored in the same fenced UPDATE that marks
    the row SUCCESSFUL; a task function that no longer imports, arguments that cannot
    be decoded or bound to its signature, and a return value that is not JSON end the
    task FAILED at once with a clear error (retrying could not help); any other
    exception is retried with backoff until the row's ``max_attempts``. An attempt
    whose worker died is recorded as a ``WorkerLost`` error when the task is next
    claimed, and a task that used up its attempts that way ends FAILED without
    running again. Django's ``task_started`` / ``task_finished`` signals are sent.
    """
    lost = lost_attempts(row)
    if row.attempts > row.max_attempts:
        ids = row.worker_ids if isinstance(row.worker_ids, list) else []
        holders = [entry.pop("worker_id", "?") for entry in lost]
        row.fail(
            f"gave up: attempt {row.attempts} exceeds max_attempts={row.max_attempts}"
            + (f"; {lost[-1]['traceback']}" if lost else ""),
            errors=_errors(row, *lost),
            worker_ids=[*ids, *holders],
            attempt_open=False,
        )
        task_finished.send(_sender(row.backend_name), task_result=to_result(row))
        return "failed"
    _start(row, lost)
    sender = _sender(row.backend_name)
    try:
        template = import_task(row.task_path)
        task = task_for_row(row, template)
        args, kwargs = _decode(row, task.func, task.takes_context)
    except (TaskUnavailable, ArgumentsUndecodable) as exc:
        task_started.send(sender, task_result=to_result(row))
        return _finish_failed(row, exc, permanent=True)
    result: TaskResult = to_result(row, task=task)
    task_started.send(sender, task_result=result)
    try:
        if task.takes_context:
            value = task.call(TaskContext(task_result=result), *args, **kwargs)
        else:
            value = task.call(*args, **kwargs)
    except Fail as exc:
        return _finish_failed(row, exc, permanent=True)
    except Exception as exc:
        return _finish_failed(row, exc, permanent=False)
    try:
        value = normalize_json(value)
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        error = ReturnValueNotSerializable(
            f"{row.task_path} returned a value that cannot be stored as JSON: {exc}"
        )
        error.__cause__ = exc
        return _finish_failed(row, error, permanent=True)

    def finished() -> None:
        task_finished.send(sender, task_result=to_result(row, task=task))

    # Written by the worker with other completions in one fenced UPDATE (or at once when
    # run outside a worker); ``finished`` is sent once it is.
    return BatchableResult({**_attempt_fields(row), "return_value": value}, on_written=finished)
