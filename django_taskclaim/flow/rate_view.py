"""What an operator sees of the rate limits (docs/rate-limits.md): per rate-limited model
and per ring (the model, one queue, one concurrency-key value), the limit as written, the
starts in the current window, whether it is at its limit and when its next slot frees.

Read-only, database clock: one read of each database's clock, one aggregate query per
model over the slot rows (``taskclaim.RateSlot``) of its model and queue rings, and one
over the slots of its key rings used within the window (the index ``(model,
last_start)``: what it reads grows with the starts in the window, never with the keys
ever seen), never its task rows. Per-key rings are summed up (:class:`KeyRings`) and only
the :data:`KEY_RINGS` busiest are listed. Shown by the admin dashboard, ``manage.py
taskclaim_stats`` and the metrics (``taskclaim_rate_limit_starts``,
``taskclaim_rate_limit``, ``taskclaim_rate_limit_keys_busy``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import models, router
from django.db.models import Count, Min, Q

from django_taskclaim.claim.rate import ring_scope
from django_taskclaim.config.discovery import claimable_models, resolve_model
from django_taskclaim.config.options import get_options
from django_taskclaim.config.rate_limits import RateLimit
from django_taskclaim.db import db_now
from django_taskclaim.exceptions import ConfigurationError
from django_taskclaim.models import RateSlot

__all__ = [
    "KEY_RINGS",
    "KeyRings",
    "RateRing",
    "RatedModel",
    "describe",
    "describe_keys",
    "rate_report",
    "rate_view",
]

#: How a per-value ring's scope begins, per ``RateLimit.per`` (``claim.rate.ring_scope``).
_PREFIX = {"queue": "queue:", "key": "key:"}
#: How the ring of a ``None`` value is shown.
_NULL_SHOWN = "(null)"
#: Ring order: the model's ring, then the queues', then the keys'.
_ORDER = {"model": 0, "queue": 1, "key": 2}
#: Per-key rings listed per model, the busiest (at their limit first, then by starts):
#: keys are unbounded, what an operator's read returns of them must not be.
KEY_RINGS = 20


@dataclass(frozen=True)
class RateRing:
    """One ring of one rate limit at one moment (database clock)."""

    model: str
    #: the ring's stored scope: ``""`` (the whole model), ``queue:<name>``, ``key:<value>``
    scope: str
    #: ``"model"``, ``"queue"`` or ``"key"``
    per: str
    #: the queue name or key value (``""`` for the whole model; ``(null)`` for ``None``)
    value: str
    #: ``ClaimMeta`` option (``rate_limit`` / ``key_rate_limit``) and its text (``"100/m"``)
    option: str
    limit: str
    #: N, and the window in seconds
    count: int
    window: float
    #: starts whose claim time is within the last ``window`` seconds (at most ``count``)
    starts: int
    #: seconds until a slot frees: ``0.0`` while one is free now
    next_free: float

    @property
    def at_limit(self) -> bool:
        """Every slot was used within the window: a claim now gets no row of this ring."""
        return self.starts >= self.count

    @property
    def shown_scope(self) -> str:
        """The scope for people and labels: ``""``, ``queue:<name>``, ``key:<value>``
        (``(null)`` for a ``None`` value)."""
        return f"{_PREFIX[self.per]}{self.value}" if self.per in _PREFIX else ""

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: every field, ``scope`` as :attr:`shown_scope`, plus ``at_limit``
        and ``text`` (:func:`describe`)."""
        return {
            "model": self.model,
            "scope": self.shown_scope,
            "per": self.per,
            "value": self.value,
            "option": self.option,
            "limit": self.limit,
            "count": self.count,
            "window_seconds": self.window,
            "starts": self.starts,
            "at_limit": self.at_limit,
            "next_free_seconds": round(self.next_free, 3),
            "text": describe(self),
        }


