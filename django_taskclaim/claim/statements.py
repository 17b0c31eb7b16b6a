"""The one-statement claim and completion, built by the backends and run here.

Where the vendor can claim in one statement (``UPDATE … RETURNING``), the candidates
SELECT compiled by the ORM (kept per model, database, strategy and batch size) is handed
to the vendor's :meth:`~django_taskclaim.backends.base.DatabaseSQL.claim` and the
returned rows become model instances with the ORM's own converters
(:func:`_claim_returning`). A claim of at least ``claim_gate`` rows first takes its
turn at the table's claim gate, in the same round trip (:func:`claim_gate`,
:func:`fetch_claimed`). :func:`complete_many_in_one` is the completion counterpart:
a batch of claimed rows completed from per-row arrays in one fenced UPDATE.
"""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Callable
from datetime import date, datetime, time
from decimal import Decimal
from functools import partial
from typing import TYPE_CHECKING, Any, cast

from django.conf import settings
from django.db import connections, models, transaction

from django_taskclaim.backends import Statement, for_connection
from django_taskclaim.claim.base import RECOVERED_ATTR, _sort, candidates, claim_columns, column

if TYPE_CHECKING:
    from django_taskclaim.config.options import ClaimOptions


def compile_queryset(qs: models.QuerySet) -> tuple[str, tuple[Any, ...]]:
    sql, params = qs.query.get_compiler(using=qs.db).as_sql()
    return sql, tuple(params)


_COMPILED: dict[tuple[Any, ...], tuple[str, tuple[Any, ...]]] = {}
_COMPILED_MAX = 512


def _compiled_candidates(
    qs: models.QuerySet, opts: ClaimOptions, limit: int, cache_key: tuple[Any, ...] | None
) -> tuple[str, tuple[Any, ...]]:
    """The candidates SELECT compiled by the ORM; kept per ``cache_key`` and ``limit``.

    The SQL of an unfiltered claim depends only on the model, database, strategy and
    batch size (the clock is ``now()`` in the SQL, not a parameter), so a worker
    compiles it once instead of on every claim.
    """
    if cache_key is None:
        return compile_queryset(candidates(qs, opts, limit))
    key = (*cache_key, limit)
    hit = _COMPILED.get(key)
    if hit is None:
        if len(_COMPILED) >= _COMPILED_MAX:
            _COMPILED.clear()
        hit = _COMPILED[key] = compile_queryset(candidates(qs, opts, limit))
    return hit


_CONVERTERS: dict[tuple[type[models.Model], str], list[tuple[int, list[Any], Any]]] = {}


def _row_converters(model: type[models.Model], using: str) -> list[tuple[int, list[Any], Any]]:
    """Per column, the converters the ORM applies when it reads that field (as
    ``SQLCompiler.get_converters`` does): JSON decoding, booleans on some backends…"""
    key = (model, using)
    found = _CONVERTERS.get(key)
    if found is None:
        conn = connections[using]
        found = []
        for i, field in enumerate(model._meta.concrete_fields):
            col = field.get_col(model._meta.db_table)
            funcs = conn.ops.get_db_converters(col) + col.get_db_converters(conn)
            if funcs:
                found.append((i, funcs, col))
        _CONVERTERS[key] = found
    return found


def _instances(model: type[models.Model], using: str, rows: list[tuple[Any, ...]]) -> list[Any]:
    """Model instances from rows holding every concrete column in field order."""
    conn = connections[using]
    attnames = [f.attname for f in model._meta.concrete_fields]
    converters = _row_converters(model, using)
    out = []
    for row in rows:
        if converters:
            values = list(row)
            for i, funcs, col in converters:
                for func in funcs:
                    values[i] = func(values[i], col, conn)
            row = tuple(values)
        out.append(model.from_db(using, attnames, row))
    return out


def claim_gate(qs: models.QuerySet, opts: ClaimOptions, n: int) -> Statement | None:
    """The gate a claim of ``n`` rows of ``qs`` takes its turn at first, or ``None``: only
    a claim of at least ``opts.claim_gate`` rows, made outside any transaction (the gate
    is held until the claim's own transaction ends: never inside the caller's ``hold``
    transaction or the ``serializable`` strategy's), on a vendor that has a gate
    (:meth:`~django_taskclaim.backends.base.DatabaseSQL.claim_gate`)."""
    threshold = opts.claim_gate
    conn = connections[qs.db]
    if threshold is None or n < threshold or conn.in_atomic_block:
        return None
    return for_connection(conn).claim_gate(qs.model._meta.db_table)


