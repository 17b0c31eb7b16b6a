"""The drawing of the admin's charts, without SQL: per-minute counts in, an SVG's bars,
scale and text out (:func:`draw_chart`; the templates ``charts*.html`` draw a
:class:`Chart` as inline SVG). Where the counts come from is :mod:`.charts`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.utils import timezone
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe
from django.utils.translation import gettext as _

__all__ = [
    "DAY_BUCKET_MINUTES",
    "DAY_MINUTES",
    "HOUR_MINUTES",
    "Bar",
    "Chart",
    "Series",
    "draw_chart",
    "utc_minute",
]

#: Minutes of history in the day chart (bars of :data:`DAY_BUCKET_MINUTES`) and the hour
#: chart (a bar per minute).
DAY_MINUTES = 24 * 60
HOUR_MINUTES = 60
#: Width of one bar of the day chart, in minutes.
DAY_BUCKET_MINUTES = 10

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


class AxisText:
    """Where a chart's axis texts stand, for a chart with ``left``, ``plot_top`` and
    ``height`` (the bar charts and the depth chart line up)."""

    left: float
    plot_top: float
    height: float

    @property
    def text_x(self) -> float:
        """Where the y axis' labels end (right-aligned)."""
        return self.left - 3

    @property
    def peak_y(self) -> float:
        """The baseline of the peak's label."""
        return self.plot_top + 3

    @property
    def time_y(self) -> float:
        """The baseline of the time labels under the axis."""
        return self.height - 2


@dataclass(frozen=True)
class Chart(AxisText):
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
    def failure_rate(self) -> str:
        """Failed of the finished attempts charted, in per cent ("2.4 %"; "—" for none)."""
        finished = self.done + self.failed
        if not finished:
            return "—"
        rate = 100 * self.failed / finished
        return f"{rate:.1f} %" if rate < 10 else f"{rate:.0f} %"

    @property
    def plot_h(self) -> float:
        """Height of the plot area (a bar's hover target spans it)."""
        return self.plot_bottom - self.plot_top

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


def utc_minute(value: datetime) -> datetime:
    """``value`` in UTC (when aware), cut to its minute."""
    if timezone.is_aware(value):
        value = value.astimezone(UTC)
    return value.replace(second=0, microsecond=0)


def _hhmm(value: datetime, zone: Any = None, *, day: bool = False) -> str:
    """``09:10`` in ``zone``; with ``day``, the date too (``26 Nov 09:10``): the 24-hour
    chart's two ends read the same hour."""
    if timezone.is_aware(value):
        value = value.astimezone(zone or timezone.get_current_timezone())
    return value.strftime("%d %b %H:%M" if day else "%H:%M")


def draw_chart(
    window: str,
    by_minute: dict[datetime, list[int]],
    end: datetime,
    minutes: int,
    step: int,
    who: str,
) -> Chart:
    """The chart of ``window`` (``"hour"`` or ``"day"``): the ``minutes`` before ``end``
    in bars of ``step`` minutes, from ``by_minute`` (``[done, failed]`` per UTC minute;
    minutes outside the window are left out), its text naming ``who``."""
    start = end - timedelta(minutes=minutes)
    n = minutes // step
    buckets = _buckets(by_minute, start, end, step, n)
    peak = max((d + f for d, f in buckets), default=0)
    bar_w = _BAR_W[minutes]
    zone = timezone.get_current_timezone()
    done = sum(b[0] for b in buckets)
    failed = sum(b[1] for b in buckets)
    unit = _("per minute") if step == 1 else _("per %(step)s min") % {"step": step}
    return Chart(
        window=window,
        label=_chart_label(window, who, done, failed, peak, step),
        bars=_bars(buckets, start, step, peak, bar_w, zone),
        peak=peak,
        done=done,
        failed=failed,
        width=round(_LEFT + n * bar_w + _RIGHT, 2),
        height=_TOP + _PLOT_H + _AXIS_H,
        plot_top=_TOP,
        plot_bottom=_TOP + _PLOT_H,
        left=_LEFT,
        right=round(_LEFT + n * bar_w, 2),
        first_label=_hhmm(start, zone, day=window == "day"),
        last_label=_hhmm(end, zone, day=window == "day"),
        unit=str(unit),
    )


def _buckets(
    by_minute: dict[datetime, list[int]], start: datetime, end: datetime, step: int, n: int
) -> list[list[int]]:
    """``[done, failed]`` of each of the ``n`` spans of ``step`` minutes from ``start``."""
    buckets = [[0, 0] for _ in range(n)]
    for minute, (done, failed) in by_minute.items():
        if start <= minute < end:
            i = int((minute - start).total_seconds() // 60) // step
            buckets[i][0] += done
            buckets[i][1] += failed
    return buckets


def _bars(
    buckets: list[list[int]], start: datetime, step: int, peak: int, bar_w: float, zone: Any
) -> list[Bar]:
    """The bars of the non-empty ``buckets`` (the ``i``-th from ``start + i * step``
    minutes), scaled to ``peak``, each with its hover text (in ``zone``)."""
    hover = _("%(when)s: %(done)s done, %(failed)s failed")
    rate = _("(%(rate)s done per minute)")
    bars = []
    for i, (done, failed) in enumerate(buckets):
        if not done and not failed:
            continue
        b_start = start + timedelta(minutes=i * step)
        when = _hhmm(b_start, zone)
        if step > 1:
            when = f"{when}–{_hhmm(b_start + timedelta(minutes=step), zone)}"
        text = hover % {"when": when, "done": done, "failed": failed}
        if step > 1:
            text += " " + rate % {"rate": f"{done / step:.1f}"}
        bars.append(
            _bar(
                b_start, step, done, failed, x=_LEFT + i * bar_w, bar_w=bar_w, peak=peak, title=text
            )
        )
    return bars


def _bar(
    start: datetime,
    step: int,
    done: int,
    failed: int,
    *,
    x: float,
    bar_w: float,
    peak: int,
    title: str,
) -> Bar:
    """One bar at ``x``, its done and failed rects stacked (failures on top) and scaled
    to ``peak``."""
    bottom = _TOP + _PLOT_H
    done_h = _PLOT_H * done / peak
    failed_h = _PLOT_H * failed / peak
    return Bar(
        start=start,
        minutes=step,
        done=done,
        failed=failed,
        x=round(x, 2),
        w=round(max(bar_w - 1, bar_w * 0.8), 2),
        done_y=round(bottom - done_h, 2),
        done_h=round(done_h, 2),
        failed_y=round(bottom - done_h - failed_h, 2),
        failed_h=round(failed_h, 2),
        title=title,
    )


def _chart_label(window: str, who: str, done: int, failed: int, peak: int, step: int) -> str:
    """The chart's accessible name: whose, which window, its totals and its peak."""
    if window == "hour":
        label = _(
            "%(who)s, last hour: %(done)s done, %(failed)s failed; at most %(peak)s in a minute"
        )
    else:
        label = _(
            "%(who)s, last 24 hours: %(done)s done, %(failed)s failed; at most %(peak)s in "
            "%(step)s minutes"
        )
    return label % {"who": who, "done": done, "failed": failed, "peak": peak, "step": step}
