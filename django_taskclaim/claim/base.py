"""The strategy base class and the pieces every strategy shares.

:class:`Strategy` is what ``claim()`` calls; this module also holds the ORM form of a
claim's SET clause (:func:`claim_updates`), the claim order (:func:`claim_order`) and
the candidate rows it selects (:func:`candidates`), the quoted claim columns handed to
the backends (:func:`claim_columns`), the mark of a row recovered from a lost holder
(:data:`RECOVERED_ATTR`, :func:`was_recovered`), and the re-read of the rows a
compare-and-set claim won (:func:`read_claimed`).
"""

from __future__ import annotations

from datetime import timedelta
from operator import attrgetter
from typing import TYPE_CHECKING, Any, cast

from django.db import connections, models
from django.db.models import F

from django_taskclaim.backends import ClaimColumns, for_alias, for_connection
from django_taskclaim.claim.resets import Change, apply_in_memory, plan, writes
from django_taskclaim.db import DbNow
from django_taskclaim.exceptions import ConfigurationError
from django_taskclaim.rules import held_q

if TYPE_CHECKING:
    from django_taskclaim.claim.request import ClaimRequest
    from django_taskclaim.config.options import ClaimOptions


class Strategy:
    """Base class: ``claim(qs, n, ...)`` returns the claimed instances, FIFO-ordered."""

    name = ""
    #: "hold" runs inside the caller's transaction; the others refuse one
    needs_caller_atomic = False
    #: a serialization failure that outlasts the retries means the rows went to other
    #: claimers ("serializable"): the claim returns ``[]`` instead of raising it
    conflict_means_taken = False

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

    def claim(self, r: ClaimRequest) -> list[models.Model]:
        """Claim up to ``r.n`` rows of ``r.qs`` (:class:`~.request.ClaimRequest`). Its
        ``cache_key`` (set when ``r.qs`` carries no filters of the caller's) lets a strategy
        reuse the SQL it compiled before."""
        raise NotImplementedError


def claim_updates(opts: ClaimOptions, lease: float, worker: str) -> dict[str, Any]:
    """The ORM form of the SET clause of a claim (its optional fields: ``RESETS``,
    :mod:`django_taskclaim.claim.resets`)."""
    return {
        opts.status_field: opts.value("processing"),
        "version": F("version") + 1,
        "attempts": F("attempts") + 1,
        "locked_until": DbNow() + timedelta(seconds=lease),
        **writes(opts, Change.CLAIM, holder=worker),
    }


#: Set on each claimed instance: whether the row came back from a holder that lost it
#: (its lease expired, or its worker was proven dead). Near its last attempt such a row is
#: run alone; see :func:`was_recovered`.
RECOVERED_ATTR = "_taskclaim_recovered"


def was_recovered(task: Any) -> bool:
    """Whether this claim took a row recovered from a lost holder (lease expired, or
    worker proven dead) rather than a row that was never lost.

    A recovered row is ``ready`` with its ``locked_until`` still set to the end of the
    lease that was lost (rows never lost have ``locked_until = NULL`` while ready). The
    worker runs such a row in batches while a second crash would still leave it an attempt
    to spare, else alone, after the other results are written, so that a task that kills
    its worker never sends its batch-mates to ``failed``.
    """
    return bool(getattr(task, RECOVERED_ATTR, False))


def _sort(rows: list[models.Model], ordering: tuple[str, ...]) -> list[models.Model]:
    """Order claimed rows as the claim's ORDER BY did (``NULL`` last either way, as
    :func:`claim_order` asks the database for). Never raises on ``NULL`` values."""
    if len(rows) < 2:  # nothing to order (a claim of one row: the hot path at batch 1)
        return rows
    # Ties in ``ordering`` come back in pk order (a claimed row always has its pk).
    rows.sort(key=attrgetter(rows[0]._meta.pk.attname))
    for item in reversed(ordering):
        get = attrgetter("pk" if item.lstrip("-") == "pk" else item.lstrip("-"))
        desc = item.startswith("-")
        present = [r for r in rows if get(r) is not None]
        absent = [r for r in rows if get(r) is None]
        present.sort(key=get, reverse=desc)
        rows[:] = present + absent
    return rows


def apply_claim(row: Any, opts: ClaimOptions, until: Any, worker: str) -> None:
    """Set on ``row`` in memory what the claim's UPDATE wrote (status, version, attempts,
    lease, holder), for the strategies whose database cannot return the written row."""
    setattr(row, opts.status_field, opts.value("processing"))
    row.version += 1
    row.attempts += 1
    row.locked_until = until
    apply_in_memory(row, plan(opts, Change.CLAIM), holder=worker)


