"""Rate limits enforced by the database: a claim takes one slot of each applicable ring
per row it claims, in the claim's own transaction (docs/rate-limits.md).

A ring is ``N`` rows of the ``taskclaim.RateSlot`` table for one limited scope (the
model, one ``queue_name`` value, or one concurrency-key value), each holding the claim
time of the last start that used it. :func:`claim_limited` runs, in one transaction:

1. lock up to ``n`` slots of each ring whose ``last_start`` is more than one window
   before the database clock (others' locked slots are skipped, never waited for);
2. the strategy's own claim, of at most as many rows as slots were locked (FIFO order
   as always);
3. write each claimed row's claim time (its ``locked_until`` − lease: the clock value
   its claim statement used, never earlier than step 1's) into one locked slot per row,
   re-checking the slot is still more than one window older.

So the claim times written into one slot are each more than one window apart, and
every claim time is in one slot of every ring that applies: at most ``N`` claims in any
window of that length, fleet-wide. Nothing is ever released, so a killed worker cannot
leak a slot; a transaction that fails writes nothing. A claim held back by a limit
leaves :func:`wait_hint` set: how long until that ring's earliest slot frees, for the
worker to wait on instead of polling.

:mod:`.scope` calls this only for a model with a rate limit; every other claim runs
exactly as before, with no extra statement.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django.db import DatabaseError, connections, models, transaction
from django.db.models import Q

from django_taskclaim.backends.rate_slots import RateSlotSQL, rate_sql
from django_taskclaim.capped import CappedCache
from django_taskclaim.claim.base import _order_by
from django_taskclaim.db import is_transient
from django_taskclaim.exceptions import ConfigurationError

if TYPE_CHECKING:
    from django_taskclaim.claim.request import ClaimRequest
    from django_taskclaim.config.rate_limits import RateLimit

__all__ = ["claim_limited", "ring_scope", "wait_hint"]

#: The shortest wait a held-back claim suggests (a ring whose slots are all locked by
#: claims still committing reads as free "now").
MIN_WAIT = 0.002
#: How many times one claim of a model with per-queue / per-key limits looks past the
#: groups held back (by their ring or their concurrency limit) for rows of other groups.
GROUP_PASSES = 4

_local = threading.local()
#: Rings this process has created: (alias, model, scope, count).
_ENSURED: CappedCache[tuple[Any, ...], bool] = CappedCache()


class _SlotMoved(Exception):
    """A slot re-check failed at charge time: roll the claim back."""


def wait_hint() -> float | None:
    """Seconds until the slot that held back this thread's last claim frees (database
    clock; at least :data:`MIN_WAIT`), or ``None`` when that claim was not held back by
    a rate limit (it got every row it asked for, or every ready row there was)."""
    return getattr(_local, "hint", None)


def ring_scope(limit: RateLimit, value: Any = None) -> str:
    """The ``scope`` of the ring of ``limit`` for the field value ``value``: ``""`` for a
    model-wide limit, ``queue:<value>`` / ``key:<value>`` otherwise (a value longer than
    200 characters by its SHA-256); ``key(null)`` / ``queue(null)`` for ``None`` (no colon,
    so no value's scope can be the same)."""
    if limit.field is None:
        return ""
    if value is None:
        return f"{limit.per}(null)"
    text = str(value)
    if len(text) > 200:
        text = "#" + hashlib.sha256(text.encode()).hexdigest()
    return f"{limit.per}:{text}"


def _ensure(sql: RateSlotSQL, using: str, label: str, scope: str, limit: RateLimit) -> None:
    key = (using, label, scope, limit.count)
    if _ENSURED.get(key):
        return
    with connections[using].cursor() as cursor:
        sql.ensure(cursor, label, scope, limit.count)
    _ENSURED.put(key, True)


def _forget(using: str, label: str, scope: str, limit: RateLimit) -> None:
    _ENSURED.put((using, label, scope, limit.count), False)


def _starts(rows: list[Any], lease: float) -> list[Any]:
    """Each claimed row's claim time: the clock value its claim statement wrote the
    lease from (``locked_until`` − lease)."""
    delta = timedelta(seconds=lease)
    return [row.locked_until - delta for row in rows]


def _charge(sql: RateSlotSQL, cursor: Any, ids: list[int], starts: list[Any], w: float) -> None:
    by_start: dict[Any, list[int]] = {}
    for slot, start in zip(ids, sorted(starts), strict=False):
        by_start.setdefault(start, []).append(slot)
    for start, slots in by_start.items():
        if not sql.charge(cursor, slots, start, w):
            raise _SlotMoved


def claim_limited(
    claim: Callable[[ClaimRequest], list[Any]], r: ClaimRequest, *, again: bool = True
) -> list[Any]:
    """``claim(r)`` under ``r.opts.rate_limits``: at most as many rows as every applicable
    ring has free slots, the slots charged with the rows' claim times in the same
    transaction. Sets :func:`wait_hint`. A ring found without slots (its table emptied
    since this process created it) is created again and the claim made once more
    (``again``). Raises :class:`ConfigurationError` on a database without rate-limit
    support."""
    _local.hint = None
    conn = connections[r.db]
    sql = rate_sql(conn)
    if sql is None:
        raise ConfigurationError(
            f"{r.opts.label} has a rate limit, which this database does not support"
        )
    label = r.opts.label
    limits = r.opts.rate_limits
    # Each pass commits on its own unless the caller's transaction holds them all.
    outer = conn.in_atomic_block
    whole = [lim for lim in limits if lim.field is None]
    grouped = [lim for lim in limits if lim.field is not None]
    for lim in whole:
        _ensure(sql, r.db, label, "", lim)
    rows: list[Any] = []
    try:
        _passes(claim, r, sql, label, whole, grouped, rows, again=again)
    except DatabaseError as exc:
        if _keep(rows, exc, r.db, outer):
            return rows
        raise
    return rows


def _passes(
    claim: Callable[[ClaimRequest], list[Any]],
    r: ClaimRequest,
    sql: RateSlotSQL,
    label: str,
    whole: list[RateLimit],
    grouped: list[RateLimit],
    rows: list[Any],
    *,
    again: bool,
) -> None:
    """The looks of :func:`claim_limited`, each its own transaction, the rows each one
    claimed added to ``rows`` as it commits (so that a later look's error leaves them
    there for the caller)."""
    conn = connections[r.db]
    blocked: list[tuple[RateLimit, str]] = []
    passed: list[tuple[Any, ...]] = []  # groups that gave fewer rows than they had
    for _ in range(GROUP_PASSES if grouped else 1):
        todo = r if not passed else _without(r, grouped, passed, r.n - len(rows))
        groups: list[tuple[tuple[Any, ...], int]] = [((), todo.n)]
        if grouped:
            groups = _groups(todo, [lim.field for lim in grouped if lim.field])
            if not groups:
                break
            for values, _need in groups:
                for lim, value in zip(grouped, values, strict=True):
                    _ensure(sql, r.db, label, ring_scope(lim, value), lim)
        short: list[tuple[Any, ...]] = []
        try:
            with transaction.atomic(using=r.db), conn.cursor() as cursor:
                got = _claim_in_transaction(
                    claim, todo, sql, cursor, label, whole, grouped, groups, blocked, short
                )
        except _SlotMoved:  # a clock rounding edge: claim nothing now, look again at once
            _local.hint = MIN_WAIT
            return
        rows.extend(got)
        if len(rows) >= r.n or not short or any(scope == "" for _, scope in blocked):
            break
        # Rows of other groups may wait behind the groups held back (by their ring or
        # their concurrency limit): look past those, in claim order, once more.
        passed.extend(short)
    if blocked and len(rows) < r.n:
        hint, missing = _wait(sql, r.db, label, blocked)
        if missing and again:  # a ring was emptied by hand: made again, look once more
            rest = r.n - len(rows)
            # the rows claimed already are the caller's too
            rows.extend(claim_limited(claim, replace(r, n=rest, cache_key=None), again=False))
            return
        _local.hint = hint


def _keep(rows: list[Any], exc: DatabaseError, using: str, outer: bool) -> bool:
    """Whether to return ``rows`` instead of raising ``exc``: a later pass failed with a
    deadlock or another transient error, and rolled back alone, while the passes before
    it committed ``rows`` as claimed. Raising would send the caller's retry to claim
    again and leave those rows ``processing`` with no body until their lease ends."""
    return bool(rows) and not outer and is_transient(exc, using)


def _without(
    r: ClaimRequest, grouped: list[RateLimit], groups: list[tuple[Any, ...]], n: int
) -> ClaimRequest:
    """``r`` without the rows of ``groups`` (each a value per grouped limit's field), at
    most ``n`` rows; compiled afresh (no cache key)."""
    qs: models.QuerySet[Any] = r.qs
    for values in groups:
        match = Q()
        for lim, value in zip(grouped, values, strict=True):
            field = str(lim.field)
            match &= Q(**{f"{field}__isnull": True}) if value is None else Q(**{field: value})
        qs = qs.exclude(match)
    return replace(r, qs=qs, n=n, cache_key=None)


def _groups(r: ClaimRequest, fields: list[str]) -> list[tuple[tuple[Any, ...], int]]:
    """The group values (one per grouped limit's field) of the first ``r.n`` claimable
    rows in claim order, with how many of those rows each has, in order of first
    appearance (read without locks: which rings a claim may need)."""
    values = r.qs.order_by(*_order_by(r.opts, r.db)).values_list(*fields)[: r.n]
    need: dict[tuple[Any, ...], int] = {}
    for row in values:
        need[tuple(row)] = need.get(tuple(row), 0) + 1
    return list(need.items())


def _claim_in_transaction(
    claim: Callable[[ClaimRequest], list[Any]],
    r: ClaimRequest,
    sql: RateSlotSQL,
    cursor: Any,
    label: str,
    whole: list[RateLimit],
    grouped: list[RateLimit],
    groups: list[tuple[tuple[Any, ...], int]],
    blocked: list[tuple[RateLimit, str]],
    short: list[tuple[Any, ...]],
) -> list[Any]:
    budget = r.n
    held: list[tuple[RateLimit, list[int]]] = []
    for lim in whole:
        ids = sql.take(cursor, label, "", lim.count, lim.window, min(budget, lim.count))
        if len(ids) < budget:
            blocked.append((lim, ""))
        held.append((lim, ids))
        budget = min(budget, len(ids))
    rows: list[Any] = []
    used = 0  # slots of the model-wide rings charged so far
    for values, need in groups:
        want = min(need, budget - len(rows))
        if want <= 0:
            break
        group_held: list[tuple[RateLimit, list[int]]] = []
        for lim, value in zip(grouped, values, strict=True):
            scope = ring_scope(lim, value)
            ids = sql.take(cursor, label, scope, lim.count, lim.window, min(want, lim.count))
            if len(ids) < want:
                blocked.append((lim, scope))
            group_held.append((lim, ids))
            want = min(want, len(ids))
        if want <= 0:
            short.append(values)
            continue
        if grouped:
            sub = _narrowed(r, grouped, values, want)
        else:
            sub = replace(r, n=want) if want != r.n else r
        got = claim(sub)
        if len(got) < need:
            short.append(values)
        if not got:
            continue
        starts = _starts(got, r.lease)
        for lim, ids in group_held:
            _charge(sql, cursor, ids[: len(got)], starts, lim.window)
        for lim, ids in held:
            _charge(sql, cursor, ids[used : used + len(got)], starts, lim.window)
        used += len(got)
        rows.extend(got)
    return rows


def _narrowed(
    r: ClaimRequest, grouped: list[RateLimit], values: tuple[Any, ...], n: int
) -> ClaimRequest:
    """``r`` for the rows of one group only (each grouped limit's field equal to its
    value), at most ``n`` of them; compiled afresh (no cache key)."""
    qs: models.QuerySet[Any] = r.qs
    for lim, value in zip(grouped, values, strict=True):
        field = str(lim.field)
        qs = qs.filter(**({f"{field}__isnull": True} if value is None else {field: value}))
    return replace(r, qs=qs, n=n, cache_key=None)


def _wait(
    sql: RateSlotSQL, using: str, label: str, blocked: list[tuple[RateLimit, str]]
) -> tuple[float, bool]:
    """The shortest wait (database clock, at least :data:`MIN_WAIT`) until a slot of a
    ring that held the claim back frees, and whether one of those rings has no slot at
    all (forgotten as created: the next claim creates it)."""
    best: float | None = None
    missing = False
    with connections[using].cursor() as cursor:
        for lim, scope in blocked:
            seconds = sql.wait(cursor, label, scope, lim.count, lim.window)
            if seconds is None:
                _forget(using, label, scope, lim)
                missing = True
                seconds = 0.0
            best = seconds if best is None else min(best, seconds)
    return max(MIN_WAIT, best if best is not None else MIN_WAIT), missing
