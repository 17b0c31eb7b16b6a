"""A batch of claimed rows completed in one fenced UPDATE from per-row arrays or JSON.

:func:`complete_many_in_one` is what :func:`~django_taskclaim.settle.batch.complete_many`
writes with where the vendor
:attr:`~django_taskclaim.backends.base.DatabaseSQL.completes_from_arrays`: the statement
text is the vendor's (:meth:`~django_taskclaim.backends.base.DatabaseSQL.complete_many_sql`),
the claim columns are :mod:`django_taskclaim.claim`'s; the result fields travel as one JSON
document when each value has a faithful JSON form (:func:`_rows_json`), else as one array
per column.
"""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Callable
from datetime import date, datetime, time
from decimal import Decimal
from functools import partial
from typing import Any, cast

from django.conf import settings
from django.db import connections, models

from django_taskclaim.backends import for_connection
from django_taskclaim.claim.base import claim_columns, column
from django_taskclaim.config.options import ClaimOptions
from django_taskclaim.db import execute_kept

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
        backend = for_connection(conn)
        params.append(backend.array_param([pk_field.get_db_prep_value(pk, conn) for pk in tokens]))
        params.append(backend.array_param(list(tokens.values())))
        for name in names:
            prep = model._meta.get_field(name).get_db_prep_save  # type: ignore[union-attr]
            params.append([prep((results or {})[pk][name], conn) for pk in tokens])
    params.append(opts.value("processing"))
    # The same text for every batch: prepared once per connection where it may be.
    return int(execute_kept(conn, sql, params, fetch=False))
