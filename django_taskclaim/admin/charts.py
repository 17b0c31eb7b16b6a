"""Charts where people would rather look than read: done and failed tasks per minute over
the last hour and the last day, and the ready depth now, per claimable model and per queue
(the dashboard and each model's changelist; the templates ``charts*.html`` draw them as
inline SVG, the ``taskclaim_charts`` template tags call :func:`dashboard_charts` and
:func:`changelist_charts`).

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
``GROUP BY``), exact, and said to be "now". See docs/admin.md, "Charts".
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
from django.utils import timezone
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe
from django.utils.translation import gettext as _

from django_taskclaim.backends.history import stored_queue
from django_taskclaim.claim.scope import QUEUE_FIELD, has_queues
from django_taskclaim.config.options import get_options
from django_taskclaim.db import db_now
from django_taskclaim.ops.history import minute_rows, uses_history

__all__ = [
    "DAY_BUCKET_MINUTES",
    "MAX_QUEUES",
    "Bar",
    "Chart",
    "ModelCharts",
    "Series",
    "changelist_charts",
    "dashboard_charts",
    "model_charts",
]

#: Minutes of history in the day chart (bars of :data:`DAY_BUCKET_MINUTES`) and the hour
#: chart (a bar per minute).
DAY_MINUTES = 24 * 60
HOUR_MINUTES = 60
#: Width of one bar of the day chart, in minutes.
DAY_BUCKET_MINUTES = 10
#: Queues charted one by one (the busiest of the day first); the rest are in the total.
MAX_QUEUES = 8

# Geometry of the SVG (user units; the SVG scales to the page's width).
_LEFT = 34.0
_TOP = 6.0
_PLOT_H = 60.0
_AXIS_H = 14.0
_RIGHT = 4.0
_BAR_W = {HOUR_MINUTES: 6.0, DAY_MINUTES: 3.0}


@dataclass(frozen=True)
class Bar:
    """One bar: tasks finished ``done`` / ``failed`` in ``[start, start + minutes)``,
    with its drawing (``x``, ``w``; ``done_y`` / ``done_h`` and ``failed_y`` /
    ``failed_h`` stacked, failures on top) and its hover text."""

    start: datetime
    minutes: int
    done: int
    failed: int
    x: float
    w: float
    done_y: float
    done_h: float
    failed_y: float
    failed_h: float
    title: str

    @property
    def iso(self) -> str:
        """The bucket's start in UTC, ISO 8601 (the ``data-start`` of the SVG)."""
        start = self.start.astimezone(UTC) if timezone.is_aware(self.start) else self.start
        return start.isoformat()


@dataclass(frozen=True)
class Chart:
    """One SVG: the bars of a window (non-empty buckets only), its scale and its text."""

    window: str  # "hour" or "day"
    label: str  # accessible name (aria-label / <title>)
    bars: list[Bar]
    peak: int  # the tallest bar (done + failed), the y axis' top
    done: int
    failed: int
    width: float
    height: float
    plot_top: float
    plot_bottom: float
    left: float
    right: float
    first_label: str
    last_label: str
    unit: str

    @property
    def text_x(self) -> float:
        """Where the y axis' labels end (right-aligned)."""
        return self.left - 3

    @property
    def peak_y(self) -> float:
        """The baseline of the peak's label."""
        return self.plot_top + 3

    @property
    def plot_h(self) -> float:
        """Height of the plot area (a bar's hover target spans it)."""
        return self.plot_bottom - self.plot_top

    @property
    def time_y(self) -> float:
        """The baseline of the time labels under the axis."""
        return self.height - 2

    @property
    def bars_svg(self) -> SafeString:
        """The bars as SVG (a ``<g class="tc-bar">`` each: its hover text, a hit area
        the plot's height, the done and failed rects), built here rather than in a
        template loop: a day of bars per queue is thousands of nodes."""
        top, plot_h = self.plot_top, self.plot_h
        parts = []
        for b in self.bars:
            rects = ""
            if b.done:
                rects += (
                    f'<rect class="tc-done" x="{b.x}" y="{b.done_y}" width="{b.w}" '
                    f'height="{b.done_h}"/>'
                )
            if b.failed:
                rects += (
                    f'<rect class="tc-failed" x="{b.x}" y="{b.failed_y}" width="{b.w}" '
                    f'height="{b.failed_h}"/>'
                )
            parts.append(
                f'<g class="tc-bar" data-start="{escape(b.iso)}" data-done="{b.done}" '
                f'data-failed="{b.failed}"><title>{escape(b.title)}</title>'
                f'<rect class="tc-hit" x="{b.x}" y="{top}" width="{b.w}" height="{plot_h}"/>'
                f"{rects}</g>"
            )
        return mark_safe("".join(parts))  # numbers, and escaped text


@dataclass(frozen=True)
class Series:
    """The charts of a model, or of one of its queues (``queue`` is ``None`` for all)."""

    queue: str | None
    title: str
    hour: Chart
    day: Chart
    ready_now: int | None


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

    @property
    def empty(self) -> bool:
        """Whether no task finished in the last day (over every queue)."""
        return not self.series or (self.series[0].day.done + self.series[0].day.failed) == 0


def _utc_minute(value: datetime) -> datetime:
    if timezone.is_aware(value):
        value = value.astimezone(UTC)
    return value.replace(second=0, microsecond=0)


