"""Reading the per-minute history (``taskclaim.TaskHistory``) the workers write
(:mod:`django_taskclaim.worker.history`): what the admin's charts and the dashboard's
"done, last N min" show instead of scanning a model's finished rows.

A model's figures come from the history (:func:`uses_history`) when the history has a
row of that model (a worker has finished one of its tasks within the rows kept, 7 days)
and the rows asked about are all of its rows (an admin whose ``get_queryset`` filters
rows gets exact figures from the rows themselves, since the history cannot be narrowed
to them). Otherwise the callers count the rows' ``finished_at``, as before.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import connections, models, router
from django.db.models import Q, Sum
from django.utils import timezone

from django_taskclaim.backends.history import history_sql, is_cut
from django_taskclaim.db import DbNow
from django_taskclaim.models import TaskHistory

__all__ = ["done_in_windows", "minute_rows", "recent_queues", "uses_history", "whole_table"]


def whole_table(queryset: Any) -> bool:
    """Whether ``queryset`` selects every row of its model (no filter: annotations,
    ordering and ``select_related`` do not narrow it)."""
    return queryset is None or not queryset.query.where


def uses_history(
    model: type[models.Model], *, queryset: Any = None, using: str | None = None
) -> bool:
    """Whether the figures of ``model`` (over ``queryset``, default all its rows) come
    from the history: the rows asked about are all of them, the database has history
    statements, and a worker has written at least one row of this model (one indexed
    query)."""
    if not whole_table(queryset):
        return False
    db = using or (queryset.db if queryset is not None else router.db_for_read(model))
    if history_sql(connections[db]) is None:
        return False
    return TaskHistory.objects.using(db).filter(model=model._meta.label).exists()


def _minute(value: datetime) -> datetime:
    if timezone.is_aware(value):
        value = value.astimezone(UTC)
    return value.replace(second=0, microsecond=0)


def minute_rows(label: str, since: datetime, *, using: str) -> list[tuple[datetime, str, int, int]]:
    """``(minute, queue, done, failed)`` of model ``label`` for every minute from
    ``since`` on, one query (at most one row per queue and minute)."""
    rows = (
        TaskHistory.objects.using(using)
        .filter(model=label, minute__gte=since)
        .order_by()
        .values_list("minute", "queue", "done", "failed")
    )
    return [(_minute(m), q, int(d), int(f)) for m, q, d, f in rows]


def done_in_windows(
    label: str, windows: tuple[int, ...], now: datetime, *, using: str
) -> dict[int, int]:
    """Attempts of model ``label`` that ended ``done``, per window of ``n`` minutes: the
    minute of ``now`` (database clock) and the ``n - 1`` before it; one query."""
    current = _minute(now)
    starts = {n: current - timedelta(minutes=n - 1) for n in windows}
    sums = (
        TaskHistory.objects.using(using)
        .filter(model=label, minute__gte=min(starts.values()))
        .aggregate(**{f"w{n}": Sum("done", filter=Q(minute__gte=s)) for n, s in starts.items()})
    )
    return {n: int(sums[f"w{n}"] or 0) for n in windows}


def recent_queues(label: str, *, using: str, days: int = 1) -> set[str]:
    """The queues of model ``label`` that workers finished tasks of in the last ``days``
    days (database clock), from the history: one indexed query, never a scan of the
    model's table. ``""`` (a model without queues) is left out."""
    rows = (
        TaskHistory.objects.using(using)
        .filter(model=label, minute__gte=DbNow() - timedelta(days=days))
        .order_by()
        .values_list("queue", flat=True)
        .distinct()
    )
    return {q for q in rows if q and not is_cut(q)}  # a cut name spells no queue
