"""Claim strategies, one small class each. All vendor-specific SQL of the claim path lives here.

Every strategy takes a queryset already narrowed to claimable rows (the user's filters
plus ``status = ready`` and ``run_after <= now()``) and turns at most ``n`` of them into
``processing`` rows held by ``worker`` until ``now() + lease`` (database clock), with
``version`` and ``attempts`` bumped. None ever hands one row to two claimers.
"""

from __future__ import annotations

import random
import zlib
from datetime import timedelta
from operator import attrgetter
from typing import TYPE_CHECKING, Any, cast

from django.db import connections, models, transaction
from django.db.models import F, Q, sql

from . import bounds
from .backends import ClaimColumns, PostgreSQL, Statement, for_alias, for_connection
from .conf import taskclaim_settings
from .db import DbNow
from .exceptions import ConfigurationError, StrategyNotSupportedError

if TYPE_CHECKING:
    from .options import ClaimOptions


class Strategy:
    """Base class: ``claim(qs, n, ...)`` returns the claimed instances, FIFO-ordered."""

    name = ""
    #: "hold" runs inside the caller's transaction; the others refuse one
    needs_caller_atomic = False

    def supported(self, using: str) -> bool:
        """Whether this strategy works on the database ``using`` (its vendor's
        :attr:`~django_taskclaim.backends.base.DatabaseSQL.claim_strategies`, and the
        driver features it needs)."""
        conn = connections[using]
        if self.name not in for_connection(conn).claim_strategies:
            return False
        return self._features_ok(conn)

    def _features_ok(self, conn: Any) -> bool:
        return True

    def claim(
        self,
        qs: models.QuerySet,
        n: int,
        *,
        opts: ClaimOptions,
        lease: float,
        worker: str,
        cache_key: tuple[Any, ...] | None = None,
    ) -> list[models.Model]:
        """Claim up to ``n`` rows of ``qs``. ``cache_key`` (set when ``qs`` carries no
        filters of the caller's) lets a strategy reuse the SQL it compiled before."""
        raise NotImplementedError


# -- shared pieces --------------------------------------------------------------------


def claim_updates(opts: ClaimOptions, lease: float, worker: str) -> dict[str, Any]:
    """The ORM form of the SET clause of a claim."""
    updates: dict[str, Any] = {
        opts.status_field: opts.value("processing"),
        "version": F("version") + 1,
        "attempts": F("attempts") + 1,
        "locked_until": DbNow() + timedelta(seconds=lease),
    }
    if opts.has("locked_by"):
        updates["locked_by"] = worker
    return updates


#: Set on each claimed instance: whether the row came back from a holder that lost it
#: (its lease expired, or its worker was proven dead). Such a row is run alone; see
#: :func:`was_recovered`.
RECOVERED_ATTR = "_taskclaim_recovered"


def was_recovered(task: Any) -> bool:
    """Whether this claim took a row recovered from a lost holder (lease expired, or
    worker proven dead) rather than a row that was never lost.

    A recovered row is ``ready`` with its ``locked_until`` still set to the end of the
    lease that was lost (rows never lost have ``locked_until = NULL`` while ready). The
    worker runs such a row last in its batch, alone, after the batch's other results are
    written, so that a task that kills its worker charges no attempt to its batch-mates.
    """
    return bool(getattr(task, RECOVERED_ATTR, False))


def _null_safe(value: Any) -> tuple[bool, Any]:
    return (value is None, value)


def _sort(rows: list[models.Model], ordering: tuple[str, ...]) -> list[models.Model]:
    """Order claimed rows as the claim's ORDER BY did (``NULL`` last either way, as
    :func:`claim_order` asks the database for). Never raises on ``NULL`` values."""
    rows.sort(key=lambda r: _null_safe(r.pk))  # ties in ``ordering`` come back in pk order
    for item in reversed(ordering):
        get = attrgetter("pk" if item.lstrip("-") == "pk" else item.lstrip("-"))
        desc = item.startswith("-")
        present = [r for r in rows if get(r) is not None]
        absent = [r for r in rows if get(r) is None]
        present.sort(key=get, reverse=desc)
        rows[:] = present + absent
    return rows


