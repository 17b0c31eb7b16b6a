"""The fenced lifecycle of a claimed row, and ``run_task`` which drives one attempt.

Every write here is an ``UPDATE … WHERE pk = %s AND version = <claimed token> AND
status = processing``: a worker that lost its claim writes nothing and gets
:class:`~django_taskclaim.exceptions.ClaimLost`. The outcome rules of an attempt
(:func:`attempt`, :func:`settle`) live here too. Batched completions are in
:mod:`django_taskclaim.completion`; :func:`complete_many`, :class:`BatchableResult` and
:data:`PENDING_ATTR` are importable from here as well.
"""

from __future__ import annotations

import inspect
import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from enum import StrEnum
from typing import Any

from asgiref.sync import async_to_sync
from django.db import models, transaction
from django.db.models import F
from django.db.models.expressions import Combinable

from . import bounds, signals
from .completion import COMPLETE_MANY_CHUNK as COMPLETE_MANY_CHUNK
from .completion import PENDING_ATTR, BatchableResult, _pending
from .completion import complete_many as complete_many
from .db import DbNow, retry_transient
from .exceptions import ClaimLost, ConfigurationError, Fail, Retry
from .options import get_options
from .strategies import validate_lease
from .types import Claimable, model_of
from .writes import MAX_ERROR_CHARS as MAX_ERROR_CHARS
from .writes import _check_fields, _db, format_error

logger = logging.getLogger("django_taskclaim.lifecycle")


class Outcome(StrEnum):
    """What became of one attempt (:func:`settle`, :func:`run_task`, the worker's log).

    A ``str`` enum: ``outcome == "done"`` still holds, and it logs as its value.
    """

    #: completed: the row is ``done`` (its result fields written with it)
    DONE = "done"
    #: to be retried: the row is ``ready`` again, after its backoff or ``Retry`` delay
    READY = "ready"
    #: failed for good: ``Fail``, or ``max_attempts`` claims were made
    FAILED = "failed"
    #: the body cancelled the row itself
    CANCELLED = "cancelled"
    #: the body left the row ``processing`` under another token, or the claim was taken
    #: back: nothing was written over the new holder
    LOST = "lost"
    #: a completion handed to the caller's ``defer`` (written later, in a batch)
    DEFERRED = "deferred"
    #: the worker could not record the outcome (the lease will bring the row back)
    ERROR = "error"
    #: the worker stopped while the outcome write was failing (as ``ERROR``)
    ABANDONED = "abandoned"
    #: the body left the row in a status no logical state maps to
    UNKNOWN = "unknown"


def _fenced_update(
    task: Claimable, to_state: str, updates: dict[str, Any], *, bump: bool = True
) -> None:
    opts = get_options(task)
    using = _db(task)
    values = dict(updates)
    if to_state:
        values[opts.status_field] = opts.value(to_state)
    if bump:
        values["version"] = F("version") + 1
    qs = (
        model_of(task)
        ._base_manager.using(using)
        .filter(pk=task.pk, version=task.version)
        .filter(opts.status_q("processing"))
    )
    hit = retry_transient(
        lambda: qs.update(**values), using, what=f"{to_state or 'lease'} {opts.label}"
    )
    if hit != 1:
        logger.warning(
            "claim lost model=%s pk=%s token=%s write=%s: nothing was written",
            opts.label,
            task.pk,
            task.version,
            to_state or "extend_lease",
        )
        raise ClaimLost(
            f"{opts.label} pk={task.pk}: claim token {task.version} is no longer current "
            f"(lease expired and reaped, re-claimed, or changed by someone else); "
            f"the {to_state or 'lease'} write affected nothing",
            task=task,
        )
    for name, value in values.items():
        attname = getattr(task._meta.get_field(name), "attname", name)
        if name == "version":
            task.version += 1
        elif isinstance(value, Combinable | models.Expression):
            task.__dict__.pop(attname, None)  # deferred: loaded on next access
        else:
            setattr(task, attname, value)


