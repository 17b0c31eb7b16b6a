"""Charts where people would rather look than read: done and failed tasks per minute over
the last hour and the last day, and the ready depth now, per claimable model and per queue
(the dashboard and each model's changelist; the ``taskclaim_charts`` template tags call
:func:`dashboard_charts` and :func:`changelist_charts`). This module gathers the counts;
their drawing, as inline SVG, is :mod:`.chart_drawing`.

Where the history comes from: the workers' per-minute table (``taskclaim.TaskHistory``,
:mod:`django_taskclaim.ops.history`): one indexed read of the model's last day, at most
one row per queue and minute, whatever the size of the model's table. It holds the
attempts workers finished (counted in memory, written about every 10 s), not the rows
finished elsewhere. A model no worker has written history for yet, or charted over an
admin queryset that narrows its rows, falls back to the rows' own ``finished_at``: one
``GROUP BY`` over the last day's finished rows, bucketed by minute in the database
(``TruncMinute`` in UTC) — exact, but a scan of the finished rows. Either way the last
hour is the last 60 minutes, the day's bars are 10-minute sums, split by ``queue_name``
where the model has one. Ready depth is the current count of ``ready`` rows (one more
``GROUP BY``), exact, and said to be "now"; the depth over the last day is the workers'
samples (:mod:`.depth_chart`, not for an admin that narrows its rows). Runtime
percentiles come from the attempts' journal when it holds every attempt, else from the
rows' ``finished_at - claimed_at`` when the charts read the rows anyway. See
docs/admin.md, "Charts".
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.apps import apps
from django.contrib import admin
from django.db import models, router
from django.db.models import Count
from django.db.models.functions import TruncMinute
from django.http import HttpRequest
from django.utils.translation import gettext as _

from django_taskclaim.admin.chart_drawing import (
    DAY_BUCKET_MINUTES,
    DAY_MINUTES,
    HOUR_MINUTES,
    Series,
    draw_chart,
    utc_minute,
)
from django_taskclaim.admin.depth_chart import DepthChart, depth_chart
from django_taskclaim.backends.history import stored_queue
from django_taskclaim.claim.scope import QUEUE_FIELD, has_queues
from django_taskclaim.config.options import ClaimOptions, get_options
from django_taskclaim.config.settings import taskclaim_settings
from django_taskclaim.db import db_now
from django_taskclaim.ops.history import minute_rows, uses_history, whole_table

__all__ = [
    "MAX_QUEUES",
    "ModelCharts",
    "changelist_charts",
    "dashboard_charts",
    "model_charts",
]

#: Queues charted one by one (the busiest of the day first); the rest are in the total.
MAX_QUEUES = 8

#: Attempts read at most for a model's runtime percentiles (the newest of the hour).
RUNTIME_SAMPLE = 20_000

#: ``[done, failed]`` per UTC minute, per series (``None``: all queues).
Counts = dict[str | None, dict[datetime, list[int]]]


@dataclass(frozen=True)
class Runtimes:
    """Runtime percentiles of a model in the last hour, in seconds: nearest rank over the
    newest :data:`RUNTIME_SAMPLE` values (``capped`` when there were more). ``source``
    says what was measured: ``"attempts"``, every attempt that started in the last hour,
    from the attempts' journal (``TASKCLAIM_ATTEMPT_LOG = "all"``); ``"rows"``, the last
    attempt of each row that finished (done or failed) in the last hour, from its claim
    to its end (``finished_at - claimed_at``)."""

    n: int
    p50: float
    p95: float
    p99: float
    capped: bool
    source: str = "attempts"

    @staticmethod
    def of(values: list[float], capped: bool, source: str = "attempts") -> Runtimes | None:
        if not values:
            return None
        ordered = sorted(values)

        def rank(q: int) -> float:  # nearest rank: the ceil(n * q / 100)-th value
            return ordered[min(len(ordered) - 1, max(0, -(-len(ordered) * q // 100) - 1))]

        return Runtimes(len(ordered), rank(50), rank(95), rank(99), capped, source)


@dataclass
class ModelCharts:
    """What the charts of one model show: a series for the model, then one per queue."""

    label: str
    name: str
    has_history: bool  # False when the model has no finished_at field
    now: datetime | None = None
    series: list[Series] = field(default_factory=list)
    more_queues: int = 0  # queues left out (beyond MAX_QUEUES)
    source: str = "rows"  # "history" (the workers' per-minute table) or "rows" (finished_at)
    #: Runtime percentiles of the last hour; ``None`` when none were recorded.
    runtimes: Runtimes | None = None
    #: Whether the workers record every attempt (``TASKCLAIM_ATTEMPT_LOG = "all"``).
    every_attempt: bool = False
    #: Whether the percentiles come from the rows (``finished_at - claimed_at``): when the
    #: journal does not hold every attempt, the model has both fields and the charts
    #: read its finished rows anyway (``source="rows"``; beside the workers' history
    #: that would be a second scan of the finished rows, which the charts never make).
    rows_runtime: bool = False
    #: The queue depth over the last day (the workers' samples); ``None``: no sample.
    depth: DepthChart | None = None
    #: Whether the depth is charted: the samples count all of the model's rows, so an
    #: admin that narrows its rows gets none.
    depth_shown: bool = False

    @property
    def empty(self) -> bool:
        """Whether no task finished in the last day (over every queue)."""
        return not self.series or (self.series[0].day.done + self.series[0].day.failed) == 0


def model_charts(
    model: type[models.Model], *, queryset: Any = None, using: str | None = None
) -> ModelCharts:
    """The charts of ``model`` over ``queryset`` (default: all its rows).

    Guarantees: the windows end at the database's ``now()``, never the web server's.
    From the history (``source="history"``: the rows asked about are all of the model's
    and a worker has written history for it): a bar holds the attempts workers recorded
    as finished in its minutes (database clock), read in one indexed query. Otherwise
    (``source="rows"``): a bar holds exactly the rows whose ``finished_at`` falls in its
    minutes (one aggregate query), and a model without ``finished_at`` gets
    ``has_history=False`` and no history query. Ready rows: one aggregate query.
    """
    opts = get_options(model)
    db = using or (queryset.db if queryset is not None else router.db_for_read(model))
    qs = queryset if queryset is not None else model._base_manager.using(db).all()
    result = ModelCharts(
        label=opts.label,
        name=str(model._meta.verbose_name_plural),
        has_history=opts.has("finished_at"),
    )
    split = has_queues(model)
    ready = _ready_counts(opts, qs, split)
    result.now = db_now(db)
    end, day_end = _window_ends(result.now)
    since = day_end - timedelta(minutes=DAY_MINUTES)
    counts: Counts = defaultdict(dict)
    if uses_history(model, queryset=queryset, using=db):
        result.source = "history"
        result.has_history = True
        _count_history(counts, opts.label, since, db, split)
    elif result.has_history:
        _count_rows(counts, opts, qs, since, split)
    result.every_attempt = taskclaim_settings.ATTEMPT_LOG == "all"
    result.rows_runtime = (
        not result.every_attempt
        and result.source == "rows"
        and result.has_history
        and opts.has("claimed_at")
    )
    hour_ago = end - timedelta(minutes=HOUR_MINUTES)
    if result.every_attempt:
        result.runtimes = _runtimes(opts.label, hour_ago)
    elif result.rows_runtime:
        result.runtimes = _row_runtimes(opts, qs, hour_ago)
    result.depth_shown = whole_table(queryset)
    if result.depth_shown:
        result.depth = depth_chart(opts.label, result.now, db, who=result.name)
    queues: list[str] = []
    if split:
        queues, result.more_queues = _busiest_queues(counts, ready)
    show_ready = opts.statuses.get("ready") is not None
    for queue in [None, *queues]:
        by_minute = counts.get(queue, {})
        title = _("all queues") if split and queue is None else (queue or result.name)
        who = f"{result.name}, {queue}" if queue else result.name
        result.series.append(
            Series(
                queue=queue,
                title=str(title),
                hour=draw_chart("hour", by_minute, end, HOUR_MINUTES, 1, who),
                day=draw_chart("day", by_minute, day_end, DAY_MINUTES, DAY_BUCKET_MINUTES, who),
                ready_now=ready.get(queue, 0) if show_ready else None,
            )
        )
    return result


def _runtimes(label: str, since: datetime) -> Runtimes | None:
    """Runtime percentiles of ``label``'s attempts that started since ``since`` (one
    query over the journal's index on their start)."""
    from django_taskclaim.models import TaskAttempt  # the app registry first

    db = router.db_for_read(TaskAttempt)
    values = list(
        TaskAttempt.objects.using(db)
        .filter(model=label, started_at__gte=since)
        .order_by("-started_at")
        .values_list("runtime", flat=True)[: RUNTIME_SAMPLE + 1]
    )
    capped = len(values) > RUNTIME_SAMPLE
    return Runtimes.of(values[:RUNTIME_SAMPLE], capped)