def _compile(qs: models.QuerySet) -> tuple[str, tuple[Any, ...]]:
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
        return _compile(_candidates(qs, opts, limit))
    key = (*cache_key, limit)
    hit = _COMPILED.get(key)
    if hit is None:
        if len(_COMPILED) >= _COMPILED_MAX:
            _COMPILED.clear()
        hit = _COMPILED[key] = _compile(_candidates(qs, opts, limit))
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


def claim_columns(model: type[models.Model], opts: ClaimOptions, conn: Any) -> ClaimColumns:
    """The model's table and claim columns quoted for ``conn`` (``db_column`` honoured)."""
    qn = conn.ops.quote_name
    table = qn(model._meta.db_table)
    return ClaimColumns(
        table=table,
        pk=column(model, "pk", qn),
        status=qn(opts.status_column),
        version=column(model, "version", qn),
        attempts=column(model, "attempts", qn),
        locked_until=column(model, "locked_until", qn),
        locked_by=column(model, "locked_by", qn) if opts.has("locked_by") else None,
        finished_at=column(model, "finished_at", qn) if opts.has("finished_at") else None,
        returning=", ".join(f"{table}.{qn(f.column)}" for f in model._meta.concrete_fields),
    )


def _claim_returning(
    qs: models.QuerySet,
    candidates_sql: str,
    candidates_params: tuple[Any, ...],
    *,
    opts: ClaimOptions,
    lease: float,
    worker: str,
) -> list[models.Model]:
    """Claim the candidates in one statement (the vendor's
    :meth:`~django_taskclaim.backends.base.DatabaseSQL.claim`) and build the instances."""
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
    with conn.cursor() as cursor:
        cursor.execute(statement.sql, statement.params)
        fetched = cursor.fetchall()
    recovered = [row[-1] for row in fetched]
    tasks = _instances(model, qs.db, [row[:-1] for row in fetched])
    for task, flag in zip(tasks, recovered, strict=True):
        if flag:
            setattr(task, RECOVERED_ATTR, True)
    return _sort(tasks, opts.ordering)


def column(model: type[models.Model], name: str, qn: Any) -> str:
    """The quoted column of field ``name`` (its ``db_column`` if it has one)."""
    field = model._meta.pk if name == "pk" else model._meta.get_field(name)
    if not isinstance(field, models.Field) or not field.column:
        raise ConfigurationError(f"{model._meta.label}.{name} is not a concrete column")
    return str(qn(field.column))