def fetch_claimed(conn: Any, statement: Statement, gate: Statement | None) -> list[Any]:
    """Run a claim ``statement`` (after its ``gate``, when there is one) and return its rows.

    The gate and the claim go in one round trip, one transaction, where the driver
    takes several statements per call; else (psycopg 3 with server-side binding) in a
    transaction of two statements, whose gate statement bounds how long the transaction
    may wait idle for this client: frozen between the two, it loses its session (the
    claim raises, nothing was claimed) instead of holding the gate for everyone."""
    backend = for_connection(conn)
    if gate is None:
        with conn.cursor() as cursor:
            cursor.execute(statement.sql, statement.params)
            return list(cursor.fetchall())
    if backend.several_statements(conn.settings_dict):
        with conn.cursor() as cursor:
            return backend.fetch_after(cursor, gate, statement)
    with transaction.atomic(using=conn.alias), conn.cursor() as cursor:
        cursor.execute(gate.sql, gate.params)
        cursor.execute(statement.sql, statement.params)
        return list(cursor.fetchall())


def _claim_returning(
    qs: models.QuerySet,
    candidates_sql: str,
    candidates_params: tuple[Any, ...],
    *,
    n: int,
    opts: ClaimOptions,
    lease: float,
    worker: str,
) -> list[models.Model]:
    """Claim the candidates (at most ``n`` rows) in one statement (the vendor's
    :meth:`~django_taskclaim.backends.base.DatabaseSQL.claim`), behind the table's claim
    gate when ``n`` is large enough (:func:`claim_gate`), and build the instances."""
    model = qs.model
    conn = connections[qs.db]
    statement = for_connection(conn).claim(
        claim_columns(model, opts, conn),
        Statement(candidates_sql, candidates_params),
        processing=opts.value("processing"),
        ready=opts.value("ready"),
        lease=lease,
        worker=worker,
    )
    fetched = fetch_claimed(conn, statement, claim_gate(qs, opts, n))
    recovered = [row[-1] for row in fetched]
    tasks = _instances(model, qs.db, [row[:-1] for row in fetched])
    for task, flag in zip(tasks, recovered, strict=True):
        if flag:
            setattr(task, RECOVERED_ATTR, True)
    return _sort(tasks, opts.ordering)


_COMPLETE_SQL: dict[tuple[type[models.Model], str, tuple[str, ...], str], str] = {}


class _NotJSON(Exception):
    """A value with no JSON text its column type reads back as the same value."""


def _prepared_json(field: models.Field, conn: Any, value: Any) -> Any:
    """``value`` prepared by the ORM (``get_db_prep_save``), as JSON the column's input
    function reads back as the same value; :class:`_NotJSON` when there is none."""
    prepared = field.get_db_prep_save(value, conn)
    if prepared is None or isinstance(prepared, bool | int | str):
        return prepared
    if isinstance(prepared, float) and math.isfinite(prepared):
        return prepared
    if isinstance(prepared, datetime | date | time):
        return prepared.isoformat()
    if isinstance(prepared, uuid.UUID | Decimal):
        return str(prepared)
    raise _NotJSON


def _same(value: Any) -> Any:
    return value


#: Stock fields whose preparation leaves a value of the exact type given unchanged.
_INTEGER_FIELDS = (
    models.AutoField,
    models.BigAutoField,
    models.SmallAutoField,
    models.IntegerField,
    models.BigIntegerField,
    models.SmallIntegerField,
    models.PositiveIntegerField,
    models.PositiveBigIntegerField,
    models.PositiveSmallIntegerField,
)
_TEXT_FIELDS = (models.CharField, models.TextField)

_TO_JSON: dict[tuple[models.Field, bool, str], Callable[[Any], Any]] = {}


