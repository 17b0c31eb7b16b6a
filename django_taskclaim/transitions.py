"""The fenced single-row transitions of a claimed row, and what became of an attempt.

Every write here is an ``UPDATE … WHERE pk = %s AND version = <claimed token> AND
status = processing``: a worker that lost its claim writes nothing and gets
:class:`~django_taskclaim.exceptions.ClaimLost`. :func:`complete`, :func:`fail`,
:func:`retry`, :func:`release` and :func:`extend_lease` are the transitions;
:func:`fenced` is a transaction that re-checks and locks the claim first;
:class:`Outcome` names what became of one attempt. The public names here are importable
from :mod:`django_taskclaim.lifecycle`, which also runs the attempts.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from enum import StrEnum
from typing import Any

from django.db import models, transaction
from django.db.models import F
from django.db.models.expressions import Combinable

from . import bounds, signals
from .completion import PENDING_ATTR, _pending
from .db import DbNow, retry_transient
from .exceptions import ClaimLost
from .options import get_options
from .strategies import status_recheck, validate_lease
from .types import Claimable, model_of
from .writes import _check_fields, _db, format_error

#: The lifecycle's logger: a lost claim is logged under one name, whichever write lost it.
logger = logging.getLogger("django_taskclaim.lifecycle")


class Outcome(StrEnum):
    """What became of one attempt (:func:`~django_taskclaim.lifecycle.settle`,
    :func:`~django_taskclaim.lifecycle.run_task`, the worker's log).

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
        .filter(status_recheck(opts, "processing", using))
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
                .filter(status_recheck(opts, "processing", using))
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
