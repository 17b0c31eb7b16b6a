"""Workflows through ``django.tasks``: what Django's Tasks API cannot say, as a documented
extension of this backend (docs/workflows.md, "Through django.tasks").

- **Dependencies**: ``my_task.after(*prerequisites, on_failure="cancel").enqueue(...)``
  (:meth:`~django_taskclaim.contrib.tasks.backend.ClaimTask.after`) stores a task that
  waits for other tasks (their ``TaskResult``) or rows of any claimable model with
  ``ClaimMeta.dependents``; a fan-in is a task enqueued ``after`` its members.
- **Inside a task body** run by a worker of this backend, the functions below work on
  the task's own row: :func:`step` / :func:`completed_steps` / :func:`forget_steps`
  (durable steps), :func:`wait_for_event` (park until an event), ``raise Snooze(delay)``
  (durable sleep), :func:`fan_in` and :func:`prerequisite_results` (a callback's
  members). Async bodies use :func:`astep` and :func:`await_event`.

The running row is held in a context variable set by the runner for the length of the
body (:func:`running`); a call outside one raises :class:`~.exceptions.NotInTaskBody`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from asgiref.sync import sync_to_async
from django.db import models
from django.tasks import TaskResult

from django_taskclaim.contrib.tasks.backend import prerequisite_rows
from django_taskclaim.contrib.tasks.exceptions import NotInTaskBody
from django_taskclaim.settle import dependents

if TYPE_CHECKING:
    from django_taskclaim.contrib.tasks.models import QueuedTask

#: The ``QueuedTask`` row whose body runs in this context (set by :func:`running`).
_RUNNING: ContextVar[QueuedTask | None] = ContextVar("taskclaim_running_task", default=None)


@contextmanager
def running(row: QueuedTask) -> Iterator[None]:
    """Make ``row`` the running task's row for the body run inside this block."""
    token = _RUNNING.set(row)
    try:
        yield
    finally:
        _RUNNING.reset(token)


def current_row(what: str = "this call") -> QueuedTask:
    """The ``QueuedTask`` row of the task body running here; :class:`NotInTaskBody`
    (naming ``what``) outside one."""
    row = _RUNNING.get()
    if row is None:
        raise NotInTaskBody(
            f"{what} works inside a task body run by a TaskClaimBackend worker "
            "(manage.py worker taskclaim_tasks.QueuedTask); there is no running task here"
        )
    return row


# -- inside a task body -------------------------------------------------------------------
def step(name: str, fn: Callable[[], Any]) -> Any:
    """The durable step ``name`` of the running task: its stored result when an earlier
    attempt completed it (``fn`` not called), else ``fn()`` run in a fenced transaction
    with its result stored in that same transaction (exactly once for its database
    writes, at least once for effects outside the database). See the core's
    ``task.step()``; a holder that lost its claim gets ``ClaimLost`` and commits nothing."""
    return current_row("step()").step(name, fn)


def completed_steps() -> dict[str, Any]:
    """``{name: stored result}`` of the running task's completed steps."""
    return current_row("completed_steps()").completed_steps()


def forget_steps() -> int:
    """Delete the running task's stored steps (the next attempt runs them all again);
    returns how many were deleted."""
    return int(current_row("forget_steps()").forget_steps())


def wait_for_event(name: str, timeout: float | timedelta) -> Any:
    """The payload of the event ``name`` (``emit()``): at once when emitted already;
    otherwise the running task is parked until the event or ``timeout`` and this raises
    ``Parked`` (let it propagate: the worker frees the slot, the attempt is not counted,
    ``task_finished`` is not sent), and the task's next run gets the payload — or
    ``EventTimeout`` past the deadline, the body's to catch."""
    return current_row("wait_for_event()").wait_for_event(name, timeout)


async def astep(name: str, fn: Callable[[], Any]) -> Any:
    """:func:`step` for an async task body; ``fn`` is a plain (sync) function, run in the
    worker's thread with the task's database connection."""
    return await sync_to_async(step)(name, fn)


async def await_event(name: str, timeout: float | timedelta) -> Any:
    """:func:`wait_for_event` for an async task body."""
    return await sync_to_async(wait_for_event)(name, timeout)


def _row_of(result: TaskResult | None, what: str) -> models.Model:
    if result is None:
        return current_row(what)
    (row,) = prerequisite_rows([result])
    return row


def fan_in(result: TaskResult | None = None) -> dependents.FanIn | None:
    """The fan-in counts of the running task (or of the task of ``result``): how many of
    its prerequisites are open and how many ended done, failed or cancelled, one indexed
    read; ``None`` for a task that waits for nothing."""
    return dependents.fan_in(_row_of(result, "fan_in()"))


def prerequisite_results(
    result: TaskResult | None = None, outcome: str | None = None
) -> list[TaskResult]:
    """The ``TaskResult`` of each task the running task (or the task of ``result``)
    waited for, with their return values and errors, in the order of their ids (the
    order they were enqueued: ids are time-ordered);
    with ``outcome`` (``"done"``, ``"failed"``, ``"cancelled"``, ``""`` for still open),
    only those that ended so. Prerequisites that are rows of other models are left out
    (``django_taskclaim.prerequisites()`` lists every edge)."""
    from django_taskclaim.contrib.tasks.results import to_result  # deferred: models

    row = _row_of(result, "prerequisite_results()")
    model = type(row)
    edges = dependents.prerequisites(row, outcome).filter(
        prerequisite_model=dependents.label_of(model)
    )
    keys = list(edges.values_list("prerequisite_pk", flat=True))
    using = row._state.db or "default"
    found: dict[str, Any] = {}
    for i in range(0, len(keys), dependents.CHUNK):
        for member in model._base_manager.using(using).filter(
            pk__in=keys[i : i + dependents.CHUNK]
        ):
            found[dependents.key_of(member.pk)] = member
    return [to_result(found[key]) for key in keys if key in found]