def _to_json(field: models.Field, conn: Any) -> Callable[[Any], Any]:
    """The function turning a value of ``field`` into JSON that its column reads back as
    the value the ORM would store (raising :class:`_NotJSON` when there is none): the
    document itself for a JSON field without a custom encoder; the value itself where
    the ORM would not change it (an ``int`` for a stock integer field, a ``str`` for a
    stock text field, an aware ``datetime`` with ``USE_TZ``, a ``UUID`` as text); else
    what ``get_db_prep_save`` makes of it. Built once per field."""
    key = (field, bool(settings.USE_TZ), conn.alias)
    found = _TO_JSON.get(key)
    if found is not None:
        return found
    general: Callable[[Any], Any] = partial(_prepared_json, field, conn)
    kind = type(field)
    if isinstance(field, models.JSONField):
        if field.encoder is not None:

            def refuse(value: Any) -> Any:
                raise _NotJSON  # its own encoder: leave the encoding to the ORM

            found = refuse
        else:
            found = _same  # None is SQL NULL, as the ORM stores it
    elif kind in _INTEGER_FIELDS:
        found = lambda v: v if type(v) is int else general(v)  # noqa: E731
    elif kind in _TEXT_FIELDS:
        found = lambda v: v if type(v) is str else general(v)  # noqa: E731
    elif kind is models.UUIDField:
        found = lambda v: str(v) if type(v) is uuid.UUID else general(v)  # noqa: E731
    elif kind is models.DateTimeField and settings.USE_TZ:
        found = (  # noqa: E731
            lambda v: v.isoformat() if type(v) is datetime and v.tzinfo is not None else general(v)
        )
    else:
        found = general
    _TO_JSON[key] = found
    return found


def _rows_json(
    model: type[models.Model],
    conn: Any,
    tokens: dict[Any, int],
    names: tuple[str, ...],
    results: dict[Any, dict[str, Any]],
) -> str | None:
    """The rows of a completion as one JSON document (see ``complete_many_sql``), or
    ``None`` when a value has no faithful JSON form (the arrays carry it then)."""
    pk_json = _to_json(cast(models.Field, model._meta.pk), conn)
    columns = [
        (f"r{i}", name, _to_json(cast(models.Field, model._meta.get_field(name)), conn))
        for i, name in enumerate(names)
    ]
    rows = []
    try:
        for pk, token in tokens.items():
            values = results[pk]
            row = {"pk": pk_json(pk), "token": token}
            for key, name, to_json in columns:
                row[key] = to_json(values[name])
            rows.append(row)
        return json.dumps(rows, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except (_NotJSON, TypeError, ValueError):
        return None


def complete_many_in_one(
    model: type[models.Model],
    using: str,
    opts: ClaimOptions,
    tokens: dict[Any, int],
    results: dict[Any, dict[str, Any]] | None = None,
) -> int:
    """Complete the rows of ``tokens`` (pk → claimed version) in one fenced UPDATE from
    per-row arrays (the vendor's
    :meth:`~django_taskclaim.backends.base.DatabaseSQL.complete_many_sql`, where
    :attr:`~django_taskclaim.backends.base.DatabaseSQL.completes_from_arrays`); return how
    many rows it wrote.

    The statement text is the same for every batch (built once per model, result fields
    and form) and no per-row parameter is formatted, which halves the cost of
    acknowledging a batch of 100. ``results`` (pk → result fields; every row the same
    field names, plain values) are written in the same statement, each row its own
    values: as one JSON document when every value has a faithful JSON form (JSON fields
    without a custom encoder, text, numbers, booleans, dates and times, UUIDs, decimals),
    which costs the worker a fraction of quoting one array element per value; else as
    one array per column.
    """
    conn = connections[using]
    pk_field = model._meta.pk
    names: tuple[str, ...] = ()
    if results:
        names = tuple(sorted(next(iter(results.values()))))
    document = _rows_json(model, conn, tokens, names, results or {}) if names else None
    rows_as = "arrays" if document is None else "json"
    key = (model, using, names, rows_as)
    sql = _COMPLETE_SQL.get(key)
    if sql is None:
        qn = conn.ops.quote_name
        version_field = model._meta.get_field("version")
        sql = _COMPLETE_SQL[key] = for_connection(conn).complete_many_sql(
            claim_columns(model, opts, conn),
            pk_type=str(pk_field.cast_db_type(conn)),
            version_type=str(version_field.cast_db_type(conn)),  # type: ignore[union-attr]
            results=[
                (column(model, name, qn), str(model._meta.get_field(name).cast_db_type(conn)))  # type: ignore[union-attr]
                for name in names
            ],
            rows_as=rows_as,
        )
    params: list[Any] = [opts.value("done")]
    if document is not None:
        params.append(document)
    else:
        params.append([pk_field.get_db_prep_value(pk, conn) for pk in tokens])
        params.append(list(tokens.values()))
        for name in names:
            prep = model._meta.get_field(name).get_db_prep_save  # type: ignore[union-attr]
            params.append([prep((results or {})[pk][name], conn) for pk in tokens])
    params.append(opts.value("processing"))
    with conn.cursor() as cursor:
        cursor.execute(sql, params)
        return int(cursor.rowcount)