_COMPLETE_SQL: dict[tuple[type[models.Model], str, tuple[str, ...]], str] = {}


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

    The statement text is the same for every batch (built once per model and result
    fields) and no per-row parameter is formatted, which halves the cost of acknowledging
    a batch of 100. ``results`` (pk → result fields; every row the same field names,
    plain values) are written in the same statement, each row its own values.
    """
    conn = connections[using]
    pk_field = model._meta.pk
    names: tuple[str, ...] = ()
    if results:
        names = tuple(sorted(next(iter(results.values()))))
    key = (model, using, names)
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
        )
    pks = [pk_field.get_db_prep_value(pk, conn) for pk in tokens]
    columns: list[list[Any]] = []
    for name in names:
        field = model._meta.get_field(name)
        prep = field.get_db_prep_save  # type: ignore[union-attr]
        columns.append([prep((results or {})[pk][name], conn) for pk in tokens])
    params = [opts.value("done"), pks, list(tokens.values()), *columns, opts.value("processing")]
    with conn.cursor() as cursor:
        cursor.execute(sql, params)
        return int(cursor.rowcount)


def claim_order(opts: ClaimOptions, using: str) -> tuple[str, ...]:
    """The ORDER BY of a claim: ``ClaimMeta.ordering``, plus ``pk`` as the last tie-break
    where that costs nothing (InnoDB and SQLite append the primary key to every index
    entry). Not on PostgreSQL, whose claim index does not hold the pk: there, ties come
    in index order (heap order, i.e. insertion order for rows inserted together)."""
    ordering = opts.ordering
    free = for_alias(using).pk_tie_break_is_free
    if free and "pk" not in {o.lstrip("-") for o in ordering}:
        ordering = (*ordering, "pk")
    return ordering


def _order_by(opts: ClaimOptions, using: str) -> list[Any]:
    """:func:`claim_order` as ``order_by()`` arguments: a nullable field is ordered with
    ``NULL`` last explicitly (vendors disagree on the default), so :func:`_sort` puts the
    returned rows in the same order; other fields stay plain so the claim index serves."""
    out: list[Any] = []
    for item in claim_order(opts, using):
        name = item.lstrip("-")
        field = opts.model._meta.pk if name == "pk" else opts.model._meta.get_field(name)
        if getattr(field, "null", False):
            expr = F(name)
            out.append(
                expr.desc(nulls_last=True) if item.startswith("-") else expr.asc(nulls_last=True)
            )
        else:
            out.append(item)
    return out


def _candidates(qs: models.QuerySet, opts: ClaimOptions, limit: int) -> models.QuerySet:
    """The candidate rows of a claim: ``(pk, locked_until)`` in claim order, at most ``limit``.

    ``locked_until`` of a ``ready`` row is set only on a row recovered from a lost holder
    (see :func:`was_recovered`)."""
    return qs.order_by(*_order_by(opts, qs.db)).values("pk", "locked_until")[:limit]


def _mark_recovered(rows: list[Any], recovered: set[Any]) -> list[Any]:
    for row in rows:
        if row.pk in recovered:
            setattr(row, RECOVERED_ATTR, True)
    return rows


# -- strategies -----------------------------------------------------------------------


class SkipLocked(Strategy):
    """``SELECT … FOR UPDATE SKIP LOCKED``: claimers skip each other's rows, never wait.

    PostgreSQL: one statement (``UPDATE … WHERE pk IN (SELECT … FOR UPDATE SKIP LOCKED)
    RETURNING``). MySQL 8 / MariaDB ≥ 10.6: one short transaction (locking SELECT +
    UPDATE), the lease computed from the database clock read in that SELECT.
    """

    name = "skip_locked"

    def _features_ok(self, conn: Any) -> bool:
        return bool(conn.features.has_select_for_update_skip_locked)

    def claim(
        self,
        qs: models.QuerySet,
        n: int,
        *,
        opts: ClaimOptions,
        lease: float,
        worker: str,
        cache_key: tuple[Any, ...] | None = None,
    ) -> list[models.Model]:
        conn = connections[qs.db]
        if for_connection(conn).claims_in_one_statement:
            sql, params = _compiled_candidates(qs, opts, n, cache_key)
            lock = conn.ops.for_update_sql(
                skip_locked=True, of=(conn.ops.quote_name(qs.model._meta.db_table),)
            )
            return _claim_returning(
                qs, f"{sql} {lock}", params, opts=opts, lease=lease, worker=worker
            )
        return self._claim_in_transaction(qs, n, opts=opts, lease=lease, worker=worker)

    def _claim_in_transaction(
        self, qs: models.QuerySet, n: int, *, opts: ClaimOptions, lease: float, worker: str
    ) -> list[models.Model]:
        conn = connections[qs.db]
        of = ("self",) if conn.features.has_select_for_update_of else ()
        with transaction.atomic(using=qs.db):
            rows = list(
                qs.defer(None)  # every field loaded now: none is re-read lazily after the claim
                .order_by(*_order_by(opts, qs.db))
                .select_for_update(skip_locked=True, of=of)
                .annotate(_taskclaim_now=DbNow())[:n]
            )
            if not rows:
                return []
            recovered = {r.pk for r in rows if r.locked_until is not None}
            until = rows[0]._taskclaim_now + timedelta(seconds=lease)
            updates = claim_updates(opts, lease, worker)
            updates["locked_until"] = until
            done = (
                qs.model._base_manager.using(qs.db)
                .filter(pk__in=[r.pk for r in rows])
                .filter(opts.status_q("ready"))
                .update(**updates)
            )
            if done != len(rows):  # pragma: no cover - rows are locked by this transaction
                raise transaction.TransactionManagementError(
                    "locked rows changed under a claim; rolled back"
                )
        for r in rows:
            setattr(r, opts.status_field, opts.value("processing"))
            r.version += 1
            r.attempts += 1
            r.locked_until = until
            if opts.has("locked_by"):
                r.locked_by = worker
            del r._taskclaim_now
        return _mark_recovered(rows, recovered)


class CompareAndSet(Strategy):
    """Optimistic claim: read candidates, then ``UPDATE … WHERE pk=? AND version=? AND
    status=ready`` each; a row counts as claimed only when exactly one row was updated.

    Works on every database. Tries candidates in FIFO order and, after a collision,
    in random order among the remaining ones so that concurrent claimers spread out.
    On SQLite the whole batch is one conditional UPDATE (see ``_claim_sqlite``).
    """

    name = "cas"

    def claim(
        self,
        qs: models.QuerySet,
        n: int,
        *,
        opts: ClaimOptions,
        lease: float,
        worker: str,
        cache_key: tuple[Any, ...] | None = None,
    ) -> list[models.Model]:
        conn = connections[qs.db]
        if (
            for_connection(conn).one_writer_at_a_time
            and conn.features.can_return_columns_from_insert
        ):
            return self._claim_sqlite(qs, n, opts=opts, lease=lease, worker=worker)
        return self._claim_candidates(qs, n, opts=opts, lease=lease, worker=worker)

    def _claim_sqlite(
        self, qs: models.QuerySet, n: int, *, opts: ClaimOptions, lease: float, worker: str
    ) -> list[models.Model]:
        """SQLite runs one writer at a time, so the compare-and-set of a whole batch is one
        statement: ``UPDATE … WHERE pk IN (<n candidates>) AND status = ready RETURNING *``.

        The candidates are read first in the same transaction (SQLite has no old values
        in ``RETURNING``; the read tells which rows were recovered). With
        ``transaction_mode = "IMMEDIATE"`` the transaction holds the write lock from its
        start; otherwise a writer that committed in between makes SQLite refuse the
        write ("database is locked", retried) rather than use stale data.
        """
        base = qs.model._base_manager.using(qs.db)
        with transaction.atomic(using=qs.db):
            picked = list(_candidates(qs, opts, n))
            if not picked:
                return []
            target = base.filter(pk__in=[p["pk"] for p in picked]).filter(opts.status_q("ready"))
            query = target.query.chain(sql.UpdateQuery)
            query.add_update_values(claim_updates(opts, lease, worker))
            update_sql, params = query.get_compiler(qs.db).as_sql()
            rows = list(base.raw(for_alias(qs.db).returning_all_sql(update_sql), params))
        recovered = {p["pk"] for p in picked if p["locked_until"] is not None}
        return _sort(_mark_recovered(rows, recovered), opts.ordering)

    def _claim_candidates(
        self, qs: models.QuerySet, n: int, *, opts: ClaimOptions, lease: float, worker: str
    ) -> list[models.Model]:

        base = qs.model._base_manager.using(qs.db)
        k = max(n, int(taskclaim_settings.CAS_CANDIDATES))
        updates = claim_updates(opts, lease, worker)
        won: dict[Any, int] = {}  # pk -> the token this claim wrote
        recovered: set[Any] = set()
        for _round in range(8):
            candidates = list(
                qs.exclude(pk__in=list(won))
                .order_by(*_order_by(opts, qs.db))
                .values_list("pk", "version", "locked_until")[:k]
            )
            if not candidates:
                break
            collided = False
            while candidates and len(won) < n:
                index = random.randrange(len(candidates)) if collided else 0
                pk, version, prev = candidates.pop(index)
                hit = (
                    base.filter(pk=pk, version=version)
                    .filter(opts.status_q("ready"))
                    .update(**updates)
                )
                if hit == 1:
                    won[pk] = version + 1
                    if prev is not None:
                        recovered.add(pk)
                else:
                    collided = True
            if len(won) >= n or not collided:
                break
        if not won:
            return []
        return _sort(_mark_recovered(read_claimed(base, opts, won), recovered), opts.ordering)


def read_claimed(base: models.QuerySet, opts: ClaimOptions, won: dict[Any, int]) -> list[Any]:
    """Re-read the rows a compare-and-set claim won, each only if it still carries the
    token that claim wrote (``pk = ? AND version = ?`` and ``processing``).

    A row released and re-claimed by another worker between the UPDATE and this read
    comes back with another token and is left out: the caller never gets an instance
    carrying someone else's token (its fenced writes would win over the real holder)."""
    match = Q()
    for pk, token in won.items():
        match |= Q(pk=pk, version=token)
    return list(base.filter(match).filter(opts.status_q("processing")))


