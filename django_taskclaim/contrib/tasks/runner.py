"""The handler the worker calls for each claimed ``QueuedTask`` row: one attempt of a Task.

:func:`execute` is ``QueuedTask.ClaimMeta.handler``. It opens the attempt, resolves and
calls the task function (:mod:`.calling`), announces it with Django's signals and log
lines (:mod:`.announce`) and records the outcome with the core's fenced lifecycle writes
(:mod:`.outcomes`), so a worker that lost its claim writes nothing. The names other code
imports from here are re-exported from those modules.
"""

from __future__ import annotations

from functools import partial

from django_taskclaim.contrib.tasks import announce
from django_taskclaim.contrib.tasks.announce import (
    DJANGO_LOG_ONLY,
    NOBODY,
    RECEIVERS,
    audience,
    log_would_emit,
)
from django_taskclaim.contrib.tasks.calling import Binder, Plan, decode, plan_for, storable
from django_taskclaim.contrib.tasks.exceptions import (
    ArgumentsUndecodable,
    ReturnValueNotSerializable,
    TaskUnavailable,
)
from django_taskclaim.contrib.tasks.models import QueuedTask
from django_taskclaim.contrib.tasks.outcomes import (
    MAX_ERRORS,
    backoff,
    error_entry,
    finish_failed,
    give_up,
    lost_attempts,
    success_fields,
)
from django_taskclaim.contrib.tasks.outcomes import start as _start
from django_taskclaim.contrib.tasks.results import to_result
from django_taskclaim.contrib.tasks.workflows import running
from django_taskclaim.exceptions import Fail, Snooze
from django_taskclaim.settle.batch import BatchableResult

#: Kept under the names they had before the runner was split.
_Binder = Binder
_Plan = Plan

__all__ = [
    "DJANGO_LOG_ONLY",
    "MAX_ERRORS",
    "NOBODY",
    "RECEIVERS",
    "audience",
    "backoff",
    "error_entry",
    "execute",
    "log_would_emit",
    "lost_attempts",
    "to_result",
]


def execute(row: QueuedTask) -> str | BatchableResult:
    """Run one attempt of the claimed Task row and record its outcome; return the state.

    Guarantees: every write is fenced on the claim token (a worker that lost the claim
    writes nothing); the return value is stored in the same fenced UPDATE that marks
    the row SUCCESSFUL; a task function that no longer imports, arguments that cannot
    be decoded or bound to its signature, and a return value that is not JSON end the
    task FAILED at once with a clear error (retrying could not help); any other
    exception — a ``BaseException`` such as ``SystemExit`` (``exit()``) or
    ``KeyboardInterrupt`` included, recorded under its own class path and traceback, as
    Django's backends record it — is retried with backoff until the row's
    ``max_attempts``, then the task ends FAILED; it never ends the worker. An attempt
    whose worker died is recorded as a ``WorkerLost`` error when the task is next
    claimed, and a task that used up its attempts that way ends FAILED without
    running again. Django's ``task_started`` / ``task_finished`` signals are sent to
    every receiver connected when they fire; when Django's own logging receivers are
    the only ones, their log line is written without building a ``TaskResult``.
    """
    lost = lost_attempts(row)
    if row.attempts > row.max_attempts:
        return give_up(row, lost)
    _start(row, lost)
    try:
        plan = plan_for(row.task_path)
        args, kwargs = decode(row, plan)
    except (TaskUnavailable, ArgumentsUndecodable) as exc:
        announce.started_unresolved(row)
        return finish_failed(row, exc, permanent=True)
    result = announce.started(row, plan)
    try:
        with running(row):  # step(), wait_for_event()… work on this row
            value = plan.call(row, args, kwargs, result)
    except Snooze:  # Snooze, or Parked by wait_for_event(): the worker parks the row
        raise
    except Fail as exc:
        return finish_failed(row, exc, permanent=True)
    except BaseException as exc:  # SystemExit, KeyboardInterrupt, exit(): the task's own
        return finish_failed(row, exc, permanent=False)
    try:
        value = storable(value)
    except (TypeError, ValueError) as exc:
        error = ReturnValueNotSerializable(
            f"{row.task_path} returned a value that cannot be stored as JSON: {exc}"
        )
        error.__cause__ = exc
        return finish_failed(row, error, permanent=True)
    # Written by the worker with other completions in one fenced UPDATE (or at once when
    # run outside a worker); ``task_finished`` is sent once it is.
    return BatchableResult(
        success_fields(row, value), on_written=partial(announce.finished, row, plan)
    )
