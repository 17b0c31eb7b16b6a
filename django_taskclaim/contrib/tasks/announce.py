"""Django's task signals and log lines for the attempts a worker runs.

Who would hear ``task_started`` / ``task_finished`` sent for a backend now
(:func:`audience`), whether a log record would reach a handler that prints it
(:func:`log_would_emit`), and the announcements of one attempt: :func:`started`,
:func:`finished` (a success, once its result is written), :func:`started_unresolved`
(a task whose function or arguments could not be resolved) and :func:`failed_for_good`.
Every ``TaskResult`` the worker builds for a signal or a task's context is built here.
"""

from __future__ import annotations

import logging
import operator
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import Signal, receiver
from django.tasks import TaskResult, TaskResultStatus, task_backends
from django.tasks.exceptions import InvalidTaskBackend
from django.tasks.signals import log_task_finished, log_task_started, task_finished, task_started
from django.utils.log import RequireDebugFalse, RequireDebugTrue

from django_taskclaim.contrib.tasks.backend import TaskClaimBackend
from django_taskclaim.contrib.tasks.results import to_result

if TYPE_CHECKING:
    from django_taskclaim.contrib.tasks.calling import Plan
    from django_taskclaim.contrib.tasks.models import QueuedTask


def backend_for(alias: str) -> TaskClaimBackend | None:
    """The ``TaskClaimBackend`` configured under ``alias`` now, or ``None`` (the alias
    was removed from ``TASKS`` or names another kind of backend)."""
    try:
        backend = task_backends[alias]
    except InvalidTaskBackend:
        return None
    return backend if isinstance(backend, TaskClaimBackend) else None


#: The signal sender (the backend's class) of each backend alias; forgotten when the
#: ``TASKS`` setting changes.
_SENDERS: dict[str, type] = {}


def sender(alias: str) -> type:
    """The sender of the task signals of ``alias``: its backend's class (the base class
    when the alias is no longer configured)."""
    found = _SENDERS.get(alias)
    if found is None:
        backend = backend_for(alias)
        found = _SENDERS[alias] = type(backend) if backend is not None else TaskClaimBackend
    return found


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


def _log_state(row: QueuedTask, plan: Plan, status: TaskResultStatus) -> None:
    """The line Django's ``log_task_started`` / ``log_task_finished`` would write (not
    built where no handler would emit it)."""
    if log_would_emit(_tasks_logger, logging.INFO):
        _tasks_logger.info("Task id=%s path=%s state=%s", str(row.pk), plan.module_path, status)


def started(row: QueuedTask, plan: Plan) -> TaskResult | None:
    """Announce the attempt: ``task_started`` with a ``TaskResult`` when a receiver
    other than Django's own logging one is connected, else just Django's log line.
    Returns the ``TaskResult`` if one was built (always for a task that takes a
    context: it is the context's ``task_result``)."""
    by = sender(row.backend_name)
    who = audience(task_started, by)
    result = None
    if who == RECEIVERS or plan.takes_context:
        result = to_result(row, task=plan.task(row))
    if who == RECEIVERS:
        task_started.send(by, task_result=result)
    elif who == DJANGO_LOG_ONLY:
        _log_state(row, plan, TaskResultStatus.RUNNING)
    return result


def started_unresolved(row: QueuedTask) -> None:
    """``task_started`` for an attempt whose task path or arguments do not resolve
    (its ``TaskResult`` carries a placeholder Task when the path does not import)."""
    task_started.send(sender(row.backend_name), task_result=to_result(row))


def finished(row: QueuedTask, plan: Plan) -> None:
    """Called once the successful result is written: ``task_finished`` (or only
    Django's log line, as for :func:`started`)."""
    by = sender(row.backend_name)
    who = audience(task_finished, by)
    if who == RECEIVERS:
        task_finished.send(by, task_result=to_result(row, task=plan.task(row)))
    elif who == DJANGO_LOG_ONLY:
        _log_state(row, plan, TaskResultStatus.SUCCESSFUL)


def failed_for_good(row: QueuedTask) -> None:
    """Called once the row is written FAILED for good: ``task_finished`` with its
    ``TaskResult`` (not sent for an attempt that will be retried)."""
    task_finished.send(sender(row.backend_name), task_result=to_result(row))