def _row_runtimes(opts: ClaimOptions, qs: Any, since: datetime) -> Runtimes | None:
    """Runtime percentiles of the rows of ``qs`` finished (done or failed) since
    ``since``: ``finished_at - claimed_at`` of their last attempt (one query; rows
    without ``claimed_at``, claimed before the field existed, are left out)."""
    kinds = [s for s in ("done", "failed") if opts.statuses.get(s) is not None]
    if not kinds:
        return None
    pairs = list(
        qs.filter(opts.status_q(*kinds), finished_at__gte=since, claimed_at__isnull=False)
        .order_by("-finished_at")
        .values_list("claimed_at", "finished_at")[: RUNTIME_SAMPLE + 1]
    )
    values = [max(0.0, (end - start).total_seconds()) for start, end in pairs]
    return Runtimes.of(values[:RUNTIME_SAMPLE], len(values) > RUNTIME_SAMPLE, "rows")


def _window_ends(now: datetime) -> tuple[datetime, datetime]:
    """Where the hour's and the day's bars end (exclusive) at ``now``: after the current
    minute (its bar is the hour's last), and after the current 10-minute span in UTC (the
    day's bars are whole spans, the current one last)."""
    current = utc_minute(now)
    day_end = current.replace(minute=current.minute - current.minute % DAY_BUCKET_MINUTES)
    return current + timedelta(minutes=1), day_end + timedelta(minutes=DAY_BUCKET_MINUTES)