@dataclass(frozen=True)
class KeyRings:
    """The per-key rings of one model's ``key_rate_limit`` at one moment (database
    clock), summed up: only rings with a start in the window are counted."""

    model: str
    option: str
    limit: str
    count: int
    window: float
    #: rings (keys) with at least one start in the window
    busy: int
    #: of those, rings whose every slot was used within the window
    at_limit: int
    #: starts in the window over all keys
    starts: int

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: every field plus ``text`` (:func:`describe_keys`)."""
        return {
            "model": self.model,
            "option": self.option,
            "limit": self.limit,
            "count": self.count,
            "window_seconds": self.window,
            "busy": self.busy,
            "at_limit": self.at_limit,
            "starts": self.starts,
            "text": describe_keys(self),
        }


@dataclass(frozen=True)
class RatedModel:
    """A rate-limited model: its limits and the rings to show: the model-wide ring
    always (with no start before its first claim), the queue rings that have slots, and
    the busiest :data:`KEY_RINGS` key rings with a start in the window (``keys`` sums
    them all up; ``None`` without ``key_rate_limit``)."""

    model: str
    name: str
    limits: tuple[RateLimit, ...]
    rings: tuple[RateRing, ...]
    keys: KeyRings | None = None


def _limits(model: type[models.Model]) -> tuple[RateLimit, ...]:
    """The model's rate limits; ``()`` when its options do not validate (the system
    checks and the first claim say why)."""
    try:
        return get_options(model).rate_limits
    except ConfigurationError:
        return ()


def _ring_q(lim: RateLimit) -> Q:
    """The slot rows of ``lim``'s rings that count (slot number below N)."""
    if lim.field is None:
        return Q(scope="", slot__lt=lim.count)
    return (Q(scope__startswith=_PREFIX[lim.per]) | Q(scope=ring_scope(lim, None))) & Q(
        slot__lt=lim.count
    )


def _value(scope: str, lim: RateLimit) -> str:
    if lim.field is None:
        return ""
    if scope == ring_scope(lim, None):
        return _NULL_SHOWN
    return scope[len(_PREFIX[lim.per]) :]


def _per_of(scope: str, limits: dict[str, RateLimit]) -> str | None:
    if scope == "":
        return "model" if "model" in limits else None
    for per, prefix in _PREFIX.items():
        if per in limits and (scope.startswith(prefix) or scope == ring_scope(limits[per])):
            return per
    return None


def _ring(
    label: str, scope: str, lim: RateLimit, row: Mapping[str, Any], now: datetime
) -> RateRing:
    starts = min(int(row["tc_starts"] or 0), lim.count)
    wait = 0.0
    if starts >= lim.count and row["tc_earliest"] is not None:
        frees = row["tc_earliest"] + timedelta(seconds=lim.window)
        wait = max(0.0, (frees - now).total_seconds())
    return RateRing(
        label, scope, lim.per, _value(scope, lim), lim.option, lim.text,
        lim.count, lim.window, starts, wait,
    )  # fmt: skip


def key_slots_in_window(
    model: type[models.Model], lim: RateLimit, now: datetime, using: str
) -> Any:
    """The query of the key rings of ``lim`` (a ``key_rate_limit``) with a start in the
    window before ``now``: per ring, its starts and its earliest one. Reads only the
    slots used within the window, through the index ``(model, last_start)``."""
    recent = now - timedelta(seconds=lim.window)
    return (
        RateSlot.objects.using(using)
        .filter(Q(model=model._meta.label, last_start__gte=recent) & _ring_q(lim))
        .values("scope")
        .annotate(tc_starts=Count("pk"), tc_earliest=Min("last_start"))
        .order_by()
    )


