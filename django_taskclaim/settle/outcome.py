"""The fenced lifecycle of a claimed row, and ``run_task`` which drives one attempt.

Every write of a claimed row is an ``UPDATE … WHERE pk = %s AND version = <claimed
token> AND status = processing``: a worker that lost its claim writes nothing and gets
:class:`~django_taskclaim.exceptions.ClaimLost`. This module holds the outcome rules of
an attempt (:func:`attempt`, :func:`settle`, :func:`run_task`) and the cancellation
flag a body reads (:func:`cancel_requested`). The single-row transitions
(:func:`complete`, :func:`fail`, :func:`retry`, :func:`release`, :func:`extend_lease`,
:func:`fenced`) and :class:`Outcome` are in :mod:`django_taskclaim.settle.transitions`, the
batched completions in :mod:`django_taskclaim.settle.batch` (import them from there).
"""

from __future__ import annotations

import inspect
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from asgiref.sync import async_to_sync
from django.db import models
from django.db.models.expressions import Combinable

from django_taskclaim.config.options import ClaimOptions, get_options
from django_taskclaim.exceptions import (
    ClaimLost,
    ConfigurationError,
    Fail,
    Parked,
    Retry,
    Snooze,
)
from django_taskclaim.row.claimable import Claimable, model_of
from django_taskclaim.rules import held_q
from django_taskclaim.settle.batch import PENDING_ATTR, BatchableResult
from django_taskclaim.settle.deadline import deadline_error, overdue
from django_taskclaim.settle.transitions import (
    RETRY_IN_ATTR,
    Outcome,
    complete,
    fail,
    fenced,
    retry,
    snooze,
)
from django_taskclaim.settle.writes import _db, check_fields

logger = logging.getLogger("django_taskclaim.settle.outcome")


def _run_atomic(task: Claimable, handler: Callable[[Any], Any]) -> Any:
    """``ClaimMeta.atomic``: the handler and the completion (with the result fields it
    returns) in one fenced transaction. Raises whatever the handler raised, after the
    rollback; a result the model cannot store rolls back too (``ValueError``), and so
    does a body that ran past its deadline (``TimeoutError``: :mod:`.deadline`)."""
    opts = get_options(task)
    with fenced(task):
        if inspect.iscoroutinefunction(handler):
            result = async_to_sync(handler)(task)
        else:
            result = handler(task)
        timeout = overdue(task)
        if timeout is not None:  # past its deadline: its writes roll back with it
            raise deadline_error(timeout)
        if opts.state_of(getattr(task, opts.status_field)) == "processing":
            fields = dict(result) if isinstance(result, Mapping) else {}
            check_fields(opts, task, fields)
            complete(task, **fields)
    return result


class TaskAborted(Exception):
    """A task body raised a ``BaseException`` that is not an ``Exception``
    (``SystemExit``, ``KeyboardInterrupt``, ``GeneratorExit``, ``CancelledError``). In a
    worker that is the task's failure (retried with backoff; the original is chained in
    ``last_error``), never the end of the thread or of the process."""


@dataclass
class Attempt:
    """What one run of a task body did: its ``result``, or the ``error`` it raised.

    The input of :func:`settle`. Kept by the caller so that an outcome write cut by a
    lost connection can be made again, unchanged, once the database is back (every
    write is fenced, so a repeat of one that had landed writes nothing)."""

    result: Any = None
    error: BaseException | None = None


def attempt(
    task: Claimable,
    handler: Callable[[Any], Any],
    *,
    catch_base_exceptions: bool = False,
    sync: bool = False,
) -> Attempt:
    """Run the body once; never raises an ``Exception`` of the body (it is returned).

    ``ClaimMeta.atomic`` models run body and completion in one fenced transaction (a
    database error there means neither landed). With ``catch_base_exceptions`` (the
    worker), a ``BaseException`` of the body becomes a :class:`TaskAborted` failure
    instead of ending the calling thread. ``sync``: the caller knows ``handler`` is no
    coroutine function (it is not inspected again)."""
    opts = get_options(task)
    try:
        if opts.atomic:
            return Attempt(result=_run_atomic(task, handler))
        if not sync and inspect.iscoroutinefunction(handler):
            return Attempt(result=async_to_sync(handler)(task))
        return Attempt(result=handler(task))
    except Exception as exc:
        return Attempt(error=exc)
    except BaseException as exc:
        if not catch_base_exceptions:
            raise
        aborted = TaskAborted(
            f"the task raised {type(exc).__name__}"
            + (f"({exc})" if str(exc) else "")
            + ": it is treated as the task's failure"
        )
        aborted.__cause__ = exc
        return Attempt(error=aborted)