def advisory_table_key(model: type[models.Model]) -> int:
    """The int32 first half of the advisory-lock key pair used by the ``advisory`` strategy."""
    value = zlib.crc32(model._meta.db_table.encode())
    return value - (1 << 32) if value >= (1 << 31) else value


class Advisory(Strategy):
    """PostgreSQL: candidates guarded by ``pg_try_advisory_xact_lock(table, hash(pk))``.

    One statement; the transaction-scoped locks vanish when it ends, so this works
    behind pgBouncer in transaction mode. The status is re-checked in the UPDATE.
    """

    name = "advisory"

    def claim(
        self,
        qs: models.QuerySet,
        n: int,
        *,
        opts: ClaimOptions,
        lease: float,
        worker: str,
        cache_key: tuple[Any, ...] | None = None,
    ) -> list[models.Model]:
        sql, params = _compiled_candidates(qs, opts, max(n * 4, n + 8), cache_key)
        candidates = cast(PostgreSQL, for_alias(qs.db)).advisory_candidates_sql(sql, n)
        return _claim_returning(
            qs,
            candidates,
            (*params, advisory_table_key(qs.model)),
            opts=opts,
            lease=lease,
            worker=worker,
        )


class Serializable(Strategy):
    """PostgreSQL: plain SELECT + UPDATE inside a SERIALIZABLE transaction.

    Conflicting claimers get a serialization failure, retried inside the library.
    """

    name = "serializable"

    def claim(
        self,
        qs: models.QuerySet,
        n: int,
        *,
        opts: ClaimOptions,
        lease: float,
        worker: str,
        cache_key: tuple[Any, ...] | None = None,
    ) -> list[models.Model]:
        with transaction.atomic(using=qs.db):
            with connections[qs.db].cursor() as cursor:
                cursor.execute(cast(PostgreSQL, for_alias(qs.db)).serializable_sql)
            sql, params = _compiled_candidates(qs, opts, n, cache_key)
            return _claim_returning(qs, sql, params, opts=opts, lease=lease, worker=worker)