def _model_rings(
    model: type[models.Model], limits: tuple[RateLimit, ...], now: datetime, using: str
) -> tuple[list[RateRing], KeyRings | None]:
    """The rings of ``model`` on ``using`` against the clock value ``now``: one
    aggregate query over the slots of its model and queue rings, one over those of its
    key rings used within the window; the busiest :data:`KEY_RINGS` key rings and the
    sum of them all."""
    label = model._meta.label
    by_per = {lim.per: lim for lim in limits}
    rings: list[RateRing] = []
    whole = [lim for lim in limits if lim.per != "key"]
    if whole:
        rings_q, starts_q = Q(), Q()
        for lim in whole:
            rings_q |= _ring_q(lim)
            # busy: used within the window (the claim's take frees ``last_start < now - w``)
            starts_q |= _ring_q(lim) & Q(last_start__gte=now - timedelta(seconds=lim.window))
        rows = (
            RateSlot.objects.using(using)
            .filter(Q(model=label) & rings_q)
            .values("scope")
            .annotate(tc_starts=Count("pk", filter=starts_q), tc_earliest=Min("last_start"))
            .order_by("scope")
        )
        for row in rows:
            scope = str(row["scope"])
            per = _per_of(scope, by_per)
            if per is None or per == "key":
                continue
            rings.append(_ring(label, scope, by_per[per], row, now))
    if "model" in by_per and not any(r.per == "model" for r in rings):
        lim = by_per["model"]  # not created yet: every slot free
        rings.append(
            RateRing(label, "", "model", "", lim.option, lim.text, lim.count, lim.window, 0, 0.0)
        )
    rings.sort(key=lambda r: (_ORDER[r.per], -r.starts, r.value))
    keys: KeyRings | None = None
    if "key" in by_per:
        lim = by_per["key"]
        busy = [
            _ring(label, str(row["scope"]), lim, row, now)
            for row in key_slots_in_window(model, lim, now, using)
            if _per_of(str(row["scope"]), by_per) == "key"
        ]
        busy.sort(key=lambda r: (not r.at_limit, -r.starts, r.value))
        keys = KeyRings(
            label, lim.option, lim.text, lim.count, lim.window,
            busy=len(busy),
            at_limit=sum(1 for r in busy if r.at_limit),
            starts=sum(r.starts for r in busy),
        )  # fmt: skip
        rings.extend(busy[:KEY_RINGS])
    return rings, keys


def _resolve(model: Any) -> type[models.Model]:
    return resolve_model(model) if isinstance(model, str) else model


def rate_view(
    targets: Iterable[Any] | None = None, *, using: str | None = None
) -> list[RatedModel]:
    """Every rate-limited model of ``targets`` (model classes or labels; default: every
    claimable model), by label, with its limits and rings, read now from ``using``
    (default: each model's write database, where its claims charge the slots).

    Per-key rings: only those with a start in the window, the busiest
    :data:`KEY_RINGS` of them (at their limit first, then by starts), and ``keys`` sums
    them all up; an idle key's ring (no start in its window: every slot free) is not
    read at all, so the cost does not grow with the keys ever seen.

    Guarantee: ``starts`` counts the ring's slots (those below N) whose last claim time
    is within the window before the database clock, the same test a claim applies
    (a claim now could take ``count - starts`` rows of that ring); ``next_free`` is the
    database-clock seconds until the earliest of them leaves the window when the ring is
    full, else ``0.0``. Per model at most two aggregate queries over its slot rows (plus
    one clock read per database); a ring of a limit the model no longer declares is left out.
    A model whose options do not validate is left out (the system checks name it).
    """
    chosen = claimable_models() if targets is None else [_resolve(m) for m in targets]
    clocks: dict[str, datetime] = {}
    out: list[RatedModel] = []
    for model in sorted(chosen, key=lambda m: m._meta.label):
        limits = _limits(model)
        if not limits:
            continue
        db = using or router.db_for_write(model)
        if db not in clocks:
            clocks[db] = db_now(db)
        rings, keys = _model_rings(model, limits, clocks[db], db)
        name = str(model._meta.verbose_name)
        out.append(RatedModel(model._meta.label, name, limits, tuple(rings), keys))
    return out


def describe(ring: RateRing) -> str:
    """One line about ``ring`` for operators: the model and scope, the limit as written,
    the starts in the window, and whether a slot is free or in how many seconds one
    frees (database clock)."""
    where = {"model": "", "queue": f" queue {ring.value}", "key": f" key {ring.value}"}
    text = (
        f"{ring.model}{where[ring.per]} {ring.limit}: {ring.starts} of {ring.count} "
        f"starts in the window"
    )
    if ring.at_limit:
        return text + f", at the limit, next slot frees in {ring.next_free:.1f}s"
    return text + f", {ring.count - ring.starts} free"


def describe_keys(keys: KeyRings) -> str:
    """One line about a model's key rings: how many keys have starts in the window, how
    many are at their limit, and the starts of them all."""
    return (
        f"{keys.model} keys {keys.limit}: {keys.busy} with starts in the window, "
        f"{keys.at_limit} at the limit, {keys.starts} starts"
    )


def rate_report(
    targets: Iterable[Any] | None = None, *, using: str | None = None
) -> list[dict[str, Any]]:
    """Every ring of :func:`rate_view` as JSON-ready dictionaries
    (:meth:`RateRing.as_dict`), by model then ring."""
    return [ring.as_dict() for rated in rate_view(targets, using=using) for ring in rated.rings]