def _ready_counts(opts: ClaimOptions, qs: Any, split: bool) -> dict[str | None, int]:
    """The ``ready`` rows of ``qs`` now: all of them (key ``None``) and, when ``split``,
    per queue; empty when the model has no ``ready`` status. One aggregate query."""
    ready: dict[str | None, int] = defaultdict(int)
    if opts.statuses.get("ready") is None:
        return ready
    waiting = qs.filter(opts.status_q("ready")).order_by()
    if split:
        for row in waiting.values(QUEUE_FIELD).annotate(n=Count("*")):
            ready[None] += row["n"]
            ready[_series(row[QUEUE_FIELD])] += row["n"]
    else:
        # one count: values() with no field would group by every column, a row back
        # per ready row
        ready[None] = waiting.count()
    return ready


def _count_history(counts: Counts, label: str, since: datetime, db: str, split: bool) -> None:
    """Add the workers' per-minute history of model ``label`` since ``since`` to
    ``counts`` (one indexed query)."""
    for minute, name, done, failed in minute_rows(label, since, using=db):
        for key in (None, name) if split else (None,):
            cell = counts[key].setdefault(minute, [0, 0])
            cell[0] += done
            cell[1] += failed


def _count_rows(counts: Counts, opts: ClaimOptions, qs: Any, since: datetime, split: bool) -> None:
    """Add the rows of ``qs`` finished (done or failed) since ``since`` to ``counts``,
    by their ``finished_at`` minute in UTC (one aggregate query)."""
    kinds = {s: i for i, s in enumerate(("done", "failed")) if opts.statuses.get(s) is not None}
    status = opts.status_field
    fields = ["minute", status, *([QUEUE_FIELD] if split else [])]
    rows = (
        qs.filter(opts.status_q(*kinds), finished_at__gte=since)
        .order_by()
        .annotate(minute=TruncMinute("finished_at", tzinfo=UTC))
        .values_list(*fields)
        .annotate(n=Count("pk"))
    )
    kind_of = {opts.value(s): i for s, i in kinds.items()}
    for minute, value, *queue, n in rows:
        kind = kind_of.get(value)
        if kind is None or minute is None:
            continue
        minute = utc_minute(minute)
        for key in (None, _series(queue[0])) if split else (None,):
            cell = counts[key].setdefault(minute, [0, 0])
            cell[kind] += n


def _busiest_queues(counts: Counts, ready: dict[str | None, int]) -> tuple[list[str], int]:
    """The queues charted one by one (the :data:`MAX_QUEUES` busiest of the day, then the
    most ready, by name), and how many are left out."""
    totals = {
        q: sum(c[0] + c[1] for c in by_minute.values())
        for q, by_minute in counts.items()
        if q is not None
    }
    names = set(totals) | {q for q in ready if q is not None}
    ranked = sorted(names, key=lambda q: (-totals.get(q, 0), -ready.get(q, 0), str(q)))
    return sorted(ranked[:MAX_QUEUES], key=str), max(0, len(ranked) - MAX_QUEUES)


def _queryset_of(request: HttpRequest, site: admin.AdminSite | None, model: Any) -> Any:
    model_admin = site._registry.get(model) if site is not None else None
    if model_admin is not None:
        return model_admin.get_queryset(request)
    return model._base_manager.using(router.db_for_read(model)).all()


def dashboard_charts(
    request: HttpRequest, site: admin.AdminSite | None, labels: list[str]
) -> list[ModelCharts]:
    """The charts of the dashboard's models, ``labels`` being the models the dashboard
    already decided ``request.user`` may see (its rows), in that order.

    Guarantees: counts come from the model's ``ModelAdmin.get_queryset(request)`` on
    ``site`` when registered there (an admin that narrows its rows never charts rows it
    hides), else from all its rows, as the dashboard's own figures do.
    """
    charts = []
    for label in labels:
        try:
            model = apps.get_model(label)
        except (LookupError, ValueError):
            continue
        charts.append(model_charts(model, queryset=_queryset_of(request, site, model)))
    return charts


def changelist_charts(request: HttpRequest, model_admin: Any) -> ModelCharts | None:
    """The charts above a claimable model's changelist, over what its admin's
    ``get_queryset(request)`` shows; ``None`` when the admin sets ``claim_charts = False``
    (the changelist view has already checked the user's view permission)."""
    if not getattr(model_admin, "claim_charts", True):
        return None
    return model_charts(model_admin.model, queryset=model_admin.get_queryset(request))


def _series(queue: Any) -> Any:
    """The key of ``queue``'s series: the name as the history stores it
    (:func:`~django_taskclaim.backends.history.stored_queue`), so that a queue whose name
    is longer than the history's column is one series, read from the table or from the
    history."""
    return stored_queue(queue) if isinstance(queue, str) else queue
