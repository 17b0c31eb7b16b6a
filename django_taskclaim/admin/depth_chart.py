"""The queue depth chart: a model's ``ready`` and ``processing`` rows over the last 24
hours, drawn from the workers' samples (``taskclaim.QueueDepth``, about one a minute:
:mod:`django_taskclaim.worker.maintenance.depth`) as two lines of an inline SVG. One
indexed read of at most a day of samples; a model without samples gets no chart.
:mod:`.charts` puts it beside the throughput charts of the model.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Q
from django.utils import timezone
from django.utils.translation import gettext as _

from django_taskclaim.admin.chart_drawing import AxisText

__all__ = ["DEPTH_WINDOW", "DepthChart", "depth_chart"]

#: The window the chart shows.
DEPTH_WINDOW = timedelta(hours=24)
#: Two samples further apart than this are not joined by a line (no worker sampled
#: between them).
GAP = timedelta(minutes=5)

# Geometry (user units), the day chart's: the two charts line up.
_LEFT, _TOP, _PLOT_H, _AXIS_H, _RIGHT, _PLOT_W = 34.0, 6.0, 60.0, 14.0, 4.0, 432.0


@dataclass(frozen=True)
class DepthChart(AxisText):
    """The depth chart of one model: its lines (SVG ``points`` lists, one per run of
    samples without a gap), its scale, the latest sample and its text."""

    label: str  # accessible name
    samples: int
    ready_lines: list[str]
    processing_lines: list[str]
    peak: int
    ready_now: int
    processing_now: int
    latest: datetime
    peak_ready: int
    first_label: str
    last_label: str
    width: float = round(_LEFT + _PLOT_W + _RIGHT, 2)
    height: float = _TOP + _PLOT_H + _AXIS_H
    left: float = _LEFT
    right: float = _LEFT + _PLOT_W
    plot_top: float = _TOP
    plot_bottom: float = _TOP + _PLOT_H


def depth_chart(label: str, end: datetime, using: str, *, who: str) -> DepthChart | None:
    """The depth chart of model ``label`` for the :data:`DEPTH_WINDOW` before ``end``
    (the database clock), from its samples on ``using`` (one query over the samples'
    ``(model, minute)`` key); ``None`` when there is none in the window. ``who`` names the
    model in the chart's text."""
    from django_taskclaim.models import QueueDepth  # the app registry first

    start = end - DEPTH_WINDOW
    rows = list(
        QueueDepth.objects.using(using)
        .filter(Q(model=label) & Q(minute__gte=start) & Q(minute__lte=end))
        .order_by("minute")
        .values_list("minute", "ready", "processing")
    )
    if not rows:
        return None
    peak = max(1, max(max(r, p) for _m, r, p in rows))
    span = DEPTH_WINDOW.total_seconds()

    def point(minute: datetime, value: int) -> str:
        x = _LEFT + _PLOT_W * (minute - start).total_seconds() / span
        y = _TOP + _PLOT_H - _PLOT_H * value / peak
        return f"{x:.1f},{y:.1f}"

    ready: list[list[str]] = []
    processing: list[list[str]] = []
    last: datetime | None = None
    for minute, r, p in rows:
        if last is None or minute - last > GAP:
            ready.append([])
            processing.append([])
        ready[-1].append(point(minute, r))
        processing[-1].append(point(minute, p))
        last = minute
    latest_minute, ready_now, processing_now = rows[-1]
    peak_ready = max(r for _m, r, _p in rows)
    text = _(
        "%(who)s, last 24 hours: ready rows %(now)s at the last sample, at most %(peak)s; "
        "%(samples)s samples"
    ) % {"who": who, "now": ready_now, "peak": peak_ready, "samples": len(rows)}
    zone = timezone.get_current_timezone()
    return DepthChart(
        label=text,
        samples=len(rows),
        ready_lines=[" ".join(_single(run)) for run in ready],
        processing_lines=[" ".join(_single(run)) for run in processing],
        peak=peak,
        ready_now=int(ready_now),
        processing_now=int(processing_now),
        latest=latest_minute,
        peak_ready=int(peak_ready),
        first_label=_when(start, zone),
        last_label=_when(end, zone),
    )


def _single(run: list[str]) -> list[str]:
    """A lone sample drawn as a short dash (a polyline needs two points)."""
    if len(run) != 1:
        return run
    x, y = (float(v) for v in run[0].split(","))
    return [f"{x - 1:.1f},{y:.1f}", f"{x + 1:.1f},{y:.1f}"]


def _when(value: datetime, zone: Any) -> str:
    """``26 Nov 09:10`` in ``zone`` (the two ends of a day read the same hour)."""
    if timezone.is_aware(value):
        value = value.astimezone(zone)
    return value.strftime("%d %b %H:%M")
