"""Claims of a model with a concurrency key (``ClaimMeta.concurrency_key``).

At most ``concurrency_limit`` rows are ``processing`` per key value: a unique constraint
that follows the status enforces it (see :mod:`django_taskclaim.model.concurrency_keys`). The
claims here keep clear of it in the common case — candidates skip the keys already at
their limit, and one claim takes at most the free slots of a key, first rows first —
and when two claimers race for the same key, the constraint makes the later claim
fail: that exact violation is caught and the claim is run again (bounded), by then
seeing the winner's rows, so it leaves that key alone.

Models without a key never come here: their claims are unchanged.

The pieces the claims share (the constraint, the candidates, the slot picking) are in
:mod:`django_taskclaim.claim.key_slots`.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any, cast

from django.db import IntegrityError, connections, models, transaction
from django.db.models import F, IntegerField, Value

from django_taskclaim.backends import PostgreSQL, Statement, for_alias, for_connection
from django_taskclaim.capped import CappedCache
from django_taskclaim.claim.base import (
    _mark_recovered,
    _sort,
    apply_claim,
    claim_columns,
    read_claimed,
)
from django_taskclaim.claim.key_slots import (
    _ahead,
    _busy,
    _by_slot,
    _first_first,
    _keyed_order_names,
    _pick,
    _updates,
    guard,
    is_key_conflict,
    keyed_candidates,
)
from django_taskclaim.claim.statements import (
    _instances,
    claim_gate,
    compile_queryset,
    fetch_claimed,
)
from django_taskclaim.config.claim_meta import SLOT_FIELD
from django_taskclaim.config.settings import taskclaim_settings
from django_taskclaim.db import DbNow
from django_taskclaim.exceptions import StrategyNotSupportedError
from django_taskclaim.rules import status_recheck

if TYPE_CHECKING:
    from django_taskclaim.claim.request import ClaimRequest
    from django_taskclaim.config.claim_meta import Concurrency
    from django_taskclaim.config.options import ClaimOptions

#: Claims run again after losing a race for a key to another claimer; after these, the
#: claim returns what it has (maybe nothing) and the caller claims again later.
CONFLICT_RETRIES = 8


def retry_key_conflicts(fn: Callable[[], list[Any]], opts: ClaimOptions, using: str) -> list[Any]:
    """Run the claim ``fn`` again (at most :data:`CONFLICT_RETRIES` times) while it fails
    on the model's concurrency constraint; ``[]`` when it never got through. Any other
    error is raised."""
    for _attempt in range(CONFLICT_RETRIES):
        try:
            return fn()
        except IntegrityError as exc:
            if not is_key_conflict(exc, opts, using):
                raise
    return []


# -- PostgreSQL: one statement --------------------------------------------------------


_COMPILED: CappedCache[tuple[Any, ...], tuple[str, tuple[Any, ...], tuple[bool, ...]]] = (
    CappedCache()
)


def _compiled(
    qs: models.QuerySet, opts: ClaimOptions, limit: int, cache_key: tuple[Any, ...] | None
) -> tuple[str, tuple[Any, ...], tuple[bool, ...]]:
    """The keyed candidates SELECT: ``pk``, ``locked_until``, the key, how many
    claimable rows of its key come before it (``None`` where not compared, see
    :func:`_ahead`), the claim order columns; with whether each order column sorts
    descending. Kept per ``cache_key``."""
    key = None if cache_key is None else (*cache_key, "keyed", limit)
    hit = _COMPILED.get(key) if key is not None else None
    if hit is None:
        conc = cast("Concurrency", opts.concurrency)
        order = _keyed_order_names(opts, qs.db)
        extra = {f"_tc_o{i}": F(item.lstrip("-")) for i, item in enumerate(order)}
        ahead = _ahead(qs, opts)
        cands = (
            keyed_candidates(qs, opts)
            .annotate(
                _tc_key=F(conc.key),
                _tc_ahead=ahead if ahead is not None else Value(None, IntegerField()),
                **extra,
            )
            .values("pk", "locked_until", "_tc_key", "_tc_ahead", *extra)[:limit]
        )
        sql, params = compile_queryset(cands)
        hit = (sql, params, tuple(item.startswith("-") for item in order))
        if key is not None:
            _COMPILED.put(key, hit)
    return hit


def claim_one_statement(r: ClaimRequest, *, lock: str) -> list[models.Model]:
    """PostgreSQL: the keyed claim in one statement (:meth:`PostgreSQL.claim_keyed`).
    ``lock``: ``"skip_locked"`` (candidates ``FOR UPDATE SKIP LOCKED``), ``"advisory"``
    (no row lock: the UPDATE re-checks the status, the constraint the key) or ``""``
    (``serializable``: its transaction detects the conflicts)."""
    qs, n, opts, lease, worker, cache_key = r.qs, r.n, r.opts, r.lease, r.worker, r.cache_key
    conn = connections[qs.db]
    backend = cast(PostgreSQL, for_connection(conn))
    conc = cast("Concurrency", opts.concurrency)
    guard(opts)
    sql, params, descending = _compiled(qs, opts, n, cache_key)
    if lock == "skip_locked":
        sql += " " + conn.ops.for_update_sql(
            skip_locked=True, of=(conn.ops.quote_name(qs.model._meta.db_table),)
        )
    qn = conn.ops.quote_name
    statement = backend.claim_keyed(
        claim_columns(qs.model, opts, conn),
        Statement(sql, params),
        key=qn(conc.column),
        slot=qn(conc.slot) if conc.slot is not None else None,
        limit=conc.limit,
        descending=descending,
        processing=opts.value("processing"),
        ready=opts.value("ready"),
        lease=lease,
        worker=worker,
    )

    gate = claim_gate(qs, opts, n)

    def run() -> list[models.Model]:
        fetched = fetch_claimed(conn, statement, gate)
        tasks = _instances(qs.model, qs.db, [row[:-1] for row in fetched])
        recovered = {t.pk for t, row in zip(tasks, fetched, strict=True) if row[-1]}
        return _sort(_mark_recovered(tasks, recovered), opts.ordering)

    if lock == "":  # serializable: the caller's transaction; one try, retried by it
        return run()
    return retry_key_conflicts(run, opts, qs.db)


# -- MySQL / MariaDB: a short transaction ---------------------------------------------


def claim_locked_in_transaction(r: ClaimRequest) -> list[models.Model]:
    """``skip_locked`` without ``UPDATE … RETURNING``: lock the first ``n`` candidates
    (``SKIP LOCKED``), read the slots their keys hold, pick per key, write the picked rows
    (one UPDATE per slot number), in one short transaction."""
    qs, n, opts, lease, worker = r.qs, r.n, r.opts, r.lease, r.worker
    conn = connections[qs.db]
    of = ("self",) if conn.features.has_select_for_update_of else ()
    conc = cast("Concurrency", opts.concurrency)
    guard(opts)
    base = qs.model._base_manager.using(qs.db)

    ahead = _ahead(qs, opts)
    cands = keyed_candidates(qs, opts)
    if ahead is not None:
        cands = cands.annotate(_tc_ahead=ahead)

    def run() -> list[models.Model]:
        with transaction.atomic(using=qs.db):
            rows = list(
                cands.defer(None)
                .select_for_update(skip_locked=True, of=of)
                .annotate(_taskclaim_now=DbNow())[:n]
            )
            if not rows:
                return []
            attname = opts.model._meta.get_field(conc.key).attname  # type: ignore[union-attr]
            keys = [getattr(r, attname) for r in rows]
            recovered = {r.pk for r in rows if r.locked_until is not None}
            slots = _pick(keys, _busy(base, opts, keys), conc)
            if ahead is not None:
                slots = _first_first(rows, keys, slots)
            until = rows[0]._taskclaim_now + timedelta(seconds=lease)
            for number, pks in _by_slot([r.pk for r in rows], slots).items():
                updates = _updates(opts, lease, worker, number)
                updates["locked_until"] = until
                done = base.filter(pk__in=pks).filter(opts.status_q("ready")).update(**updates)
                if done != len(pks):  # pragma: no cover - rows are locked by this transaction
                    raise transaction.TransactionManagementError(
                        "locked rows changed under a claim; rolled back"
                    )
        won = []
        for row, slot in zip(rows, slots, strict=True):
            del row._taskclaim_now
            row.__dict__.pop("_tc_ahead", None)
            if slot is None:
                continue
            apply_claim(row, opts, until, worker)
            if conc.slot is not None:
                setattr(row, SLOT_FIELD, slot)
            won.append(row)
        return _mark_recovered(won, recovered)

    return retry_key_conflicts(run, opts, qs.db)


# -- compare-and-set ------------------------------------------------------------------


def claim_one_writer(r: ClaimRequest) -> list[models.Model]:
    """SQLite (one writer at a time): read candidates and held slots, then one
    ``UPDATE … RETURNING`` per slot number, all in one transaction."""
    qs, n, opts, lease, worker = r.qs, r.n, r.opts, r.lease, r.worker
    conc = cast("Concurrency", opts.concurrency)
    guard(opts)
    base = qs.model._base_manager.using(qs.db)
    k = min(10_000, max(n, int(taskclaim_settings.CAS_CANDIDATES), 4 * n))

    def run() -> list[models.Model]:
        rows: list[models.Model] = []
        with transaction.atomic(using=qs.db):
            picked = list(
                keyed_candidates(qs, opts)
                .annotate(_tc_key=F(conc.key))
                .values_list("pk", "locked_until", "_tc_key")[:k]
            )
            if not picked:
                return []
            keys = [p[2] for p in picked]
            slots = _pick(keys, _busy(base, opts, keys), conc)
            chosen = [(p, s) for p, s in zip(picked, slots, strict=True) if s is not None][:n]
            for s, pks in _by_slot([p[0] for p, _ in chosen], [s for _, s in chosen]).items():
                target = base.filter(pk__in=pks).filter(opts.status_q("ready"))
                query = target.query.chain(models.sql.UpdateQuery)
                query.add_update_values(_updates(opts, lease, worker, s))
                update_sql, params = query.get_compiler(qs.db).as_sql()
                rows += list(base.raw(for_alias(qs.db).returning_all_sql(update_sql), params))
        recovered = {p[0] for p, _ in chosen if p[1] is not None}
        return _sort(_mark_recovered(rows, recovered), opts.ordering)

    return retry_key_conflicts(run, opts, qs.db)


def claim_compare_and_set(r: ClaimRequest) -> list[models.Model]:
    """Every database: read candidates and held slots, then one compare-and-set
    ``UPDATE`` per picked row (its slot written with it). A row that meets the
    constraint (another claimer took that key slot first) is skipped with the rest of
    its key."""
    qs, n, opts, lease, worker = r.qs, r.n, r.opts, r.lease, r.worker
    conc = cast("Concurrency", opts.concurrency)
    guard(opts)
    base = qs.model._base_manager.using(qs.db)
    k = min(10_000, max(n, int(taskclaim_settings.CAS_CANDIDATES), 4 * n))
    won: dict[Any, int] = {}
    recovered: set[Any] = set()
    rows = list(
        keyed_candidates(qs, opts)
        .annotate(_tc_key=F(conc.key))
        .values_list("pk", "version", "locked_until", "_tc_key")[:k]
    )
    keys = [r[3] for r in rows]
    slots = _pick(keys, _busy(base, opts, keys), conc)
    lost: set[Any] = set()
    for (pk, version, prev, key), s in zip(rows, slots, strict=True):
        if len(won) >= n:
            break
        if s is None or (key is not None and key in lost):
            continue
        try:
            hit = (
                base.filter(pk=pk, version=version)
                .filter(status_recheck(opts, "ready", qs.db))
                .update(**_updates(opts, lease, worker, s))
            )
        except IntegrityError as exc:
            if not is_key_conflict(exc, opts, qs.db):
                raise
            hit = 0
        if hit == 1:
            won[pk] = version + 1
            if prev is not None:
                recovered.add(pk)
        elif key is not None:
            lost.add(key)
    if not won:
        return []
    return _sort(_mark_recovered(read_claimed(base, opts, won), recovered), opts.ordering)


def refuse_hold(opts: ClaimOptions) -> None:
    """``hold`` keeps its claim uncommitted for the whole job, so a second claimer of the
    same key would wait on the constraint for as long: refused with a key."""
    raise StrategyNotSupportedError(
        f"{opts.label} has a concurrency_key: strategy 'hold' cannot be used with it; "
        "use 'skip_locked' or 'auto'"
    )