def settle(
    task: Claimable, done: Attempt, *, defer: Callable[[Any], None] | None = None
) -> Outcome:
    """Record the outcome of one attempt; return it. The one place outcome rules live.

    A result completes the row (a returned mapping is saved as result fields in the
    same fenced UPDATE) unless the body finished the row itself; ``Retry`` → ready again
    after its delay; ``Fail`` → failed for good; any other error → retried with
    exponential backoff and jitter, ``failed`` once ``max_attempts`` claims were made;
    ``ClaimLost`` → ``"lost"``, nothing written over the new holder. Outcomes: ``done``,
    ``ready`` (retry), ``failed``, ``lost``, ``deferred``, or the state the body left the
    row in. A ``DatabaseError`` of the outcome write propagates: call again with the
    same ``done`` once the connection is back.

    With ``defer``, a result without fields (or a :class:`BatchableResult`) is not
    written here: ``defer(task)`` is called and ``"deferred"`` returned; the caller
    completes it later (:func:`complete_many`, batching acknowledgements).
    """
    opts = get_options(task)
    error = done.error
    if (  # the usual: no error, nothing returned: deferred unless the body finished it
        error is None
        and done.result is None
        and defer is not None
        and opts.state_of(getattr(task, opts.status_field)) == "processing"
    ):
        defer(task)
        return Outcome.DEFERRED
    if isinstance(error, ClaimLost):
        return Outcome.LOST
    if error is None:
        state = opts.state_of(getattr(task, opts.status_field))
        if state != "processing":
            return Outcome(state) if state else Outcome.UNKNOWN  # the body finished it
        completed = _complete(task, opts, done.result, defer)
        if isinstance(completed, Outcome):
            return completed
        error = completed  # the body returned fields the model cannot store
    return _record_error(task, opts, error)


def _complete(
    task: Claimable, opts: ClaimOptions, result: Any, defer: Callable[[Any], None] | None
) -> Outcome | ValueError:
    """:func:`settle` of a result: complete the row with the fields it returned, or hand
    it to ``defer`` (no fields, or a :class:`BatchableResult` of plain values). Returns
    the outcome, or the ``ValueError`` of fields the model cannot store (nothing
    written)."""
    fields = {} if result is None else dict(result) if isinstance(result, Mapping) else {}
    batchable = isinstance(result, BatchableResult) and not any(
        isinstance(v, Combinable | models.Expression) for v in fields.values()
    )
    try:
        check_fields(opts, task, fields)
    except ValueError as exc:
        return exc
    if defer is not None and (batchable or not fields):
        if batchable:
            task.__dict__[PENDING_ATTR] = (fields, result.on_written)
        defer(task)
        return Outcome.DEFERRED
    try:
        task.complete(**fields)
    except ClaimLost:
        return Outcome.LOST
    if isinstance(result, BatchableResult) and result.on_written is not None:
        result.on_written()
    return Outcome.DONE