def _mark_recovered(rows: list[Any], recovered: set[Any]) -> list[Any]:
    for row in rows:
        if row.pk in recovered:
            setattr(row, RECOVERED_ATTR, True)
    return rows


def column(model: type[models.Model], name: str, qn: Any) -> str:
    """The quoted column of field ``name`` (its ``db_column`` if it has one)."""
    field = model._meta.pk if name == "pk" else model._meta.get_field(name)
    if not isinstance(field, models.Field) or not field.column:
        raise ConfigurationError(f"{model._meta.label}.{name} is not a concrete column")
    return str(qn(field.column))


_COLUMNS: dict[tuple[type[models.Model], str], tuple[ClaimOptions, ClaimColumns]] = {}


def claim_columns(model: type[models.Model], opts: ClaimOptions, conn: Any) -> ClaimColumns:
    """The model's table and claim columns quoted for ``conn`` (``db_column`` honoured).
    Kept per model and database alias while the model's options are the same object
    (options are rebuilt when settings change)."""
    key = (model, conn.alias)
    kept = _COLUMNS.get(key)
    if kept is not None and kept[0] is opts:
        return kept[1]
    found = _claim_columns(model, opts, conn)
    _COLUMNS[key] = (opts, found)
    return found


def _claim_columns(model: type[models.Model], opts: ClaimOptions, conn: Any) -> ClaimColumns:
    qn = conn.ops.quote_name
    table = qn(model._meta.db_table)
    return ClaimColumns(
        table=table,
        pk=column(model, "pk", qn),
        status=qn(opts.status_column),
        version=column(model, "version", qn),
        attempts=column(model, "attempts", qn),
        locked_until=column(model, "locked_until", qn),
        claim_writes=_column_writes(model, opts, qn, Change.CLAIM),
        complete_writes=_column_writes(model, opts, qn, Change.COMPLETE),
        returning=", ".join(f"{table}.{qn(f.column)}" for f in model._meta.concrete_fields),
        status_type=str(
            cast(models.Field, model._meta.get_field(opts.status_field)).cast_db_type(conn)
        ),
    )


def _column_writes(
    model: type[models.Model], opts: ClaimOptions, qn: Any, change: Change
) -> tuple[tuple[str, str], ...]:
    """What the vendor statement of ``change`` writes to the optional columns: the
    quoted column and the :class:`~django_taskclaim.claim.resets.Write` value, from
    :data:`~django_taskclaim.claim.resets.RESETS`."""
    return tuple((column(model, name, qn), str(what)) for name, _, what in plan(opts, change))


def claim_order(opts: ClaimOptions, using: str) -> tuple[str, ...]:
    """The ORDER BY of a claim: ``ClaimMeta.ordering``, plus ``pk`` as the last tie-break
    where that costs nothing and keeps insertion order: an auto-increment pk on InnoDB and
    SQLite (which append it to every index entry). Not on PostgreSQL, whose claim index
    does not hold the pk, and not for other primary keys (a UUID would order rows
    enqueued together at random): there, ties come in index order (PostgreSQL: heap
    order; SQLite: rowid order — insertion order for rows inserted together)."""
    ordering = opts.ordering
    free = for_alias(using).pk_tie_break_is_free and isinstance(
        opts.model._meta.pk, models.fields.AutoFieldMixin
    )
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


def candidates(qs: models.QuerySet, opts: ClaimOptions, limit: int) -> models.QuerySet:
    """The candidate rows of a claim: ``(pk, locked_until)`` in claim order, at most ``limit``.

    ``locked_until`` of a ``ready`` row is set only on a row recovered from a lost holder
    (see :func:`was_recovered`)."""
    return qs.order_by(*_order_by(opts, qs.db)).values("pk", "locked_until")[:limit]


def read_claimed(base: models.QuerySet, opts: ClaimOptions, won: dict[Any, int]) -> list[Any]:
    """Re-read the rows a compare-and-set claim won, each only if it still carries the
    token that claim wrote (``pk = ? AND version = ?`` and ``processing``).

    A row released and re-claimed by another worker between the UPDATE and this read
    comes back with another token and is left out: the caller never gets an instance
    carrying someone else's token (its fenced writes would win over the real holder)."""
    return list(base.filter(held_q(opts, won.items())))