class Hold(Strategy):
    """PostgreSQL: ``FOR UPDATE SKIP LOCKED`` kept for the caller's whole transaction.

    Must be called inside ``transaction.atomic()``; the row locks (and a connection)
    are held until that transaction ends. A crash rolls the claim back by itself —
    including the attempt count, so a task that kills its worker is retried forever
    in this mode. Use for short jobs only.
    """

    name = "hold"
    needs_caller_atomic = True

    def claim(
        self,
        qs: models.QuerySet,
        n: int,
        *,
        opts: ClaimOptions,
        lease: float,
        worker: str,
        cache_key: tuple[Any, ...] | None = None,
    ) -> list[models.Model]:
        return SkipLocked().claim(qs, n, opts=opts, lease=lease, worker=worker, cache_key=cache_key)


STRATEGIES: dict[str, Strategy] = {
    s.name: s for s in (SkipLocked(), CompareAndSet(), Advisory(), Serializable(), Hold())
}
#: Every name ``ClaimMeta.strategy`` / ``TASKCLAIM_STRATEGY`` / ``claim(strategy=…)``
#: accepts: ``auto`` (picked per vendor by :func:`resolve`) and each strategy's own.
STRATEGY_NAMES: tuple[str, ...] = ("auto", *STRATEGIES)


def resolve(name: str, using: str) -> Strategy:
    """Return the strategy called ``name`` (``auto`` picks per vendor) or raise clearly."""
    if name == "auto":
        for candidate in ("skip_locked", "cas"):
            if STRATEGIES[candidate].supported(using):
                return STRATEGIES[candidate]
    strategy = STRATEGIES.get(name)
    if strategy is None:
        raise StrategyNotSupportedError(
            f"unknown claim strategy {name!r}; choose one of {', '.join(STRATEGY_NAMES)}"
        )
    if not strategy.supported(using):
        raise StrategyNotSupportedError(
            f"claim strategy {name!r} is not supported on {for_alias(using).vendor} "
            f"(database {using!r}); use 'cas' (every database) or 'auto'"
        )
    return strategy


def validate_lease(lease: Any) -> float:
    """``lease`` in seconds as a float, or :class:`ConfigurationError` unless it is a
    finite number within :data:`~.bounds.LEASE` (a ``timedelta`` is accepted too)."""
    return float(bounds.number(lease, "lease", bounds.LEASE, seconds=True))