def _hhmm(value: datetime, zone: Any = None) -> str:
    if timezone.is_aware(value):
        value = value.astimezone(zone or timezone.get_current_timezone())
    return value.strftime("%H:%M")


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
    ready: dict[str | None, int] = defaultdict(int)
    if opts.statuses.get("ready") is not None:
        waiting = qs.filter(opts.status_q("ready")).order_by()
        if split:
            for row in waiting.values(QUEUE_FIELD).annotate(n=Count("pk")):
                ready[None] += row["n"]
                ready[_series(row[QUEUE_FIELD])] += row["n"]
        else:
            # one count: values() with no field would group by every column, a row back
            # per ready row
            ready[None] = waiting.count()
    now = db_now(db)
    result.now = now
    current = _utc_minute(now)
    end = current + timedelta(minutes=1)  # the current minute's bar is the hour's last
    # The day's bars are whole 10-minute spans (UTC), the current one last.
    day_end = current.replace(minute=current.minute - current.minute % DAY_BUCKET_MINUTES)
    day_end += timedelta(minutes=DAY_BUCKET_MINUTES)
    since = day_end - timedelta(minutes=DAY_MINUTES)
    counts: dict[str | None, dict[datetime, list[int]]] = defaultdict(dict)
    if uses_history(model, queryset=queryset, using=db):
        result.source = "history"
        result.has_history = True
        for minute, name, done, failed in minute_rows(opts.label, since, using=db):
            for key in (None, name) if split else (None,):
                cell = counts[key].setdefault(minute, [0, 0])
                cell[0] += done
                cell[1] += failed
    elif result.has_history:
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
            minute = _utc_minute(minute)
            for key in (None, _series(queue[0])) if split else (None,):
                cell = counts[key].setdefault(minute, [0, 0])
                cell[kind] += n
    queues: list[str] = []
    if split:
        totals = {
            q: sum(c[0] + c[1] for c in by_minute.values())
            for q, by_minute in counts.items()
            if q is not None
        }
        names = set(totals) | {q for q in ready if q is not None}
        ranked = sorted(names, key=lambda q: (-totals.get(q, 0), -ready.get(q, 0), str(q)))
        queues = sorted(ranked[:MAX_QUEUES], key=str)
        result.more_queues = max(0, len(ranked) - MAX_QUEUES)
    for queue in [None, *queues]:
        by_minute = counts.get(queue, {})
        title = _("all queues") if split and queue is None else (queue or result.name)
        who = f"{result.name}, {queue}" if queue else result.name
        result.series.append(
            Series(
                queue=queue,
                title=str(title),
                hour=_chart("hour", by_minute, end, HOUR_MINUTES, 1, who),
                day=_chart("day", by_minute, day_end, DAY_MINUTES, DAY_BUCKET_MINUTES, who),
                ready_now=ready.get(queue, 0) if opts.statuses.get("ready") is not None else None,
            )
        )
    return result


def _chart(
    window: str,
    by_minute: dict[datetime, list[int]],
    end: datetime,
    minutes: int,
    step: int,
    who: str,
) -> Chart:
    start = end - timedelta(minutes=minutes)
    n = minutes // step
    buckets = [[0, 0] for _ in range(n)]
    for minute, (done, failed) in by_minute.items():
        if start <= minute < end:
            i = int((minute - start).total_seconds() // 60) // step
            buckets[i][0] += done
            buckets[i][1] += failed
    peak = max((d + f for d, f in buckets), default=0)
    bar_w = _BAR_W[minutes]
    bars = []
    bottom = _TOP + _PLOT_H
    zone = timezone.get_current_timezone()
    hover = _("%(when)s: %(done)s done, %(failed)s failed")
    rate = _("(%(rate)s done per minute)")
    for i, (done, failed) in enumerate(buckets):
        if not done and not failed:
            continue
        b_start = start + timedelta(minutes=i * step)
        done_h = _PLOT_H * done / peak
        failed_h = _PLOT_H * failed / peak
        when = _hhmm(b_start, zone)
        if step > 1:
            when = f"{when}–{_hhmm(b_start + timedelta(minutes=step), zone)}"
        text = hover % {"when": when, "done": done, "failed": failed}
        if step > 1:
            text += " " + rate % {"rate": f"{done / step:.1f}"}
        bars.append(
            Bar(
                start=b_start,
                minutes=step,
                done=done,
                failed=failed,
                x=round(_LEFT + i * bar_w, 2),
                w=round(max(bar_w - 1, bar_w * 0.8), 2),
                done_y=round(bottom - done_h, 2),
                done_h=round(done_h, 2),
                failed_y=round(bottom - done_h - failed_h, 2),
                failed_h=round(failed_h, 2),
                title=text,
            )
        )
    done = sum(b[0] for b in buckets)
    failed = sum(b[1] for b in buckets)
    if window == "hour":
        label = _(
            "%(who)s, last hour: %(done)s done, %(failed)s failed; at most %(peak)s in a minute"
        )
    else:
        label = _(
            "%(who)s, last 24 hours: %(done)s done, %(failed)s failed; at most %(peak)s in "
            "%(step)s minutes"
        )
    unit = _("per minute") if step == 1 else _("per %(step)s min") % {"step": step}
    return Chart(
        window=window,
        label=label % {"who": who, "done": done, "failed": failed, "peak": peak, "step": step},
        bars=bars,
        peak=peak,
        done=done,
        failed=failed,
        width=round(_LEFT + n * bar_w + _RIGHT, 2),
        height=_TOP + _PLOT_H + _AXIS_H,
        plot_top=_TOP,
        plot_bottom=bottom,
        left=_LEFT,
        right=round(_LEFT + n * bar_w, 2),
        first_label=_hhmm(start, zone),
        last_label=_hhmm(end, zone),
        unit=str(unit),
    )


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
