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
import traceback
from typing import Any

from django.db import router
from django.db.models import F
from django.db.models.functions import Coalesce, Now
from django.tasks import TaskContext, TaskResult, task_backends
from django.tasks.exceptions import InvalidTaskBackend
from django.tasks.signals import task_finished, task_started
from django.utils import timezone
from django.utils.json import normalize_json

from django_taskclaim.conf import taskclaim_settings
from django_taskclaim.db import retry_transient
from django_taskclaim.exceptions import ClaimLost, Fail, Retry
from django_taskclaim.lifecycle import MAX_ERROR_CHARS

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


def lost_attempt(row: QueuedTask) -> dict | None:
    """The error entry of the previous attempt if it never recorded an outcome, else None.

    An attempt is open from its start write until its outcome is written; a row
    claimed while its previous attempt is still open lost that attempt (its worker was
    killed, or its lease expired and the reaper took the row back).
    """
    if not row.attempt_open:
        return None
    ids = row.worker_ids if isinstance(row.worker_ids, list) and row.worker_ids else ["?"]
    return error_entry(
        None,
        WorkerLost,
        f"attempt {len(ids)} on worker {ids[-1]} did not record an outcome: "
        f"{row.last_error or 'its worker stopped or lost its lease'}",
    )


def _start(row: QueuedTask, lost: dict | None) -> None:
    """Fenced write that opens the attempt: worker id, timestamps, lost-attempt error."""
    worker = row.locked_by or "?"
    worker_ids = [*(row.worker_ids if isinstance(row.worker_ids, list) else []), worker]
    updates: dict[str, Any] = {
        "worker_ids": worker_ids,
        "attempt_open": True,
        "last_attempted_at": Now(),
        "started_at": Coalesce(F("started_at"), Now()),
    }
    if lost is not None:
        updates["errors"] = _errors(row, lost)
    using = row._state.db or router.db_for_write(QueuedTask)
    qs = QueuedTask._base_manager.using(using).filter(
        pk=row.pk, version=row.version, status="processing"
    )
    if retry_transient(lambda: qs.update(**updates), using, what="start task") != 1:
        raise ClaimLost(
            f"{row._meta.label} pk={row.pk}: claim token {row.version} is no longer current; "
            "the attempt was not started",
            task=row,
        )
    now = timezone.now()
    row.worker_ids = worker_ids
    row.attempt_open = True
    row.last_attempted_at = now
    row.started_at = row.started_at or now
    if lost is not None:
        row.errors = updates["errors"]


def _finish_failed(row: QueuedTask, exc: BaseException, *, permanent: bool) -> str:
    """Record a failed attempt: retry with backoff, or FAILED once out of attempts."""
    fields = {"errors": _errors(row, error_entry(exc, type(exc))), "attempt_open": False}
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


def execute(row: QueuedTask) -> str:
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
    lost = lost_attempt(row)
    if row.attempts > row.max_attempts:
        row.fail(
            f"gave up: attempt {row.attempts} exceeds max_attempts={row.max_attempts}"
            + (f"; {lost['traceback']}" if lost else ""),
            errors=_errors(row, *([lost] if lost else [])),
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
    row.complete(return_value=value, attempt_open=False)
    task_finished.send(sender, task_result=to_result(row, task=task))
    return "done"
