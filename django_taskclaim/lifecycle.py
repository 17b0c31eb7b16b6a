"""The fenced lifecycle of a claimed row, and ``run_task`` which drives one attempt.

Every write here is an ``UPDATE … WHERE pk = %s AND version = <claimed token> AND
status = processing``: a worker that lost its claim writes nothing and gets
:class:`~django_taskclaim.exceptions.ClaimLost`.
"""

from __future__ import annotations

import inspect
import logging
import traceback
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

from asgiref.sync import async_to_sync
from django.db import connections, models, router, transaction
from django.db.models import F
from django.db.models.expressions import Combinable, RawSQL
from django.db.models.functions import Now

from . import signals
from .db import retry_transient
from .exceptions import ClaimLost, ConfigurationError, Fail, Retry
from .options import CLAIM_STATE_FIELDS, ClaimOptions, get_options

logger = logging.getLogger("django_taskclaim.lifecycle")

MAX_ERROR_CHARS = 10_000


def format_error(error: BaseException | str) -> str:
    """Text stored in ``last_error``: the traceback of an exception, or the string."""
    if isinstance(error, BaseException):
        text = "".join(traceback.format_exception(error)).strip()
    else:
        text = str(error)
    if len(text) > MAX_ERROR_CHARS:
        text = text[: MAX_ERROR_CHARS // 2] + "\n…\n" + text[-MAX_ERROR_CHARS // 2 :]
    return text


def _db(task: models.Model) -> str:
    return task._state.db or router.db_for_write(type(task), instance=task)


def _check_fields(opts: ClaimOptions, task: models.Model, fields: Mapping[str, Any]) -> None:
    protected = CLAIM_STATE_FIELDS | {opts.status_field}
    for name in fields:
        if name in protected:
            raise ValueError(f"{name!r} is claim bookkeeping; the lifecycle methods set it")
        try:
            task._meta.get_field(name)
        except Exception:
            raise ValueError(f"{opts.label} has no field {name!r}") from None


def _fenced_update(task: Any, to_state: str, updates: dict[str, Any], *, bump: bool = True) -> None:
    opts = get_options(task)
    using = _db(task)
    values = dict(updates)
    if to_state:
        values[opts.status_field] = opts.value(to_state)
    if bump:
        values["version"] = F("version") + 1
    qs = (
        type(task)
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
        attname = task._meta.get_field(name).attname
        if name == "version":
            task.version += 1
        elif isinstance(value, Combinable | models.Expression):
            task.__dict__.pop(attname, None)  # deferred: loaded on next access
        else:
            setattr(task, attname, value)


def complete(task: Any, **fields: Any) -> None:
    """``processing`` → ``done``; ``fields`` saved in the same fenced UPDATE."""
    opts = get_options(task)
    _check_fields(opts, task, fields)
    updates: dict[str, Any] = {"locked_until": None, **fields}
    if opts.has("finished_at"):
        updates["finished_at"] = Now()
    _fenced_update(task, "done", updates)
    signals.task_completed.send(sender=type(task), task=task)


COMPLETE_MANY_CHUNK = 500


def complete_many(tasks: Iterable[Any]) -> list[Any]:
    """Complete many claimed tasks with one fenced UPDATE per model and database.

    Each row is written only if it still carries the claim token its instance holds
    (``pk = ? AND version = ?`` for every task, ``status = processing``) — the same
    guarantee as :func:`complete`, without the result fields. Returns the tasks whose
    claim was lost (nothing was written for them); the others are ``done`` with their
    instances updated, and ``task_completed`` is sent for each.
    """
    groups: dict[tuple[type[models.Model], str], list[Any]] = {}
    for task in tasks:
        groups.setdefault((type(task), _db(task)), []).append(task)
    lost: list[Any] = []
    for (model, using), group in groups.items():
        for i in range(0, len(group), COMPLETE_MANY_CHUNK):
            lost.extend(_complete_chunk(model, using, group[i : i + COMPLETE_MANY_CHUNK]))
    return lost


def _tokens_match(model: type[models.Model], using: str, tokens: dict[Any, int]) -> RawSQL:
    """``(pk, version) IN ((%s, %s), …)``: a row-value comparison (standard SQL, supported
    by PostgreSQL, MySQL/MariaDB and SQLite) that the ORM has no public way to say; it
    compiles once per batch instead of a hundred ``OR``-ed ``Q`` objects."""
    qn = connections[using].ops.quote_name
    table = qn(model._meta.db_table)
    pk_column = getattr(model._meta.pk, "column", None)
    version_column = getattr(model._meta.get_field("version"), "column", None)
    if not pk_column or not version_column:
        raise ConfigurationError(f"{model._meta.label} needs concrete pk and version columns")
    pk = f"{table}.{qn(pk_column)}"
    version = f"{table}.{qn(version_column)}"
    pairs = ", ".join(["(%s, %s)"] * len(tokens))
    params = [value for pair in tokens.items() for value in pair]
    return RawSQL(f"({pk}, {version}) IN ({pairs})", params, output_field=models.BooleanField())


def _complete_chunk(model: type[models.Model], using: str, tasks: list[Any]) -> list[Any]:
    opts = get_options(model)
    values: dict[str, Any] = {
        opts.status_field: opts.value("done"),
        "version": F("version") + 1,
        "locked_until": None,
    }
    if opts.has("finished_at"):
        values["finished_at"] = Now()
    tokens = {t.pk: t.version for t in tasks}
    if len(tokens) != len(tasks):
        raise ValueError("complete_many() got the same row twice")
    base = model._base_manager.using(using)
    if connections[using].vendor == "postgresql":
        from .strategies import pg_complete_many

        def write() -> int:
            return pg_complete_many(model, using, opts, tokens)
    else:
        target = (
            base.filter(pk__in=list(tokens))
            .filter(_tokens_match(model, using, tokens))
            .filter(opts.status_q("processing"))
        )

        def write() -> int:
            return target.update(**values)

    hit = retry_transient(write, using, what=f"complete {len(tasks)} {opts.label}")
    if hit == len(tasks):
        won = tasks
    else:
        # Some claims were lost. Every write to a claimed row bumps its token, so a row
        # this statement completed is exactly one that is now done at token + 1.
        now = dict(
            base.filter(pk__in=list(tokens))
            .filter(opts.status_q("done"))
            .values_list("pk", "version")
        )
        won = [t for t in tasks if now.get(t.pk) == t.version + 1]
    won_pks = {t.pk for t in won}
    lost = [t for t in tasks if t.pk not in won_pks]
    for task in lost:
        logger.warning(
            "claim lost model=%s pk=%s token=%s write=done: nothing was written",
            opts.label,
            task.pk,
            task.version,
        )
    done_value = opts.value("done")
    for task in won:
        setattr(task, opts.status_field, done_value)
        task.version += 1
        task.locked_until = None
        if opts.has("finished_at"):
            task.__dict__.pop("finished_at", None)  # the database clock's; loaded on access
        signals.task_completed.send(sender=model, task=task)
    return lost


def fail(task: Any, error: BaseException | str = "", **fields: Any) -> None:
    """``processing`` → ``failed`` (dead letter), recording ``error``."""
    opts = get_options(task)
    _check_fields(opts, task, fields)
    updates: dict[str, Any] = {"locked_until": None, **fields}
    if opts.has("finished_at"):
        updates["finished_at"] = Now()
    if opts.has("last_error"):
        updates["last_error"] = format_error(error or "failed")
    _fenced_update(task, "failed", updates)
    signals.task_failed.send(sender=type(task), task=task, error=error, final=True)


def retry(
    task: Any,
    *,
    delay: float | timedelta | None = None,
    error: BaseException | str = "",
    **fields: Any,
) -> str:
    """``processing`` → ``ready`` after ``delay`` (or ``failed`` once attempts run out)."""
    opts = get_options(task)
    _check_fields(opts, task, fields)
    if isinstance(delay, timedelta):
        delay = delay.total_seconds()
    if delay is not None and (
        isinstance(delay, bool) or not isinstance(delay, int | float) or delay < 0
    ):
        raise ValueError(f"retry delay must be >= 0 seconds, got {delay!r}")
    updates: dict[str, Any] = {"locked_until": None, **fields}
    if opts.has("last_error") and error:
        updates["last_error"] = format_error(error)
    if task.attempts >= opts.max_attempts:
        if opts.has("finished_at"):
            updates["finished_at"] = Now()
        if opts.has("last_error"):
            updates["last_error"] = (
                f"gave up after {task.attempts} attempt(s) (max_attempts={opts.max_attempts})"
                + (f"\n{format_error(error)}" if error else "")
            )
        _fenced_update(task, "failed", updates)
        signals.task_failed.send(sender=type(task), task=task, error=error, final=True)
        return "failed"
    wait = opts.backoff(task.attempts) if delay is None else float(delay)
    if opts.has("run_after"):
        updates["run_after"] = Now() + timedelta(seconds=wait) if wait > 0 else None
    _fenced_update(task, "ready", updates)
    signals.task_failed.send(sender=type(task), task=task, error=error, final=False)
    return "ready"


def release(task: Any) -> None:
    """``processing`` → ``ready`` at once; the attempt is not counted."""
    _fenced_update(task, "ready", {"locked_until": None, "attempts": F("attempts") - 1})


def extend_lease(task: Any, seconds: float | timedelta | None = None) -> None:
    """Move the lease end to ``now() + seconds`` (database clock). Token unchanged."""
    from .strategies import validate_lease

    opts = get_options(task)
    lease = validate_lease(opts.lease if seconds is None else seconds)
    _fenced_update(task, "", {"locked_until": Now() + timedelta(seconds=lease)}, bump=False)


@contextmanager
def fenced(task: Any, *, using: str | None = None) -> Iterator[None]:
    """Transaction that re-checks and locks the claim first; see ``ClaimableMixin.fenced``."""
    opts = get_options(task)
    using = using or _db(task)
    with transaction.atomic(using=using):
        # A no-op UPDATE both re-checks the token and takes the row's write lock
        # (on SQLite, the database write lock) until this transaction ends.
        hit = (
            type(task)
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


def run_task(
    task: Any,
    handler: Callable[[Any], Any] | None = None,
    *,
    defer: Callable[[Any], None] | None = None,
) -> str:
    """Run one attempt of a claimed task and record its outcome; return the outcome.

    The handler (default: the model's ``ClaimMeta.handler``) gets the row. Returning
    normally completes the task (a returned mapping is saved as result fields in the
    same fenced UPDATE) unless the handler already finished it itself. ``Retry`` →
    ready again after its delay; ``Fail`` → failed for good; any other exception →
    retried with exponential backoff and jitter, ``failed`` once ``max_attempts``
    claims were made. A lost claim is logged and reported as ``"lost"``; it never
    overwrites the new holder. Outcomes: ``done``, ``ready`` (retry), ``failed``,
    ``lost``, or the state the handler left the row in.

    With ``defer``, a handler that returns no result fields does not complete the row
    here: ``defer(task)`` is called instead and ``"deferred"`` returned, and the caller
    must complete it (e.g. with :func:`complete_many`, batching acknowledgements).
    """
    opts = get_options(task)
    if handler is None:
        handler = opts.handler()
        if handler is None:
            raise ConfigurationError(
                f"{opts.label} has no processing entry point: define a process(self) "
                "method or set ClaimMeta.handler"
            )
    outcome: tuple[str, float | None, BaseException | str]
    try:
        if inspect.iscoroutinefunction(handler):
            result = async_to_sync(handler)(task)
        else:
            result = handler(task)
    except ClaimLost:
        return "lost"
    except Retry as exc:
        outcome = ("retry", exc.delay, exc.reason or "retry requested")
    except Fail as exc:
        outcome = ("fail", None, exc.reason)
    except Exception as exc:
        logger.info(
            "task raised model=%s pk=%s attempt=%s error=%r",
            opts.label,
            task.pk,
            task.attempts,
            exc,
        )
        outcome = ("retry", None, exc)
    else:
        # Completion runs outside the handler's except clauses: a database error while
        # completing is the caller's to see, not a handler failure to retry.
        state = opts.state_of(getattr(task, opts.status_field))
        if state != "processing":
            return state or "unknown"  # the handler finished the row itself
        fields = dict(result) if isinstance(result, Mapping) else {}
        try:
            _check_fields(opts, task, fields)
        except ValueError as exc:  # the handler returned fields the model cannot store
            outcome = ("retry", None, exc)
        else:
            if defer is not None and not fields:
                defer(task)
                return "deferred"
            try:
                task.complete(**fields)
            except ClaimLost:
                return "lost"
            return "done"
    try:
        kind, delay, error = outcome
        if kind == "fail":
            fail(task, error)
            return "failed"
        return retry(task, delay=delay, error=error)
    except ClaimLost:
        return "lost"
