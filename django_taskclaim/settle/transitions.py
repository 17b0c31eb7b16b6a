"""The fenced single-row transitions of a claimed row, and what became of an attempt.

Every write here is an ``UPDATE … WHERE pk = %s AND version = <claimed token> AND
status = processing``: a worker that lost its claim writes nothing and gets
:class:`~django_taskclaim.exceptions.ClaimLost`. :func:`complete`, :func:`fail`,
:func:`retry`, :func:`release` and :func:`give_back` (one transition: one row, or the
worker's many unstarted rows at once) and :func:`extend_lease` are the transitions;
:func:`fenced` is a transaction that re-checks and locks the claim first;
:class:`Outcome` names what became of one attempt. The public names here are importable
from :mod:`django_taskclaim.settle.outcome`, which also runs the attempts.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from datetime import timedelta
from enum import StrEnum
from typing import Any

from django.db import DatabaseError, models, transaction
from django.db.models import F
from django.db.models.expressions import Combinable

from django_taskclaim import signals
from django_taskclaim.claim import validate_lease
from django_taskclaim.claim.resets import Change, writes
from django_taskclaim.config import bounds
from django_taskclaim.config.claim_meta import CLAIM_STATE_FIELDS, SLOT_FIELD
from django_taskclaim.config.options import ClaimOptions, get_options
from django_taskclaim.config.settings import taskclaim_settings
from django_taskclaim.db import DbNow, in_user_atomic, is_transient, retry_transient
from django_taskclaim.exceptions import ClaimLost, ConfigurationError
from django_taskclaim.row.claimable import Claimable, model_of
from django_taskclaim.row.status import TERMINAL_STATES
from django_taskclaim.rules import held_q
from django_taskclaim.settle.batch import PENDING_ATTR, _pending
from django_taskclaim.settle.dependents import settle_and_release
from django_taskclaim.settle.writes import _db, check_fields, format_error

#: The lifecycle's logger: a lost claim is logged under one name, whichever write lost it.
logger = logging.getLogger("django_taskclaim.settle.outcome")


class Outcome(StrEnum):
    """What became of one attempt (:func:`~django_taskclaim.settle.outcome.settle`,
    :func:`~django_taskclaim.settle.outcome.run_task`, the worker's log).

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


def _held(
    model: type[models.Model], opts: ClaimOptions, using: str, tasks: list[Any]
) -> models.QuerySet:
    """The rows of ``tasks`` still held under the claim tokens their instances carry: the
    fence of every write here (:func:`~django_taskclaim.rules.held_q`)."""
    return model._base_manager.using(using).filter(
        held_q(opts, ((task.pk, task.version) for task in tasks), using)
    )


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
    qs = _held(model_of(task), opts, using, [task])
    hit = settle_and_release(
        model_of(task),
        using,
        lambda: qs.update(**values),
        lambda n: ([task.pk] if n == 1 and to_state in TERMINAL_STATES else [], to_state),
        what=f"{to_state or 'lease'} {opts.label}",
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
    """``processing`` → ``done``; ``fields`` saved in the same fenced UPDATE.

    ``fields`` naming the primary key or the claim bookkeeping (status, token, lease,
    holder, attempts, ``finished_at``, ``last_error``) are refused with ``ValueError``
    before anything is written."""
    opts = get_options(task)
    check_fields(opts, task, fields)
    updates = {"locked_until": None, **fields, **writes(opts, Change.COMPLETE)}
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
    check_fields(opts, task, fields)
    text = format_error(error or "failed")
    updates = {"locked_until": None, **fields, **writes(opts, Change.FAIL, error=text)}
    _fenced_update(task, "failed", updates)
    signals.task_failed.send(sender=type(task), task=task, error=error, final=True)


#: The attribute of an instance that :func:`retry` made ready again: seconds until the
#: next attempt may start (for log lines).
RETRY_IN_ATTR = "_taskclaim_retry_in"


def retry(
    task: Claimable,
    *,
    delay: float | timedelta | None = None,
    error: BaseException | str = "",
    **fields: Any,
) -> Outcome:
    """``processing`` → ``ready`` after ``delay`` (or ``failed`` once attempts run out)."""
    opts = get_options(task)
    check_fields(opts, task, fields)
    seconds: float | None = None
    if delay is not None:
        seconds = bounds.number(
            delay, "retry delay", bounds.RETRY_DELAY, seconds=True, error=ValueError
        )
    updates: dict[str, Any] = {"locked_until": None, **fields}
    if task.attempts >= opts.max_attempts:
        text = f"gave up after {task.attempts} attempt(s) (max_attempts={opts.max_attempts})" + (
            f"\n{format_error(error)}" if error else ""
        )
        updates.update(writes(opts, Change.GIVE_UP, error=text))
        _fenced_update(task, "failed", updates)
        signals.task_failed.send(sender=type(task), task=task, error=error, final=True)
        return Outcome.FAILED
    wait = opts.backoff(task.attempts) if seconds is None else seconds
    why = format_error(error) if error else None  # no error: last_error is kept
    updates.update(writes(opts, Change.RETRY, error=why, delay=wait))
    _fenced_update(task, "ready", updates)
    task.__dict__[RETRY_IN_ATTR] = wait if opts.has("run_after") else 0.0
    signals.task_failed.send(sender=type(task), task=task, error=error, final=False)
    return Outcome.READY


def _given_back(opts: ClaimOptions, *, keep_mark: bool) -> dict[str, Any]:
    """The one give-back transition, :func:`release` and :func:`give_back`: ``ready`` at
    once, the attempt not counted (the token moves on with the fenced write). With
    ``keep_mark``, ``locked_until`` is left as it is (a row recovered from a lost holder
    stays marked recovered); without, it is cleared."""
    values: dict[str, Any] = {} if keep_mark else {"locked_until": None}
    values["attempts"] = F("attempts") - 1
    values.update(writes(opts, Change.GIVE_BACK))
    return values


def require_run_after(opts: ClaimOptions, what: str) -> None:
    """``ConfigurationError`` unless ``opts``'s model has ``run_after``: a row of it cannot
    ``what`` without a due time."""
    if not opts.has("run_after"):
        raise ConfigurationError(
            f"{opts.label} has no run_after field, so a row cannot {what}: add "
            "ScheduleFieldsMixin (or a run_after field)"
        )


#: The shortest wait of a snoozed row, in seconds: a ``Snooze`` of less (``Snooze(0)``)
#: is due this long after it was raised, so that a body that snoozes on every run cannot
#: spin its worker (see docs/lifecycle.md, "Coming back later").
SNOOZE_FLOOR = 1.0


def snooze(
    task: Claimable, delay: float | timedelta = 0.0, *, floor: float = SNOOZE_FLOOR
) -> Outcome:
    """``processing`` → ``ready``, due after ``delay`` (database clock) but not before
    ``floor`` seconds (:data:`SNOOZE_FLOOR`; a park of ``wait_for_event()`` passes
    ``0``: its next run ends the wait, it cannot loop); the attempt not counted, no error
    recorded, the row's steps kept, its place in line moved to the due time (see
    :data:`~django_taskclaim.claim.resets.RESETS`). The model must have ``run_after``
    (``ConfigurationError`` otherwise, nothing written)."""
    opts = get_options(task)
    require_run_after(opts, "be parked until later (Snooze)")
    seconds = max(
        floor,
        bounds.number(delay, "snooze delay", bounds.RETRY_DELAY, seconds=True, error=ValueError),
    )
    updates: dict[str, Any] = {"locked_until": None, "attempts": F("attempts") - 1}
    updates.update(writes(opts, Change.SNOOZE, delay=seconds))
    _fenced_update(task, "ready", updates)
    task.__dict__[RETRY_IN_ATTR] = seconds
    return Outcome.READY


def release(task: Claimable) -> None:
    """``processing`` → ``ready`` at once; the attempt is not counted, the lease cleared."""
    _fenced_update(task, "ready", _given_back(get_options(task), keep_mark=False))


def give_back(model: type[models.Model], tasks: list[Any], using: str) -> int:
    """``processing`` → ``ready`` at once for claimed-but-unstarted rows of ``model``, in
    one fenced UPDATE: :func:`release` of many rows, except that ``locked_until`` is left
    as it is (a row recovered from a lost holder stays marked recovered). A row this
    claim no longer holds is left as it is; returns how many were given back. Database
    errors are the caller's (the worker logs them: the leases will expire)."""
    opts = get_options(model)
    values = {opts.status_field: opts.value("ready"), "version": F("version") + 1}
    values.update(_given_back(opts, keep_mark=True))
    return int(_held(model, opts, using, tasks).update(**values))


def extend_lease(task: Claimable, seconds: float | timedelta | None = None) -> None:
    """Move the lease end to ``now() + seconds`` (database clock). Token unchanged."""
    opts = get_options(task)
    lease = validate_lease(opts.lease if seconds is None else seconds)
    _fenced_update(task, "", {"locked_until": DbNow() + timedelta(seconds=lease)}, bump=False)


#: Claim fields the library itself moves while a fenced block runs (``extend_lease()``):
#: never compared, and overwritten by the completion anyway.
_MOVED_IN_BLOCKS = frozenset({"locked_until"})


def _field_values(task: Claimable) -> dict[str, Any]:
    """The loaded values of the concrete fields of ``task`` by attribute name, copied so
    that a value changed in place (a JSON dict) still compares as changed."""
    values: dict[str, Any] = {}
    for field in task._meta.concrete_fields:
        if field.attname in task.__dict__:
            value = task.__dict__[field.attname]
            try:
                values[field.attname] = copy.deepcopy(value)
            except Exception:  # not copyable (a memoryview): compared by value
                values[field.attname] = value
    return values


def _changed_fields(task: Claimable, opts: ClaimOptions, before: dict[str, Any]) -> dict[str, Any]:
    """The fields a ``fenced(complete=True)`` block changed on ``task``, to be written
    with its completion. A changed primary key or claim field is refused (``ValueError``):
    the completion would move the row or undo the library's bookkeeping."""
    bookkeeping = CLAIM_STATE_FIELDS | {opts.status_field, SLOT_FIELD}
    changed: dict[str, Any] = {}
    for field in task._meta.concrete_fields:
        name = field.attname
        if name not in task.__dict__ or getattr(field, "generated", False):
            continue
        value = task.__dict__[name]
        claim_field = field.name in bookkeeping
        if claim_field and name not in before:
            continue  # loaded in the block (refresh_from_db): the database's own value
        if name in before and _same(before[name], value):
            continue
        if field.primary_key or claim_field:
            if field.name in _MOVED_IN_BLOCKS:
                continue
            what = "its primary key" if not claim_field else "claim bookkeeping"
            raise ValueError(
                f"{opts.label}: the fenced(complete=True) block changed {field.name!r} "
                f"({what}); a completion writes only result fields, so nothing was written"
            )
        changed[name] = value
    return changed


def _same(old: Any, new: Any) -> bool:
    try:
        return bool(old is new or old == new)
    except Exception:  # an uncomparable value: treat as changed
        return False


def _lock_claim(task: Claimable, opts: ClaimOptions, using: str) -> transaction.Atomic:
    """Open the fenced block's transaction and take the claimed row's write lock (on
    SQLite, the database's), re-checking the token; the open ``Atomic`` is returned
    (with the claim held) or closed again (and ``ClaimLost`` or the error raised)."""
    atomic = transaction.atomic(using=using)
    atomic.__enter__()
    try:
        # A no-op UPDATE both re-checks the token and takes the row's write lock
        # (on SQLite, the database write lock) until this transaction ends.
        hit = _held(model_of(task), opts, using, [task]).update(locked_until=F("locked_until"))
        if hit != 1:
            raise ClaimLost(
                f"{opts.label} pk={task.pk}: claim token {task.version} is no longer "
                "current; the fenced block did not run",
                task=task,
            )
    except BaseException as exc:
        atomic.__exit__(type(exc), exc, exc.__traceback__)
        raise
    return atomic


@contextmanager
def fenced(task: Claimable, *, using: str | None = None, complete: bool = False) -> Iterator[None]:
    """Transaction that re-checks and locks the claim first; see ``ClaimableMixin.fenced``.

    Taking the lock is retried while the database is busy (SQLite's "database is locked",
    a deadlock), up to ``TASKCLAIM_DB_RETRIES`` times, each try waiting up to the
    database's own lock timeout (SQLite: the ``timeout`` option); after that, or inside
    an outer ``atomic()`` block (no retry), the error is raised, saying so.

    With ``complete=True``, leaving the block normally completes the task inside the same
    transaction (unless the block already finished it), writing with it the fields of
    the task the block changed; a changed primary key or claim field is refused
    (``ValueError``, nothing written). If the block raises, everything rolls back and the
    task's in-memory state is put back as it was on entry.
    """
    opts = get_options(task)
    using = using or _db(task)
    saved = dict(task.__dict__)
    before = _field_values(task) if complete else {}
    try:
        try:
            atomic = retry_transient(
                lambda: _lock_claim(task, opts, using), using, what=f"fenced {opts.label}"
            )
        except DatabaseError as exc:
            if not is_transient(exc, using):
                raise
            if in_user_atomic(using):
                how = "not retried inside an outer atomic() block"
            else:
                tries = int(taskclaim_settings.DB_RETRIES) + 1
                how = f"gave up after {tries} tries (TASKCLAIM_DB_RETRIES)"
            raise type(exc)(
                f"{opts.label} pk={task.pk}: fenced() could not lock the claimed row, the "
                f"database stayed busy ({exc}); {how}"
            ) from exc
        with ExitStack() as stack:
            stack.push(atomic)  # commits when the block ends, rolls back if it raises
            yield
            if complete and opts.state_of(getattr(task, opts.status_field)) == "processing":
                # ``complete`` is the flag's name here
                _complete_task(task, **_changed_fields(task, opts, before))
    except BaseException:
        # Rolled back: nothing the block wrote (a complete() included) happened.
        task.__dict__.clear()
        task.__dict__.update(saved)
        raise
