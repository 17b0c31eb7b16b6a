"""When a schedule's slots fall: aware UTC instants from a cron expression read in a time
zone, or from a fixed interval. Pure logic, no database.

Daylight saving, for cron expressions (the zone's wall clock jumps):

- **A wall time that does not exist** (clocks go forward: 02:30 on the last Sunday of
  March in Europe/Paris) fires at the first instant after the gap (03:00 local), once:
  several missing wall times that land there are one slot.
- **A wall time that happens twice** (clocks go back: 02:30 on the last Sunday of
  October in Europe/Paris) fires once, at its first occurrence, for a fixed-time
  schedule (``30 2 * * *``); a schedule whose minute or hour field starts with ``*``
  (``*/15 * * * *``, ``@hourly``) repeats within the day and fires at both occurrences,
  so it keeps its rhythm through the repeated hour.

Intervals (``every 10s``) are counted from the Unix epoch in UTC and ignore the zone:
``every 1h`` fires on the hour, UTC, all year.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, tzinfo
from typing import Protocol
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django_taskclaim.config import bounds
from django_taskclaim.exceptions import ConfigurationError
from django_taskclaim.periodic.cron import Cron, parse_cron

__all__ = [
    "EVERY",
    "CronTiming",
    "Interval",
    "Timing",
    "instants_of",
    "parse_every",
    "parse_timing",
    "parse_zone",
    "zone_name",
]

#: Longer than any daylight-saving shift: how far around an instant the wall-clock
#: candidates are examined.
WINDOW = timedelta(hours=3)
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
#: ``every=`` / ``"every …"``: whole seconds, from 1 s to 366 days.
EVERY = bounds.Bound(1, 366 * bounds.DAY, whole=True)
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_PART = re.compile(r"\s*(\d+)\s*([smhd])", re.ASCII)
_TINY = timedelta(microseconds=1)


class Timing(Protocol):
    """What a schedule needs from its timing: the slots around an instant."""

    @property
    def text(self) -> str:
        """The schedule as written."""

    def next_after(self, moment: datetime) -> datetime | None:
        """The first slot strictly after ``moment``."""

    def last_at_or_before(self, moment: datetime) -> datetime | None:
        """The last slot at or before ``moment``."""


def _aware(moment: datetime) -> datetime:
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise ValueError(f"schedule instants must be timezone-aware, got {moment!r}")
    return moment.astimezone(UTC)


@dataclass(frozen=True)
class Interval:
    """A slot every ``seconds`` seconds, counted from the Unix epoch (UTC)."""

    seconds: int

    @property
    def text(self) -> str:
        """The normalised spelling, such as ``every 1h30m``."""
        rest, parts = self.seconds, []
        for unit, size in sorted(_UNITS.items(), key=lambda kv: -kv[1]):
            if rest >= size:
                parts.append(f"{rest // size}{unit}")
                rest %= size
        return "every " + "".join(parts)

    def last_at_or_before(self, moment: datetime) -> datetime:
        """The last slot at or before ``moment`` (aware)."""
        step = timedelta(seconds=self.seconds)
        return EPOCH + ((_aware(moment) - EPOCH) // step) * step

    def next_after(self, moment: datetime) -> datetime:
        """The first slot strictly after ``moment`` (aware)."""
        return self.last_at_or_before(moment) + timedelta(seconds=self.seconds)


def instants_of(cron: Cron, wall: datetime, zone: tzinfo) -> list[datetime]:
    """The UTC instants at which the naive wall-clock time ``wall`` of ``zone`` fires,
    earliest first: one, or two in a repeated hour for a ``wildcard_time`` schedule
    (the rules are in the module docstring)."""
    first = wall.replace(tzinfo=zone, fold=0).astimezone(UTC)
    second = wall.replace(tzinfo=zone, fold=1).astimezone(UTC)
    if first == second:
        return [first]
    if first.astimezone(zone).replace(tzinfo=None) != wall:  # in a gap: does not exist
        return [_gap_end(min(first, second), max(first, second), zone)]
    return [first, second] if cron.wildcard_time else [first]


def _gap_end(low: datetime, high: datetime, zone: tzinfo) -> datetime:
    """The first whole second of the new offset between ``low`` (the old offset holds)
    and ``high`` (the new one does): where the clocks jumped forward."""
    after = high.astimezone(zone).utcoffset()
    lo, hi = int(low.timestamp()), int(high.timestamp())
    while hi - lo > 1:
        middle = (lo + hi) // 2
        if datetime.fromtimestamp(middle, UTC).astimezone(zone).utcoffset() == after:
            hi = middle
        else:
            lo = middle
    return datetime.fromtimestamp(hi, UTC)


@dataclass(frozen=True)
class CronTiming:
    """A cron expression read on the wall clock of ``zone``."""

    cron: Cron
    zone: tzinfo

    @property
    def text(self) -> str:
        """The expression as declared."""
        return self.cron.text

    def _local(self, moment: datetime) -> datetime:
        return _aware(moment).astimezone(self.zone).replace(tzinfo=None)

    def _steady(self, moment: datetime) -> bool:
        """No change of offset within ``WINDOW`` of ``moment`` (two changes never come
        that close together)."""
        try:
            offsets = {(moment + k * WINDOW).astimezone(self.zone).utcoffset() for k in (-1, 0, 1)}
        except OverflowError:
            return False
        return len(offsets) == 1

    def _simple(self, moment: datetime, wall: datetime | None) -> datetime | None:
        """``wall``'s instant if the clock is steady around ``moment`` and around it (then
        wall-clock order is instant order there, and no other wall can come between)."""
        if wall is None or not self._steady(moment):
            return None
        found = instants_of(self.cron, wall, self.zone)
        return found[0] if len(found) == 1 and self._steady(found[0]) else None

    def next_after(self, moment: datetime) -> datetime | None:
        """The first slot strictly after ``moment`` (aware), or ``None`` past year 9999.

        Away from offset changes, the next matching wall time is the answer. Near one,
        wall-clock candidates are examined from ``WINDOW`` before ``moment``'s local
        time until one ``WINDOW`` past the best instant found, so a repeated or missing
        hour never hides an earlier slot."""
        moment = _aware(moment)
        simple = self._simple(moment, self.cron.next_wall(self._local(moment)))
        if simple is not None:
            return simple
        try:
            wall = self.cron.next_wall(self._local(moment) - WINDOW - _TINY)
        except OverflowError:
            wall = None
        best: datetime | None = None
        while wall is not None:
            if best is not None and wall > self._local(best) + WINDOW:
                break
            for instant in instants_of(self.cron, wall, self.zone):
                if instant > moment and (best is None or instant < best):
                    best = instant
            wall = self.cron.next_wall(wall)
        return best

    def last_at_or_before(self, moment: datetime) -> datetime | None:
        """The last slot at or before ``moment`` (aware), or ``None`` before year 1
        (examined as :meth:`next_after` does, backwards)."""
        moment = _aware(moment)
        simple = self._simple(moment, self.cron.prev_wall(self._local(moment)))
        if simple is not None:
            return simple
        try:
            wall = self.cron.prev_wall(self._local(moment) + WINDOW)
        except OverflowError:
            wall = None
        best: datetime | None = None
        while wall is not None:
            if best is not None and wall < self._local(best) - WINDOW:
                break
            for instant in instants_of(self.cron, wall, self.zone):
                if instant <= moment and (best is None or instant > best):
                    best = instant
            try:
                wall = self.cron.prev_wall(wall - timedelta(minutes=1))
            except OverflowError:
                wall = None
        return best


def parse_zone(zone: str | tzinfo) -> tzinfo:
    """``zone`` as a ``tzinfo``: an IANA name (``"Europe/Paris"``), ``"UTC"``, a
    ``ZoneInfo`` or ``datetime.UTC``; anything else is a ``ConfigurationError``."""
    if zone is UTC or (isinstance(zone, str) and zone.upper() == "UTC"):
        return UTC
    if isinstance(zone, ZoneInfo):
        return zone
    if isinstance(zone, str):
        try:
            return ZoneInfo(zone)
        except (ZoneInfoNotFoundError, ValueError):
            raise ConfigurationError(
                f"time zone {zone!r} is unknown: use an IANA name such as 'Europe/Paris'"
            ) from None
    raise ConfigurationError(f"tz must be an IANA zone name or a ZoneInfo, got {zone!r}")


def zone_name(zone: tzinfo) -> str:
    """The name a zone is shown by (``UTC``, ``Europe/Paris``)."""
    return "UTC" if zone is UTC else str(getattr(zone, "key", zone))


def parse_every(every: str | int | float | timedelta) -> Interval:
    """An interval from ``timedelta``, a number of seconds, or text such as
    ``"every 10s"``, ``"every 1h30m"``, ``"5m"`` (units ``s m h d``); whole seconds from
    1 s to 366 days, else a ``ConfigurationError``."""
    if isinstance(every, timedelta):
        every = every.total_seconds()
    if isinstance(every, float) and every.is_integer():
        every = int(every)
    seconds: object = every
    if isinstance(every, str):
        text = every.strip().lower().removeprefix("every").strip()
        position, total_seconds = 0, 0
        for match in _PART.finditer(text):
            if match.start() != position:
                break
            total_seconds += int(match.group(1)) * _UNITS[match.group(2)]
            position = match.end()
        if not text or position != len(text):
            raise ConfigurationError(
                f"interval {every!r} is not understood: write 'every 10s', 'every 5m', "
                "'every 1h30m' or 'every 1d'"
            )
        seconds = total_seconds
    return Interval(int(bounds.number(seconds, "the interval (seconds)", EVERY)))


def parse_timing(schedule: str | None, every: object, zone: tzinfo) -> Timing:
    """The timing of ``@periodic(schedule)`` / ``@periodic(every=…)``: exactly one of
    them; text starting with ``every`` is an interval, other text a cron expression."""
    if (schedule is None) == (every is None):
        raise ConfigurationError(
            "give @periodic a cron expression ('0 3 * * *'), an interval ('every 10s') "
            "or every=timedelta(...): exactly one"
        )
    if every is not None:
        if not isinstance(every, str | int | float | timedelta):
            raise ConfigurationError(f"every must be a timedelta or seconds, got {every!r}")
        return parse_every(every)
    if not isinstance(schedule, str):
        raise ConfigurationError(f"a schedule must be text, got {schedule!r}")
    if schedule.strip().lower().startswith("every"):
        return parse_every(schedule)
    return CronTiming(parse_cron(schedule), zone)
