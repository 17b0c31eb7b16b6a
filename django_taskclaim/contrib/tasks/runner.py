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
import math
import operator
import random
import re
import time
import traceback
from collections.abc import Callable
from datetime import datetime, timedelta
from functools import partial
from typing import Any, cast

from asgiref.sync import async_to_sync
from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import Signal, receiver
from django.tasks import Task, TaskContext, TaskResult, TaskResultStatus, task_backends
from django.tasks.exceptions import InvalidTaskBackend
from django.tasks.signals import log_task_finished, log_task_started, task_finished, task_started
from django.utils.json import normalize_json
from django.utils.log import RequireDebugFalse, RequireDebugTrue

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
from .results import _build_task, import_task, to_result

logger = logging.getLogger("django_taskclaim.tasks")

#: Errors kept per task (oldest dropped first); each traceback is capped too.
MAX_ERRORS = 100


def _backend(alias: str) -> TaskClaimBackend | None:
    try:
        backend = task_backends[alias]
    except InvalidTaskBackend:
        return None
    return backend if isinstance(backend, TaskClaimBackend) else None


#: The signal sender (the backend's class) of each backend alias; forgotten when the
#: ``TASKS`` setting changes.
_SENDERS: dict[str, type] = {}


def _sender(alias: str) -> type:
    sender = _SENDERS.get(alias)
    if sender is None:
        backend = _backend(alias)
        sender = _SENDERS[alias] = type(backend) if backend is not None else TaskClaimBackend
    return sender


@receiver(setting_changed)
def _forget_senders(*, setting: str, **kwargs: Any) -> None:
    if setting == "TASKS":
        _SENDERS.clear()


#: Who listens to ``task_started`` / ``task_finished`` for a sender (see :func:`audience`).
NOBODY, DJANGO_LOG_ONLY, RECEIVERS = "nobody", "django-log-only", "receivers"

#: Django's own receivers of the task signals: each writes one line to the
#: ``django.tasks`` logger and reads nothing but the result's id, path and status.
_DJANGO_LOGGERS = (log_task_started, log_task_finished)
_tasks_logger = logging.getLogger("django.tasks")


#: (signal, sender) -> (the signal's receiver entries when last looked at, who listens).
_AUDIENCES: dict[tuple[Signal, type], tuple[tuple[Any, ...], str]] = {}


def audience(signal: Signal, sender: type) -> str:
    """Who would receive ``signal`` sent by ``sender`` now: ``NOBODY``,
    ``DJANGO_LOG_ONLY`` (only Django's own logging receiver, always connected: its log
    line is written directly, without building a ``TaskResult``) or ``RECEIVERS`` (any
    other receiver: the signal is sent with a full ``TaskResult``, as Django's backends
    do). The answer is recomputed whenever a receiver is connected or disconnected."""
    entries = signal.receivers  # one entry per connection, replaced on (dis)connect
    if not entries:
        return NOBODY
    known = _AUDIENCES.get((signal, sender))
    if (
        known is not None
        and len(known[0]) == len(entries)
        and all(map(operator.is_, known[0], entries))
    ):
        return known[1]
    snapshot = tuple(entries)  # kept: their ids cannot be reused while the cache holds them
    try:
        sync_receivers, async_receivers = signal._live_receivers(sender)
    except Exception:  # internals of another Django version: send it as usual
        return RECEIVERS
    if async_receivers or any(r not in _DJANGO_LOGGERS for r in sync_receivers):
        who = RECEIVERS
    else:
        who = DJANGO_LOG_ONLY if sync_receivers else NOBODY
    _AUDIENCES[(signal, sender)] = (snapshot, who)
    return who


def _handler_drops(handler: logging.Handler, level: int) -> bool:
    """Whether ``handler`` certainly drops a record of ``level`` now: its own level is
    higher, or Django's ``RequireDebugTrue`` / ``RequireDebugFalse`` filter rejects it
    (and the handler has no filter of another kind, which only logging can judge)."""
    if level < handler.level:
        return True
    rejects = False
    for f in handler.filters:
        kind = type(f)
        if kind is RequireDebugTrue:
            rejects = rejects or not settings.DEBUG
        elif kind is RequireDebugFalse:
            rejects = rejects or settings.DEBUG
        else:
            return False
    return rejects


def log_would_emit(logger: logging.Logger, level: int) -> bool:
    """Whether a record of ``level`` logged to ``logger`` now would reach a handler that
    emits it: the walk of ``Logger.callHandlers`` (the logger's handlers, then its
    parents' while ``propagate``), judged only from levels and Django's two ``DEBUG``
    filters; a logger or handler filter of any other kind counts as emitting.

    With Django's default ``LOGGING`` and ``DEBUG = False``, the ``django`` logger's
    INFO records go to a console handler that drops them: this answers ``False`` there,
    so such a record need not be built at all."""
    if not logger.isEnabledFor(level):
        return False
    if logger.filters:
        return True
    found = 0
    current: logging.Logger | None = logger
    while current is not None:
        for handler in current.handlers:
            found += 1
            if not _handler_drops(handler, level):
                return True
        current = current.parent if current.propagate else None
    if found:
        return False
    last = logging.lastResort  # no handler at all: what logging does then
    return last is None or level >= last.level


