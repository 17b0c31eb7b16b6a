"""Claims of a model with a concurrency key (``ClaimMeta.concurrency_key``).

At most ``concurrency_limit`` rows are ``processing`` per key value: a unique constraint
that follows the status enforces it (see :mod:`django_taskclaim.concurrency`). The
claims here keep clear of it in the common case — candidates skip the keys already at
their limit, and one claim takes at most the free slots of a key, first rows first —
and when two claimers race for the same key, the constraint makes the later claim
fail: that exact violation is caught and the claim is run again (bounded), by then
seeing the winner's rows, so it leaves that key alone.

Models without a key never come here: their claims are unchanged.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, cast

from django.db import IntegrityError, connections, models, transaction
from django.db.models import Count, Exists, F, IntegerField, OuterRef, Q, Subquery, Value
from django.db.models.functions import Coalesce

from ..backends import PostgreSQL, Statement, for_alias, for_connection
from ..conf import taskclaim_settings
from ..db import DbNow
from ..exceptions import ConfigurationError, StrategyNotSupportedError
from .base import _mark_recovered, _order_by, _sort, claim_columns, claim_order, claim_updates
from .statements import _instances, compile_queryset

if TYPE_CHECKING:
    from ..concurrency import ConcurrencyGuard
    from ..options import ClaimOptions, Concurrency

#: Claims run again after losing a race for a key to another claimer; after these, the
#: claim returns what it has (maybe nothing) and the caller claims again later.
CONFLICT_RETRIES = 8

_GUARDS: dict[type[models.Model], ConcurrencyGuard] = {}


def guard(opts: ClaimOptions) -> ConcurrencyGuard:
    """The model's enforcing constraint; :class:`ConfigurationError` when it has none
    (the system check ``taskclaim.E032`` says the same): a key no database constraint
    enforces is never claimed."""
    found = _GUARDS.get(opts.model)
    if found is None:
        from ..concurrency import guard_of

        found = guard_of(opts.model)
        if found is None:
            conc = cast("Concurrency", opts.concurrency)
            raise ConfigurationError(
                f"{opts.label} declares concurrency_key {conc.key!r} but no unique "
                "constraint enforces it; see manage.py check (taskclaim.E032)"
            )
        _GUARDS[opts.model] = found
    return found


def is_key_conflict(exc: BaseException, opts: ClaimOptions, using: str) -> bool:
    """Whether ``exc`` is the violation of the model's concurrency constraint (and of
    nothing else): another claimer took the same key slot first."""
    if not isinstance(exc, IntegrityError):
        return False
    g = guard(opts)
    return for_alias(using).is_unique_violation(
        exc.__cause__ or exc, table=g.table, constraint=g.name, columns=g.columns
    )


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


def keyed_candidates(qs: models.QuerySet, opts: ClaimOptions) -> models.QuerySet:
    """``qs`` without the rows whose key is at its limit (counted over every
    ``processing`` row of the model, whatever the caller's filters), in claim order
    (``pk`` last). The busy rows are looked up through the constraint's own field, so
    its index serves the lookup."""
    conc = cast("Concurrency", opts.concurrency)
    base = qs.model._base_manager.using(qs.db)
    busy = base.filter(opts.status_q("processing")).filter(**{guard(opts).held: OuterRef(conc.key)})
    if conc.limit == 1:
        qs = qs.filter(~Exists(busy))
    else:
        count = busy.order_by().values(conc.key).annotate(_tc_n=Count("pk")).values("_tc_n")
        qs = qs.alias(_tc_busy=Coalesce(Subquery(count), 0)).filter(_tc_busy__lt=conc.limit)
    return qs.order_by(*_keyed_order(opts, qs.db))


def _keyed_order(opts: ClaimOptions, using: str) -> list[Any]:
    """The claim order with ``pk`` as its last tie-break on every database: FIFO within
    a key holds by ``pk`` even where the claim index leaves ties to the plan (a sort of
    tied rows, unlike an index scan, has no fixed order)."""
    order = _order_by(opts, using)
    if "pk" not in {item.lstrip("-") for item in claim_order(opts, using)}:
        order.append("pk")
    return order


def _keyed_order_names(opts: ClaimOptions, using: str) -> tuple[str, ...]:
    names = claim_order(opts, using)
    if "pk" not in {item.lstrip("-") for item in names}:
        names = (*names, "pk")
    return names


def _pick(keys: Sequence[Any], busy: dict[Any, set[int]], conc: Concurrency) -> list[int | None]:
    """Per candidate (in claim order), the slot it takes, or ``None`` when its key has
    no free slot left. A ``NULL`` key is not limited (slot 0)."""
    taken: dict[Any, set[int]] = defaultdict(set)
    out: list[int | None] = []
    for key in keys:
        if key is None:
            out.append(0)
            continue
        used = busy.get(key, set()) | taken[key]
        free = next((s for s in range(conc.limit) if s not in used), None)
        if conc.slot is None and (key in busy or taken[key]):
            free = None
        if free is not None:
            taken[key].add(free)
        out.append(free)
    return out


def _busy(base: models.QuerySet, opts: ClaimOptions, keys: Sequence[Any]) -> dict[Any, set[int]]:
    """The slots held now by ``processing`` rows of these key values."""
    from ..options import SLOT_FIELD

    conc = cast("Concurrency", opts.concurrency)
    wanted = {k for k in keys if k is not None}
    if not wanted:
        return {}
    slot = F(SLOT_FIELD) if conc.slot is not None else Value(0)
    rows = (
        base.filter(opts.status_q("processing"))
        .filter(**{f"{guard(opts).held}__in": wanted})
        .annotate(_tc_key=F(conc.key), _tc_slot=slot)
        .values_list("_tc_key", "_tc_slot")
    )
    busy: dict[Any, set[int]] = defaultdict(set)
    for key, s in rows:
        busy[key].add(s)
    return busy


def _updates(opts: ClaimOptions, lease: float, worker: str, slot: int) -> dict[str, Any]:
    from ..options import SLOT_FIELD

    updates = claim_updates(opts, lease, worker)
    if cast("Concurrency", opts.concurrency).slot is not None:
        updates[SLOT_FIELD] = slot
    return updates


def _by_slot(pks: Sequence[Any], slots: Sequence[int | None]) -> dict[int, list[Any]]:
    groups: dict[int, list[Any]] = defaultdict(list)
    for pk, s in zip(pks, slots, strict=True):
        if s is not None:
            groups[s].append(pk)
    return groups


# -- PostgreSQL: one statement --------------------------------------------------------


_COMPILED: dict[tuple[Any, ...], tuple[str, tuple[Any, ...], tuple[bool, ...]]] = {}


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
            if len(_COMPILED) >= 512:
                _COMPILED.clear()
            _COMPILED[key] = hit
    return hit


def claim_one_statement(
    qs: models.QuerySet,
    n: int,
    *,
    opts: ClaimOptions,
    lease: float,
    worker: str,
    cache_key: tuple[Any, ...] | None,
    lock: str,
) -> list[models.Model]:
    """PostgreSQL: the keyed claim in one statement (:meth:`PostgreSQL.claim_keyed`).
    ``lock``: ``"skip_locked"`` (candidates ``FOR UPDATE SKIP LOCKED``), ``"advisory"``
    (no row lock: the UPDATE re-checks the status, the constraint the key) or ``""``
    (``serializable``: its transaction detects the conflicts)."""
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

    def run() -> list[models.Model]:
        with conn.cursor() as cursor:
            cursor.execute(statement.sql, statement.params)
            fetched = cursor.fetchall()
        tasks = _instances(qs.model, qs.db, [row[:-1] for row in fetched])
        recovered = {t.pk for t, row in zip(tasks, fetched, strict=True) if row[-1]}
        return _sort(_mark_recovered(tasks, recovered), opts.ordering)

    if lock == "":  # serializable: the caller's transaction; one try, retried by it
        return run()
    return retry_key_conflicts(run, opts, qs.db)


# -- MySQL / MariaDB: a short transaction ---------------------------------------------


def claim_locked_in_transaction(
    qs: models.QuerySet, n: int, *, opts: ClaimOptions, lease: float, worker: str
) -> list[models.Model]:
    """``skip_locked`` without ``UPDATE … RETURNING``: lock the first ``n`` candidates
    (``SKIP LOCKED``), read the slots their keys hold, pick per key, write the picked rows
    (one UPDATE per slot number), in one short transaction."""
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
        for r, slot in zip(rows, slots, strict=True):
            del r._taskclaim_now
            r.__dict__.pop("_tc_ahead", None)
            if slot is None:
                continue
            setattr(r, opts.status_field, opts.value("processing"))
            r.version += 1
            r.attempts += 1
            r.locked_until = until
            if opts.has("locked_by"):
                r.locked_by = worker
            if conc.slot is not None:
                from ..options import SLOT_FIELD

                setattr(r, SLOT_FIELD, slot)
            won.append(r)
        return _mark_recovered(won, recovered)

    return retry_key_conflicts(run, opts, qs.db)


def _ahead(qs: models.QuerySet, opts: ClaimOptions) -> Any:
    """Per candidate: how many rows of ``qs`` with its key come before it in claim
    order, as an ORM expression; ``None`` when an order field is nullable (not
    compared)."""
    conc = cast("Concurrency", opts.concurrency)
    before = Q()
    equal: dict[str, Any] = {}
    for item in _keyed_order_names(opts, qs.db):
        name = item.lstrip("-")
        field = opts.model._meta.pk if name == "pk" else opts.model._meta.get_field(name)
        if getattr(field, "null", False):
            return None
        lookup = "gt" if item.startswith("-") else "lt"
        before |= Q(**equal, **{f"{name}__{lookup}": OuterRef(name)})
        equal[name] = OuterRef(name)
    count = (
        qs.filter(**{conc.key: OuterRef(conc.key)})
        .filter(before)
        .order_by()
        .values(conc.key)
        .annotate(_tc_n=Count("pk"))
        .values("_tc_n")
    )
    return Coalesce(Subquery(count), 0)


def _first_first(
    rows: Sequence[Any], keys: Sequence[Any], slots: list[int | None]
) -> list[int | None]:
    """``slots`` less the rows of a key that has a row ahead of them this claim did not
    get (locked by another claim that may still give it back): rows of one key are
    claimed first first, whatever another claim does."""
    seen: dict[Any, int] = defaultdict(int)
    blocked: set[Any] = set()
    out = list(slots)
    for i, (row, key) in enumerate(zip(rows, keys, strict=True)):
        if key is None:
            continue
        if key in blocked or row._tc_ahead != seen[key]:
            blocked.add(key)
            out[i] = None
        seen[key] += 1
    return out


# -- compare-and-set ------------------------------------------------------------------


def claim_one_writer(
    qs: models.QuerySet, n: int, *, opts: ClaimOptions, lease: float, worker: str
) -> list[models.Model]:
    """SQLite (one writer at a time): read candidates and held slots, then one
    ``UPDATE … RETURNING`` per slot number, all in one transaction."""
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


def claim_compare_and_set(
    qs: models.QuerySet, n: int, *, opts: ClaimOptions, lease: float, worker: str
) -> list[models.Model]:
    """Every database: read candidates and held slots, then one compare-and-set
    ``UPDATE`` per picked row (its slot written with it). A row that meets the
    constraint (another claimer took that key slot first) is skipped with the rest of
    its key."""
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
                .filter(opts.status_q("ready"))
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
    from .cas import read_claimed

    return _sort(_mark_recovered(read_claimed(base, opts, won), recovered), opts.ordering)


def refuse_hold(opts: ClaimOptions) -> None:
    """``hold`` keeps its claim uncommitted for the whole job, so a second claimer of the
    same key would wait on the constraint for as long: refused with a key."""
    raise StrategyNotSupportedError(
        f"{opts.label} has a concurrency_key: strategy 'hold' cannot be used with it; "
        "use 'skip_locked' or 'auto'"
    )