def _record_error(task: Claimable, opts: ClaimOptions, error: BaseException) -> Outcome:
    """:func:`settle` of an error: ``Fail`` → failed for good; ``Retry`` → ready after
    its delay; ``Snooze`` → ready after its delay, the attempt not counted; any other
    error → retried with backoff (failed once the attempts are used up); a claim lost
    meanwhile → ``"lost"``."""
    try:
        if isinstance(error, Fail):
            fail(task, error.reason)
            return Outcome.FAILED
        if isinstance(error, Retry):
            return retry(task, delay=error.delay, error=error.reason or "retry requested")
        if isinstance(error, Parked):  # wait_for_event() parked the row itself
            task.__dict__[RETRY_IN_ATTR] = error.delay
            return Outcome.READY
        if isinstance(error, Snooze):
            if opts.has("run_after"):
                return snooze(task, error.delay)
            return retry(
                task,
                error=f"Snooze: {opts.label} has no run_after field, so a row cannot be "
                "parked until later (add ScheduleFieldsMixin); retried as an error",
            )
        logger.info(
            "task raised model=%s pk=%s attempt=%s error=%r",
            opts.label,
            task.pk,
            task.attempts,
            error,
        )
        return retry(task, error=error)
    except ClaimLost:
        return Outcome.LOST


def run_task(
    task: Claimable,
    handler: Callable[[Any], Any] | None = None,
    *,
    defer: Callable[[Any], None] | None = None,
) -> Outcome:
    """Run one attempt of a claimed task and record its outcome; return the outcome.

    The handler (default: the model's ``ClaimMeta.handler``) gets the row; the outcome
    follows :func:`settle`'s rules (result → done, ``Retry``, ``Fail``, other errors
    retried with backoff until ``max_attempts``, a lost claim → ``"lost"``, never
    overwriting the new holder). A ``BaseException`` of the handler propagates.
    ``defer``: see :func:`settle`.
    """
    opts = get_options(task)
    if handler is None:
        handler = opts.handler()
        if handler is None:
            raise ConfigurationError(
                f"{opts.label} has no processing entry point: define a process(self) "
                "method or set ClaimMeta.handler"
            )
    return settle(task, attempt(task, handler), defer=defer)


# -- cancellation: the body learns that its claim was taken back --------------------------
#: The attribute of a claimed instance that holds its cancellation flag.
CANCEL_ATTR = "_taskclaim_cancel"


_FLAG_LOCK = threading.Lock()


class CancelFlag(threading.Event):
    """A ``threading.Event`` whose lock and condition are made on first use: most flags
    are only ever asked ``is_set()``, and a worker makes one per task (the condition
    cost a tenth of the worker's own time per no-op job). Otherwise an ``Event``."""

    def __init__(self) -> None:  # no super().__init__(): the condition comes on demand
        self._flag = False

    @property
    def _cond(self) -> threading.Condition:
        cond = self.__dict__.get("_lazy_cond")
        if cond is None:
            with _FLAG_LOCK:  # two threads asking at once get the same condition
                cond = self.__dict__.get("_lazy_cond")
                if cond is None:
                    cond = self.__dict__["_lazy_cond"] = threading.Condition(threading.Lock())
        return cond


def cancel_flag(task: Claimable) -> threading.Event:
    """The ``threading.Event`` set once the claim of ``task`` is known to be lost
    (cancelled, released by an operator, reaped and taken by another worker). The same
    object for the life of the instance; created on first use."""
    flag = task.__dict__.get(CANCEL_ATTR)
    if flag is None:
        flag = task.__dict__.setdefault(CANCEL_ATTR, CancelFlag())
    return flag


def claim_held(task: Claimable) -> bool:
    """Whether the claim of ``task`` is still current: its row is ``processing`` under
    the token the instance carries. One ``SELECT``; writes nothing."""
    opts = get_options(task)
    return (
        model_of(task)
        ._base_manager.using(_db(task))
        .filter(held_q(opts, [(task.pk, task.version)]))
        .exists()
    )


def cancel_requested(task: Claimable, *, check: bool = False) -> bool:
    """Whether the claim of ``task`` is known to be lost, so its body should stop.

    In a worker the heartbeat sets the flag (:func:`cancel_flag`) when it finds the
    claim taken back: no query here. With ``check=True`` the database is asked as
    well (:func:`claim_held`, one ``SELECT``) and a lost claim sets the flag. Once
    ``True``, it stays ``True``; every later fenced write of the instance is refused."""
    flag = cancel_flag(task)
    if flag.is_set():
        return True
    if check and not claim_held(task):
        flag.set()
        return True
    return False