def _log_state(row: QueuedTask, plan: _Plan, status: TaskResultStatus) -> None:
    """The line Django's ``log_task_started`` / ``log_task_finished`` would write (not
    built where no handler would emit it)."""
    if log_would_emit(_tasks_logger, logging.INFO):
        _tasks_logger.info("Task id=%s path=%s state=%s", str(row.pk), plan.module_path, status)


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


class _Binder:
    """Checks stored arguments against a task function's signature, computed once.

    For the usual signatures (named parameters only: no positional-only parameter, no
    ``*args`` / ``**kwargs``) a few lookups prove that the arguments bind; anything not
    proven that way goes to ``Signature.bind``, which decides and words the error.
    """

    __slots__ = ("context", "fast", "kwonly", "names", "positional", "required", "signature")

    def __init__(self, func: Callable[..., Any], takes_context: bool) -> None:
        try:
            self.signature: inspect.Signature | None = inspect.signature(func)
        except (TypeError, ValueError):
            self.signature = None
        self.context: list[None] = [None] if takes_context else []
        self.fast = False
        if self.signature is None:
            return
        kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        params = list(self.signature.parameters.values())
        if not all(p.kind in kinds for p in params):
            return
        positional = [p for p in params if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
        if takes_context:
            if not positional:
                return
            params.remove(positional.pop(0))  # the context, bound first by position
        empty, kwonly = inspect.Parameter.empty, inspect.Parameter.KEYWORD_ONLY
        self.positional = tuple(p.name for p in positional)
        self.names = frozenset(p.name for p in params)
        # Positional parameters without a default come first (Python's own rule).
        self.required = sum(1 for p in positional if p.default is empty)
        self.kwonly = tuple(p.name for p in params if p.kind is kwonly and p.default is empty)
        self.fast = True

    def _fits(self, args: list[Any], kwargs: dict[str, Any]) -> bool:
        positional = self.positional
        n = len(args)
        if n > len(positional):
            return False
        if kwargs:
            if not self.names.issuperset(kwargs):
                return False
            for name in positional[:n]:
                if name in kwargs:
                    return False
        for i in range(n, self.required):
            if positional[i] not in kwargs:
                return False
        return not self.kwonly or all(name in kwargs for name in self.kwonly)

    def check(self, args: list[Any], kwargs: dict[str, Any]) -> None:
        """Raise ``TypeError`` (``Signature.bind``'s) if the arguments do not bind."""
        if self.signature is None or (self.fast and self._fits(args, kwargs)):
            return
        self.signature.bind(*self.context, *args, **kwargs)


class _Plan:
    """What running the Task stored under one path needs, resolved once per process:
    the Task, its function, whether it is a coroutine function, the signature check."""

    __slots__ = ("binder", "direct", "func", "is_async", "module_path", "takes_context", "template")

    def __init__(self, template: Task) -> None:
        self.template = template
        self.func = template.func
        self.module_path = template.module_path
        self.takes_context = bool(template.takes_context)
        self.is_async = inspect.iscoroutinefunction(self.func)
        # A Task class that overrides call() is called through it, on a Task per row.
        self.direct = type(template).call is Task.call
        self.binder = _Binder(self.func, self.takes_context)

    def task(self, row: QueuedTask) -> Task:
        """The Task of ``row`` (its priority, queue, backend and run_after)."""
        return _build_task(self.template, row)


#: One plan per task path (only paths that resolved to a Task: see ``import_task``).
_PLANS: dict[str, _Plan] = {}


def _plan(path: str) -> _Plan:
    plan = _PLANS.get(path)
    if plan is None:
        plan = _PLANS[path] = _Plan(import_task(path))  # raises TaskUnavailable
    return plan


def _decode(row: QueuedTask, plan: _Plan) -> tuple[list[Any], dict[str, Any]]:
    """The stored arguments, checked against the function's signature."""
    args, kwargs = row.args, row.kwargs
    if not isinstance(args, list):
        raise ArgumentsUndecodable(
            f"stored positional arguments of {row.task_path} are not a JSON array: {args!r:.200}"
        )
    if not isinstance(kwargs, dict) or (kwargs and not all(isinstance(k, str) for k in kwargs)):
        raise ArgumentsUndecodable(
            f"stored keyword arguments of {row.task_path} are not a JSON object: {kwargs!r:.200}"
        )
    try:
        plan.binder.check(args, kwargs)
    except TypeError as exc:
        raise ArgumentsUndecodable(
            f"stored arguments do not match {row.task_path}{plan.binder.signature}: {exc}"
        ) from exc
    return args, kwargs


def _storable(value: Any) -> Any:
    """``value`` as it will be stored (JSON-normalised, as Django's ``TaskResult``
    normalises it); ``TypeError`` / ``ValueError`` if it cannot be stored as JSON. A
    plain ``str``, ``int``, ``bool``, finite ``float`` or ``None`` is taken as is."""
    kind = type(value)
    if (
        value is None
        or kind is int
        or kind is str
        or kind is bool
        or (kind is float and math.isfinite(value))
    ):
        return value
    value = normalize_json(value)
    json.dumps(value, allow_nan=False)
    return value


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
    first = row.started_at  # None before the first attempt
    began = _db_clock(row._state.db or "default", time.monotonic())
    row.__dict__[_ATTEMPT] = (first, began, bool(lost))
    row.last_attempted_at = began
    row.started_at = first or began


#: Set by :func:`_start` on the row: (``started_at`` before this attempt, this attempt's
#: start on the database clock, whether the attempt added errors of lost attempts).
_ATTEMPT = "_taskclaim_attempt"


def _attempt(row: QueuedTask) -> tuple[datetime | None, datetime, bool]:
    found = row.__dict__.get(_ATTEMPT)
    if found is None:  # not started by _start(): the attempt begins now
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
    clock, never the worker's wall clock)."""
    reading = _CLOCK.get(using)
    if reading is None or time.monotonic() - reading[1] > CLOCK_READING_TTL:
        from django_taskclaim.monitoring import db_now

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


def _success_fields(row: QueuedTask, value: Any) -> dict[str, Any]:
    """What a successful attempt writes: the return value, the worker ids and the
    timestamps — and only when they changed, the errors (lost attempts found at this
    claim) and ``attempt_open`` (a row an older version left open)."""
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


def _finish_failed(row: QueuedTask, exc: BaseException, *, permanent: bool) -> str:
    """Record a failed attempt: retry with backoff, or FAILED once out of attempts."""
    fields = {**_attempt_fields(row), "errors": _errors(row, error_entry(exc, type(exc)))}
    delay: float | None = None
    if isinstance(exc, Retry) and exc.delay is not None:
        wanted = exc.delay
        delay = wanted.total_seconds() if isinstance(wanted, timedelta) else float(wanted)
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


def _started(row: QueuedTask, plan: _Plan) -> TaskResult | None:
    """Announce the attempt: ``task_started`` with a ``TaskResult`` when a receiver
    other than Django's own logging one is connected, else just Django's log line.
    Returns the ``TaskResult`` if one was built (always for a task that takes a
    context: it is the context's ``task_result``)."""
    sender = _sender(row.backend_name)
    who = audience(task_started, sender)
    result = None
    if who == RECEIVERS or plan.takes_context:
        result = to_result(row, task=plan.task(row))
    if who == RECEIVERS:
        task_started.send(sender, task_result=result)
    elif who == DJANGO_LOG_ONLY:
        _log_state(row, plan, TaskResultStatus.RUNNING)
    return result


def _finished(row: QueuedTask, plan: _Plan) -> None:
    """Called once the successful result is written: ``task_finished`` (or only
    Django's log line, as for :func:`_started`)."""
    sender = _sender(row.backend_name)
    who = audience(task_finished, sender)
    if who == RECEIVERS:
        task_finished.send(sender, task_result=to_result(row, task=plan.task(row)))
    elif who == DJANGO_LOG_ONLY:
        _log_state(row, plan, TaskResultStatus.SUCCESSFUL)


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
    running again. Django's ``task_started`` / ``task_finished`` signals are sent to
    every receiver connected when they fire; when Django's own logging receivers are
    the only ones, their log line is written without building a ``TaskResult``.
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
    try:
        plan = _plan(row.task_path)
        args, kwargs = _decode(row, plan)
    except (TaskUnavailable, ArgumentsUndecodable) as exc:
        task_started.send(_sender(row.backend_name), task_result=to_result(row))
        return _finish_failed(row, exc, permanent=True)
    result = _started(row, plan)
    try:
        if plan.takes_context:
            args = [TaskContext(task_result=cast(TaskResult, result)), *args]
        if not plan.direct:
            value = (result.task if result is not None else plan.task(row)).call(*args, **kwargs)
        elif plan.is_async:
            value = async_to_sync(plan.func)(*args, **kwargs)
        else:
            value = plan.func(*args, **kwargs)
    except Fail as exc:
        return _finish_failed(row, exc, permanent=True)
    except Exception as exc:
        return _finish_failed(row, exc, permanent=False)
    try:
        value = _storable(value)
    except (TypeError, ValueError) as exc:
        error = ReturnValueNotSerializable(
            f"{row.task_path} returned a value that cannot be stored as JSON: {exc}"
        )
        error.__cause__ = exc
        return _finish_failed(row, error, permanent=True)
    # Written by the worker with other completions in one fenced UPDATE (or at once when
    # run outside a worker); ``task_finished`` is sent once it is.
    return BatchableResult(_success_fields(row, value), on_written=partial(_finished, row, plan))
