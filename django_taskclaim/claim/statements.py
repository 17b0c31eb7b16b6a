"""The one-statement claim and completion, built by the backends and run here.

Where the vendor can claim in one statement (``UPDATE … RETURNING``), the candidates
SELECT compiled by the ORM (kept per model, database, strategy and batch size) is handed
to the vendor's :meth:`~django_taskclaim.backends.base.DatabaseSQL.claim` and the
returned rows become model instances with the ORM's own converters
(:func:`claim_returning`). A claim of at least ``claim_gate`` rows first takes its
turn at the table's claim gate, in the same round trip (:func:`claim_gate`,
:func:`fetch_claimed`). The completion counterpart, a batch of claimed rows completed from
per-row arrays in one fenced UPDATE, is :mod:`django_taskclaim.settle.batch_json`.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

from django.db import connections, models, transaction
from django.db.models.base import ModelState
from django.db.models.fields.related_descriptors import ForeignKeyDeferredAttribute
from django.db.models.query_utils import DeferredAttribute
from django.db.models.signals import post_init, pre_init

from django_taskclaim.backends import Statement, for_connection
from django_taskclaim.capped import CappedCache
from django_taskclaim.claim.base import RECOVERED_ATTR, _sort, candidates, claim_columns
from django_taskclaim.db import execute_kept

if TYPE_CHECKING:
    from django_taskclaim.claim.request import ClaimRequest
    from django_taskclaim.config.options import ClaimOptions


def compile_queryset(qs: models.QuerySet) -> tuple[str, tuple[Any, ...]]:
    sql, params = qs.query.get_compiler(using=qs.db).as_sql()
    return sql, tuple(params)


_COMPILED: CappedCache[tuple[Any, ...], tuple[str, tuple[Any, ...]]] = CappedCache()


def compiled_candidates(r: ClaimRequest, limit: int | None = None) -> tuple[str, tuple[Any, ...]]:
    """The candidates SELECT of ``r`` (``limit`` rows, default ``r.n``) compiled by the
    ORM; kept per ``r.cache_key`` and ``limit``.

    The SQL of an unfiltered claim depends only on the model, database, strategy and
    batch size (the clock is ``now()`` in the SQL, not a parameter), so a worker
    compiles it once instead of on every claim.
    """
    limit = r.n if limit is None else limit
    if r.cache_key is None:
        return compile_queryset(candidates(r.qs, r.opts, limit))
    key = (*r.cache_key, limit)
    hit = _COMPILED.get(key)
    if hit is None:
        hit = _COMPILED.put(key, compile_queryset(candidates(r.qs, r.opts, limit)))
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


#: Descriptors that store what is set in the instance's ``__dict__`` and nothing else
#: (on a new instance): a field behind one of these may be filled in directly.
_PLAIN_DESCRIPTORS = (DeferredAttribute, ForeignKeyDeferredAttribute)
_DIRECT: dict[type[models.Model], tuple[str, ...] | None] = {}


def _direct_attnames(model: type[models.Model]) -> tuple[str, ...] | None:
    """The concrete fields' attnames when an instance of ``model`` read from the
    database can be built by filling in its ``__dict__``, exactly as ``from_db`` would
    build it; ``None`` when not: ``__init__`` or ``from_db`` overridden, or a field
    whose descriptor does more than store the value. Decided once per model."""
    if model in _DIRECT:
        return _DIRECT[model]
    found: tuple[str, ...] | None = None
    if model.__init__ is models.Model.__init__ and getattr(
        model.from_db, "__func__", None
    ) is getattr(models.Model.from_db, "__func__", None):
        attnames = tuple(f.attname for f in model._meta.concrete_fields)
        if all(
            type(inspect.getattr_static(model, name, None)) in _PLAIN_DESCRIPTORS
            for name in attnames
        ):
            found = attnames
    _DIRECT[model] = found
    return found


def _instances(model: type[models.Model], using: str, rows: list[tuple[Any, ...]]) -> list[Any]:
    """Model instances from rows holding every concrete column in field order.

    The same instances as ``Model.from_db()`` makes (``_state`` not adding, its
    database set, each field's value in ``__dict__``), without its per-row generic
    path where nothing can tell the difference: the model overrides neither
    ``__init__`` nor ``from_db``, no ``pre_init``/``post_init`` receiver listens to it,
    and its fields' descriptors only store values (:func:`_direct_attnames`)."""
    conn = connections[using]
    converters = _row_converters(model, using)
    direct = _direct_attnames(model)
    if direct is not None and (pre_init.has_listeners(model) or post_init.has_listeners(model)):
        direct = None
    attnames = direct or [f.attname for f in model._meta.concrete_fields]
    out = []
    new = model.__new__
    for row in rows:
        if converters:
            values = list(row)
            for i, funcs, col in converters:
                for func in funcs:
                    values[i] = func(values[i], col, conn)
            row = tuple(values)
        if direct is None:
            out.append(model.from_db(using, attnames, row))
            continue
        obj = new(model)
        state = ModelState()
        state.adding = False
        state.db = using
        d = obj.__dict__
        d["_state"] = state
        d.update(zip(direct, row, strict=True))
        out.append(obj)
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


def fetch_claimed(
    conn: Any, statement: Statement, gate: Statement | None, *, kept: bool = False
) -> list[Any]:
    """Run a claim ``statement`` (after its ``gate``, when there is one) and return its rows.
    A ``kept`` statement (the same text and parameters at every claim: :func:`kept_claim`)
    without a gate goes through :func:`~django_taskclaim.db.execute_kept` (PostgreSQL
    prepares it where the connection allows prepared statements).

    The gate and the claim go in one round trip, one transaction, where the driver
    takes several statements per call; else (psycopg 3 with server-side binding) in a
    transaction of two statements, whose gate statement bounds how long the transaction
    may wait idle for this client: frozen between the two, it loses its session (the
    claim raises, nothing was claimed) instead of holding the gate for everyone."""
    backend = for_connection(conn)
    if gate is None and kept:
        return list(execute_kept(conn, statement.sql, statement.params, fetch=True, constant=True))
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


_CLAIMS: CappedCache[tuple[Any, ...], Statement] = CappedCache()


def _claim_key(r: ClaimRequest) -> tuple[Any, ...] | None:
    """What the whole claim statement of ``r`` depends on, where its candidates SQL is
    kept (``r.cache_key``: the model, database and strategy): the batch size, the
    model's options (statuses, columns), the lease and the holder. ``None`` otherwise."""
    if r.cache_key is None:
        return None
    return (*r.cache_key, r.n, r.opts, r.lease, r.worker)


def kept_claim(r: ClaimRequest) -> Statement | None:
    """The claim statement :func:`claim_returning` built for an earlier claim exactly
    like ``r`` (same key, :func:`_claim_key`), or ``None``: a worker claims with the same
    batch size, lease and holder every time, so it builds each statement text once."""
    key = _claim_key(r)
    return None if key is None else _CLAIMS.get(key)


def claim_returning(
    r: ClaimRequest, candidates_sql: str, candidates_params: tuple[Any, ...]
) -> list[models.Model]:
    """Claim the candidates (at most ``r.n`` rows) in one statement (the vendor's
    :meth:`~django_taskclaim.backends.base.DatabaseSQL.claim`, kept for
    :func:`kept_claim`), behind the table's claim gate when ``r.n`` is large enough
    (:func:`claim_gate`), and build the instances (:func:`run_claim`)."""
    opts = r.opts
    conn = connections[r.qs.db]
    statement = for_connection(conn).claim(
        claim_columns(r.qs.model, opts, conn),
        Statement(candidates_sql, candidates_params),
        processing=opts.value("processing"),
        ready=opts.value("ready"),
        lease=r.lease,
        worker=r.worker,
    )
    key = _claim_key(r)
    if key is not None:
        _CLAIMS.put(key, statement)
    return run_claim(r, statement)


def run_claim(r: ClaimRequest, statement: Statement) -> list[models.Model]:
    """Run ``r``'s one-statement claim (behind the claim gate when ``r.n`` is large
    enough: :func:`claim_gate`) and return the claimed rows as instances, in claim
    order, the recovered ones marked."""
    qs, opts = r.qs, r.opts
    model = qs.model
    conn = connections[qs.db]
    fetched = fetch_claimed(
        conn, statement, claim_gate(qs, opts, r.n), kept=_claim_key(r) is not None
    )
    recovered = [row[-1] for row in fetched]
    tasks = _instances(model, qs.db, [row[:-1] for row in fetched])
    for task, flag in zip(tasks, recovered, strict=True):
        if flag:
            setattr(task, RECOVERED_ATTR, True)
    return _sort(tasks, opts.ordering)