def complete(task: Claimable, **fields: Any) -> None:
    """``processing`` → ``done``; ``fields`` saved in the same fenced UPDATE."""
    opts = get_options(task)
    _check_fields(opts, task, fields)
    updates: dict[str, Any] = {"locked_until": None, **fields}
    if opts.has("finished_at"):
        updates["finished_at"] = DbNow()
    _fenced_update(task, "done", updates)
    signals.task_completed.send(sender=type(task), task=task)


def complete_pending(task: Claimable) -> None:
    """Complete one deferred task on its own, with the result fields it was deferred
    with (the fallback when a batched write cannot be used)."""
    fields, after = _pending(task)
    try:
        complete(task, **fields)
    except ClaimLost:
        task.__dict__.pop(PENDING_ATTR, None)
        raise
    task.__dict__.pop(PENDING_ATTR, None)
    if after is not None:
        after()


_complete_task = complete


def fail(task: Claimable, error: BaseException | str = "", **fields: Any) -> None:
    """``processing`` → ``failed`` (dead letter), recording ``error``."""
    opts = get_options(task)
    _check_fields(opts, task, fields)
    updates: dict[str, Any] = {"locked_until": None, **fields}
    if opts.has("finished_at"):
        updates["finished_at"] = DbNow()
    if opts.has("last_error"):
        updates["last_error"] = format_error(error or "failed")
    _fenced_update(task, "failed", updates)
    signals.task_failed.send(sender=type(task), task=task, error=error, final=True)


def retry(
    task: Claimable,
    *,
    delay: float | timedelta | None = None,
    error: BaseException | str = "",
    **fields: Any,
) -> Outcome:
    """``processing`` → ``ready`` after ``delay`` (or ``failed`` once attempts run out)."""
    opts = get_options(task)
    _check_fields(opts, task, fields)
    seconds: float | None = None
    if delay is not None:
        seconds = bounds.number(
            delay, "retry delay", bounds.RETRY_DELAY, seconds=True, error=ValueError
        )
    updates: dict[str, Any] = {"locked_until": None, **fields}
    if opts.has("last_error") and error:
        updates["last_error"] = format_error(error)
    if task.attempts >= opts.max_attempts:
        if opts.has("finished_at"):
            updates["finished_at"] = DbNow()
        if opts.has("last_error"):
            updates["last_error"] = (
                f"gave up after {task.attempts} attempt(s) (max_attempts={opts.max_attempts})"
                + (f"\n{format_error(error)}" if error else "")
            )
        _fenced_update(task, "failed", updates)
        signals.task_failed.send(sender=type(task), task=task, error=error, final=True)
        return Outcome.FAILED
    wait = opts.backoff(task.attempts) if seconds is None else seconds
    if opts.has("run_after"):
        updates["run_after"] = DbNow() + timedelta(seconds=wait) if wait > 0 else None
    _fenced_update(task, "ready", updates)
    signals.task_failed.send(sender=type(task), task=task, error=error, final=False)
    return Outcome.READY


def release(task: Claimable) -> None:
    """``processing`` → ``ready`` at once; the attempt is not counted."""
    _fenced_update(task, "ready", {"locked_until": None, "attempts": F("attempts") - 1})


def extend_lease(task: Claimable, seconds: float | timedelta | None = None) -> None:
    """Move the lease end to ``now() + seconds`` (database clock). Token unchanged."""
    opts = get_options(task)
    lease = validate_lease(opts.lease if seconds is None else seconds)
    _fenced_update(task, "", {"locked_until": DbNow() + timedelta(seconds=lease)}, bump=False)


