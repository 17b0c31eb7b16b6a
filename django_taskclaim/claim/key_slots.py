"""The pieces every keyed claim shares (``ClaimMeta.concurrency_key``).

The unique constraint that enforces a model's key (:func:`guard`) and telling its
violation apart from any other (:func:`is_key_conflict`); the candidates of keys that
still have a free slot, in claim order with ``pk`` last (:func:`keyed_candidates`);
which slot each candidate takes (:func:`_pick`, from the slots held now, :func:`_busy`)
and, where a claim locks its candidates, how many rows of each key come before one
(:func:`_ahead`, :func:`_first_first`). The claims themselves are in
:mod:`django_taskclaim.claim.keyed`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

from django.db import IntegrityError, models
from django.db.models import Count, Exists, F, OuterRef, Q, Subquery, Value
from django.db.models.functions import Coalesce

from django_taskclaim.backends import for_alias
from django_taskclaim.claim.base import _order_by, claim_order, claim_updates
from django_taskclaim.claim.guard import ConcurrencyGuard, guard_of
from django_taskclaim.config.claim_meta import SLOT_FIELD
from django_taskclaim.exceptions import ConfigurationError

if TYPE_CHECKING:
    from django_taskclaim.config.claim_meta import Concurrency
    from django_taskclaim.config.options import ClaimOptions

_GUARDS: dict[type[models.Model], ConcurrencyGuard] = {}


def guard(opts: ClaimOptions) -> ConcurrencyGuard:
    """The model's enforcing constraint; :class:`ConfigurationError` when it has none
    (the system check ``taskclaim.E032`` says the same): a key no database constraint
    enforces is never claimed."""
    found = _GUARDS.get(opts.model)
    if found is None:
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


def _held(base: models.QuerySet, opts: ClaimOptions) -> models.QuerySet:
    """The rows holding a key: ``processing`` ones. With a generated held column (NULL
    unless processing) a lookup on it says so already, and no status filter is added:
    one would match the lease index's predicate too, and the planner may then combine
    that whole index with the held column's for every candidate."""
    if guard(opts).partial:
        return base.filter(opts.status_q("processing"))
    return base


def keyed_candidates(qs: models.QuerySet, opts: ClaimOptions) -> models.QuerySet:
    """``qs`` without the rows whose key is at its limit (counted over every
    ``processing`` row of the model, whatever the caller's filters), in claim order
    (``pk`` last). The busy rows are looked up through the constraint's own field, so
    its index serves the lookup."""
    conc = cast("Concurrency", opts.concurrency)
    base = qs.model._base_manager.using(qs.db)
    busy = _held(base, opts).filter(**{guard(opts).held: OuterRef(conc.key)})
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
    conc = cast("Concurrency", opts.concurrency)
    wanted = {k for k in keys if k is not None}
    if not wanted:
        return {}
    slot = F(SLOT_FIELD) if conc.slot is not None else Value(0)
    rows = (
        _held(base, opts)
        .filter(**{f"{guard(opts).held}__in": wanted})
        .annotate(_tc_key=F(conc.key), _tc_slot=slot)
        .values_list("_tc_key", "_tc_slot")
    )
    busy: dict[Any, set[int]] = defaultdict(set)
    for key, s in rows:
        busy[key].add(s)
    return busy


def _updates(opts: ClaimOptions, lease: float, worker: str, slot: int) -> dict[str, Any]:
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
