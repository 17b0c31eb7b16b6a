"""Batched completions: many claimed rows made ``done`` with one fenced UPDATE.

:func:`complete_many` writes a chunk of claimed tasks per model and database, each row
only if it still carries its claim token (the guarantee of
:func:`~django_taskclaim.settle.outcome.complete`). A handler's :class:`BatchableResult` waits
on its task instance (:data:`PENDING_ATTR`) until that write, which carries each row's
own result fields (:func:`~django_taskclaim.settle.outcome.complete_pending` writes one such
task on its own). The single-row transitions live in :mod:`django_taskclaim.settle.outcome`,
which re-exports :func:`complete_many`, :class:`BatchableResult` and :data:`PENDING_ATTR`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from functools import partial
from typing import Any, cast

from django.db import connections, models
from django.db.models import F
from django.db.models.expressions import Combinable, RawSQL

from django_taskclaim import signals
from django_taskclaim.backends import for_alias, for_connection
from django_taskclaim.claim.resets import Change, apply_in_memory, plan, writes
from django_taskclaim.config.options import ClaimOptions, get_options
from django_taskclaim.row.claimable import Claimable
from django_taskclaim.rules import held_many_q
from django_taskclaim.settle.batch_json import complete_many_in_one
from django_taskclaim.settle.dependents import settle_and_release
from django_taskclaim.settle.writes import _db, check_fields

#: The lifecycle's logger: a lost claim is logged under one name, batched or not.
logger = logging.getLogger("django_taskclaim.settle.outcome")

COMPLETE_MANY_CHUNK = 500

#: Attribute holding a deferred completion's result fields and callback on a task
#: instance, between :func:`~django_taskclaim.settle.outcome.run_task` (with ``defer``) and
#: :func:`complete_many`.
PENDING_ATTR = "_taskclaim_pending"


class BatchableResult(dict[str, Any]):
    """Result fields a handler lets the worker write together with other completions.

    A handler's returned mapping is normally written at once, in the completion's own
    fenced UPDATE. Returned as a ``BatchableResult``, the fields may wait in the worker's
    acknowledgement window (``--ack-window``) and be written with other tasks' results
    in one fenced UPDATE by :func:`complete_many` — the same at-least-once contract as a
    handler that returns nothing. Only plain values are batched: a result holding an
    ORM expression is written at once, on its own. ``on_written`` (if given) is called
    once the fields are written (for instance to send a "finished" signal).
    """

    def __init__(
        self, fields: Mapping[str, Any], *, on_written: Callable[[], None] | None = None
    ) -> None:
        super().__init__(fields)
        self.on_written = on_written


#: What a task that deferred no result fields carries.
_NO_RESULT: tuple[dict[str, Any], Callable[[], None] | None] = ({}, None)


def _pending(task: Claimable) -> tuple[dict[str, Any], Callable[[], None] | None]:
    """The deferred result fields and callback of ``task`` (kept until written: a write
    retried after a lost connection must carry them again)."""
    fields, after = task.__dict__.get(PENDING_ATTR) or ({}, None)
    return dict(fields), after


def complete_many(tasks: Iterable[Any]) -> list[Any]:
    """Complete many claimed tasks with one fenced UPDATE per model and database.

    Each row is written only if it still carries the claim token its instance holds
    (``pk = ? AND version = ?`` for every task, ``status = processing``) — the same
    guarantee as :func:`~django_taskclaim.settle.outcome.complete`. Result fields deferred by
    :func:`~django_taskclaim.settle.outcome.run_task` (a :class:`BatchableResult`) are written
    in the same statement, each row its own values. Returns the tasks whose claim was lost
    (nothing was written for them); the others are ``done`` with their instances updated,
    and ``task_completed`` is sent for each. A deferred result field naming the primary
    key or the claim bookkeeping is refused (``ValueError``) before any row is written.
    """
    groups: dict[tuple[type[models.Model], str], list[Any]] = {}
    checked: set[tuple[type[models.Model], frozenset[str]]] = set()
    for task in tasks:
        if task.__dict__.get(PENDING_ATTR):  # result fields: refused before any write
            names = frozenset(_pending(task)[0])
            if names and (type(task), names) not in checked:
                check_fields(get_options(task), task, dict.fromkeys(names))
                checked.add((type(task), names))
        groups.setdefault((type(task), _db(task)), []).append(task)
    lost: list[Any] = []
    for (model, using), group in groups.items():
        for i in range(0, len(group), COMPLETE_MANY_CHUNK):
            lost.extend(_complete_chunk(model, using, group[i : i + COMPLETE_MANY_CHUNK]))
    return lost


def _complete_chunk(model: type[models.Model], using: str, tasks: list[Any]) -> list[Any]:
    """Complete one chunk of ``model``'s tasks on ``using`` in one fenced UPDATE; return
    the tasks whose claim was lost. Steps: write (:func:`_chunk_writer`), tell the won
    from the lost (:func:`_won`), then update the won instances (:func:`_mark_done`)."""
    opts = get_options(model)
    tokens = {t.pk: t.version for t in tasks}
    if len(tokens) != len(tasks):
        raise ValueError("complete_many() got the same row twice")
    # Result fields and callbacks of the tasks that deferred some (most defer none).
    pending = {t.pk: _pending(t) for t in tasks if t.__dict__.get(PENDING_ATTR)}
    write = _chunk_writer(model, using, opts, tasks, tokens, pending)

    def write_and_tell() -> list[Any]:
        hit = write()
        # the usual: every row written; else the won are told from the lost
        return tasks if hit == len(tasks) else _won(model, using, opts, tasks, tokens)

    won = settle_and_release(
        model,
        using,
        write_and_tell,
        lambda done: ([t.pk for t in done], "done"),
        what=f"complete {len(tasks)} {opts.label}",
    )
    won_ids = {id(t) for t in won}
    lost = [t for t in tasks if id(t) not in won_ids]
    for task in tasks:
        task.__dict__.pop(PENDING_ATTR, None)  # written, or lost for good
    for task in lost:
        logger.warning(
            "claim lost model=%s pk=%s token=%s write=done: nothing was written",
            opts.label,
            task.pk,
            task.version,
        )
    _mark_done(model, opts, won, pending)
    return lost


def _chunk_writer(
    model: type[models.Model],
    using: str,
    opts: ClaimOptions,
    tasks: list[Any],
    tokens: dict[Any, int],
    pending: dict[Any, tuple[dict[str, Any], Callable[[], None] | None]],
) -> Callable[[], int]:
    """The chunk's one fenced UPDATE, as a function returning how many rows it wrote:
    from per-row arrays where the vendor can and every task carries the same result
    fields (the usual: one handler), else an ORM UPDATE with per-row ``CASE`` values."""
    # Deferred result fields: plain values, checked by run_task when it deferred them.
    if not pending and for_alias(using).completes_from_arrays:  # no result fields at all
        return partial(complete_many_in_one, model, using, opts, tokens, None)
    results = {pk: pending.get(pk, _NO_RESULT)[0] for pk in tokens}
    if (
        for_alias(using).completes_from_arrays
        and len({tuple(sorted(f)) for f in results.values()}) == 1
    ):
        return partial(complete_many_in_one, model, using, opts, tokens, results)
    values: dict[str, Any] = {
        opts.status_field: opts.value("done"),
        "version": F("version") + 1,
        "locked_until": None,
        **writes(opts, Change.COMPLETE),
    }
    values.update(_per_row_values(model, tasks, results, using))
    target = model._base_manager.using(using).filter(held_many_q(opts, tokens, using))
    return partial(target.update, **values)


def _won(
    model: type[models.Model],
    using: str,
    opts: ClaimOptions,
    tasks: list[Any],
    tokens: dict[Any, int],
) -> list[Any]:
    """The tasks a chunk's write completed, when it wrote fewer rows than it had: every
    write to a claimed row bumps its token, so a row this write completed is exactly one
    that is now done at token + 1."""
    now = dict(
        model._base_manager.using(using)
        .filter(pk__in=list(tokens))
        .filter(opts.status_q("done"))
        .values_list("pk", "version")
    )
    return [t for t in tasks if now.get(t.pk) == t.version + 1]


def _mark_done(
    model: type[models.Model],
    opts: ClaimOptions,
    won: list[Any],
    pending: dict[Any, tuple[dict[str, Any], Callable[[], None] | None]],
) -> None:
    """Update the instances of the completed tasks as the write left their rows (a
    database-side value is dropped: loaded on access), send ``task_completed`` for each
    and call its deferred callback."""
    done_value = opts.value("done")
    optional = plan(opts, Change.COMPLETE)
    attnames: dict[str, str] = {}
    send = signals.task_completed.has_listeners(model)
    for task in won:
        setattr(task, opts.status_field, done_value)
        task.version += 1
        task.locked_until = None
        if optional:  # finished_at: the database clock's, loaded on access
            apply_in_memory(task, optional)
        if not pending:
            if send:
                signals.task_completed.send(sender=model, task=task)
            continue
        fields, after = pending.get(task.pk, _NO_RESULT)
        for name, value in fields.items():
            attname = attnames.get(name)
            if attname is None:
                attname = attnames[name] = getattr(model._meta.get_field(name), "attname", name)
            if isinstance(value, Combinable | models.Expression):
                task.__dict__.pop(attname, None)
            else:
                setattr(task, attname, value)
        signals.task_completed.send(sender=model, task=task)
        if after is not None:
            after()


def _per_row_values(
    model: type[models.Model],
    tasks: list[Any],
    fields: dict[Any, dict[str, Any]],
    using: str,
) -> dict[str, RawSQL]:
    """``field = CASE pk WHEN … THEN <that row's value> … ELSE field END`` for every
    result field some task of the chunk carries: one statement, each row its own values.
    Values are plain (see :class:`BatchableResult`), prepared by their field."""
    names = sorted({name for f in fields.values() for name in f})
    connection = connections[using]
    qn = connection.ops.quote_name
    table = qn(model._meta.db_table)
    pk_field = cast(models.Field, model._meta.pk)
    pk_column = ".".join((table, qn(str(pk_field.column))))
    backend = for_connection(connection)
    out: dict[str, RawSQL] = {}
    for name in names:
        field = cast(models.Field, model._meta.get_field(name))
        branches = [
            (
                pk_field.get_db_prep_value(task.pk, connection),
                field.get_db_prep_save(fields[task.pk][name], connection),
            )
            for task in tasks
            if name in fields[task.pk]
        ]
        column = ".".join((table, qn(str(field.column))))
        sql, params = backend.value_per_row(pk_column, column, branches)
        out[name] = RawSQL(sql, params, output_field=field)
    return out