@contextmanager
def fenced(task: Claimable, *, using: str | None = None, complete: bool = False) -> Iterator[None]:
    """Transaction that re-checks and locks the claim first; see ``ClaimableMixin.fenced``.

    With ``complete=True``, leaving the block normally completes the task inside the same
    transaction (unless the block already finished it). If the block raises, everything
    rolls back and the task's in-memory state is put back as it was on entry.
    """
    opts = get_options(task)
    using = using or _db(task)
    saved = dict(task.__dict__)
    try:
        with transaction.atomic(using=using):
            # A no-op UPDATE both re-checks the token and takes the row's write lock
            # (on SQLite, the database write lock) until this transaction ends.
            hit = (
                model_of(task)
                ._base_manager.using(using)
                .filter(pk=task.pk, version=task.version)
                .filter(opts.status_q("processing"))
                .update(locked_until=F("locked_until"))
            )
            if hit != 1:
                raise ClaimLost(
                    f"{opts.label} pk={task.pk}: claim token {task.version} is no longer "
                    "current; the fenced block did not run",
                    task=task,
                )
            yield
            if complete and opts.state_of(getattr(task, opts.status_field)) == "processing":
                _complete_task(task)  # ``complete`` is the flag's name here
    except BaseException:
        # Rolled back: nothing the block wrote (a complete() included) happened.
        task.__dict__.clear()
        task.__dict__.update(saved)
        raise


def _run_atomic(task: Claimable, handler: Callable[[Any], Any]) -> Any:
    """``ClaimMeta.atomic``: the handler and the completion (with the result fields it
    returns) in one fenced transaction. Raises whatever the handler raised, after the
    rollback; a result the model cannot store rolls back too (``ValueError``)."""
    opts = get_options(task)
    with fenced(task):
        if inspect.iscoroutinefunction(handler):
            result = async_to_sync(handler)(task)
        else:
            result = handler(task)
        if opts.state_of(getattr(task, opts.status_field)) == "processing":
            fields = dict(result) if isinstance(result, Mapping) else {}
            _check_fields(opts, task, fields)
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
    task: Claimable, handler: Callable[[Any], Any], *, catch_base_exceptions: bool = False
) -> Attempt:
    """Run the body once; never raises an ``Exception`` of the body (it is returned).

    ``ClaimMeta.atomic`` models run body and completion in one fenced transaction (a
    database error there means neither landed). With ``catch_base_exceptions`` (the
    worker), a ``BaseException`` of the body becomes a :class:`TaskAborted` failure
    instead of ending the calling thread."""
    opts = get_options(task)
    try:
        if opts.atomic:
            return Attempt(result=_run_atomic(task, handler))
        if inspect.iscoroutinefunction(handler):
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
    if isinstance(error, ClaimLost):
        return Outcome.LOST
    if error is None:
        state = opts.state_of(getattr(task, opts.status_field))
        if state != "processing":
            return Outcome(state) if state else Outcome.UNKNOWN  # the body finished it
        result = done.result
        fields = dict(result) if isinstance(result, Mapping) else {}
        batchable = isinstance(result, BatchableResult) and not any(
            isinstance(v, Combinable | models.Expression) for v in fields.values()
        )
        try:
            _check_fields(opts, task, fields)
        except ValueError as exc:  # the body returned fields the model cannot store
            error = exc
        else:
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
    try:
        if isinstance(error, Fail):
            fail(task, error.reason)
            return Outcome.FAILED
        if isinstance(error, Retry):
            return retry(task, delay=error.delay, error=error.reason or "retry requested")
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


def cancel_flag(task: Claimable) -> threading.Event:
    """The ``threading.Event`` set once the claim of ``task`` is known to be lost
    (cancelled, released by an operator, reaped and taken by another worker). The same
    object for the life of the instance; created on first use."""
    flag = task.__dict__.get(CANCEL_ATTR)
    if flag is None:
        flag = task.__dict__.setdefault(CANCEL_ATTR, threading.Event())
    return flag


def claim_held(task: Claimable) -> bool:
    """Whether the claim of ``task`` is still current: its row is ``processing`` under
    the token the instance carries. One ``SELECT``; writes nothing."""
    opts = get_options(task)
    return (
        model_of(task)
        ._base_manager.using(_db(task))
        .filter(pk=task.pk, version=task.version)
        .filter(opts.status_q("processing"))
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
