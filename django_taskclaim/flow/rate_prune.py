"""Pruning the rings of idle queues and keys (docs/rate-limits.md, "Idle rings").

Every queue value and every key value a claim ever saw keeps a ring of ``N`` slot rows
(``taskclaim.RateSlot``): with per-key limits the table grows with the keys ever seen.
A ring none of whose slots was used within its window lends all of them, exactly as a
ring that does not exist: the next claim creates it again, every slot free. So deleting
such a ring changes no claim's outcome, and the limit stays exact: a deleted slot's last
claim time ``L`` was more than one window before the deletion, the recreated slot's next
claim time is after it, so the two are more than one window apart, as the claim's own
take requires (docs/rate-limits.md, "Why this is exact").

:func:`prune_idle_rings` deletes whole rings only, each in a short transaction that first
locks every one of its slots (``FOR UPDATE SKIP LOCKED``: a ring a claim is taking slots
from is left for the next pass, never waited for) and deletes them only if it locked them
all and none was used within the window. The worker's periodic reap runs it (one worker
per interval across the fleet); the model's own ring (``rate_limit`` per model) is never
deleted, nor a ring of a limit the model no longer declares.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta
from functools import partial
from typing import Any

from django.db import models, router, transaction
from django.db.models import Count, Max, Q

from django_taskclaim.claim.rate import ring_scope
from django_taskclaim.config.options import get_options
from django_taskclaim.config.rate_limits import RateLimit
from django_taskclaim.db import db_now, retry_transient
from django_taskclaim.exceptions import ConfigurationError
from django_taskclaim.models import RateSlot

__all__ = ["PRUNE_BATCH", "prune_idle_rings"]

#: Rings looked at per transaction.
PRUNE_BATCH = 1000
#: Passes per model and limit per call: at most this × :data:`PRUNE_BATCH` rings deleted
#: by one call (the next call goes on).
PRUNE_PASSES = 50

_PREFIX = {"queue": "queue:", "key": "key:"}


def _rings_q(label: str, lim: RateLimit) -> Q:
    """Every slot row of ``lim``'s per-value rings of the model ``label``."""
    return Q(model=label) & (Q(scope__startswith=_PREFIX[lim.per]) | Q(scope=ring_scope(lim, None)))


def _prune_batch(label: str, lim: RateLimit, using: str, batch: int) -> tuple[int, int]:
    """One pass: the idle rings of ``lim`` found (at most ``batch``) and the slot rows
    deleted."""
    cutoff = db_now(using) - timedelta(seconds=lim.window)
    idle = list(
        RateSlot.objects.using(using)
        .filter(_rings_q(label, lim))
        .values("scope")
        .annotate(tc_rows=Count("pk"), tc_latest=Max("last_start"))
        .filter(tc_latest__lt=cutoff)
        .order_by("scope")[:batch]
    )
    if not idle:
        return 0, 0
    expected = {str(row["scope"]): int(row["tc_rows"]) for row in idle}
    with transaction.atomic(using=using):
        locked = (
            RateSlot.objects.using(using)
            .select_for_update(skip_locked=True)
            .filter(model=label, scope__in=list(expected))
            .values_list("pk", "scope", "last_start")
        )
        by_scope: dict[str, list[Any]] = {}
        fresh: set[str] = set()
        for pk, scope, last_start in locked:
            by_scope.setdefault(scope, []).append(pk)
            if last_start >= cutoff:
                fresh.add(scope)
        ids = [
            pk
            for scope, pks in by_scope.items()
            if scope not in fresh and len(pks) == expected[scope]
            for pk in pks
        ]
        deleted = 0
        for low in range(0, len(ids), 1000):
            deleted += (
                RateSlot.objects.using(using)
                .filter(pk__in=ids[low : low + 1000], last_start__lt=cutoff)
                .delete()[0]
            )
    return len(idle), deleted


def prune_idle_rings(targets: Iterable[type[models.Model]], *, using: str | None = None) -> int:
    """Delete the rings of ``targets``' per-queue and per-key rate limits that had no
    start within their window (database clock), whole rings only, never one a claim is
    using; the number of slot rows deleted. A model whose options do not validate, or
    without such a limit, is skipped."""
    deleted = 0
    for model in targets:
        try:
            limits = get_options(model).rate_limits
        except ConfigurationError:
            continue
        db = using or router.db_for_write(model)
        for lim in limits:
            if lim.per not in _PREFIX:
                continue
            for _ in range(PRUNE_PASSES):
                found, removed = retry_transient(
                    partial(_prune_batch, model._meta.label, lim, db, PRUNE_BATCH),
                    db,
                    what="prune idle rate-limit rings",
                )
                deleted += removed
                if found < PRUNE_BATCH or not removed:
                    break
    return deleted
