"""Five-field cron expressions: parsing, and matching of local wall-clock minutes.

Pure logic on naive datetimes (the wall clock of the schedule's zone); turning wall
times into instants, with the daylight-saving rules, is :mod:`.timing`'s job.

Syntax: ``minute hour day-of-month month day-of-week``, each field ``*``, a number, a
range ``a-b``, a step ``*/n`` / ``a-b/n`` / ``a/n`` (``a`` to the field's end), or a
comma-separated list of those. Months and weekdays may be named (``jan``…``dec``,
``sun``…``sat``, any case); weekday ``0`` and ``7`` are Sunday. As in classic cron, when
both day fields are restricted (neither starts with ``*``) a day matches if *either*
matches; otherwise it must match both. Macros: ``@yearly`` (``@annually``),
``@monthly``, ``@weekly``, ``@daily`` (``@midnight``), ``@hourly``.
"""

from __future__ import annotations

import calendar
from dataclasses import dataclass
from datetime import date, datetime, timedelta

from django_taskclaim.exceptions import ConfigurationError

__all__ = ["MACROS", "Cron", "parse_cron"]

MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_MONTHS = {name.lower(): i for i, name in enumerate(calendar.month_abbr) if name}
_DAYS = {"sun": 0, "mon": 1, "tue": 2, "wed": 3, "thu": 4, "fri": 5, "sat": 6}
#: (name, lowest, highest, names) of the five fields, in order.
_FIELDS: tuple[tuple[str, int, int, dict[str, int]], ...] = (
    ("minute", 0, 59, {}),
    ("hour", 0, 23, {}),
    ("day of month", 1, 31, {}),
    ("month", 1, 12, _MONTHS),
    ("day of week", 0, 7, _DAYS),
)
_MINUTE = timedelta(minutes=1)
#: A matching day exists within 8 years (the longest gap between two 29 Februaries).
_SEARCH_YEARS = 9


@dataclass(frozen=True)
class Cron:
    """A parsed cron expression: the allowed values of each field (see the module doc).

    ``wildcard_time``: the minute or the hour field starts with ``*`` (the schedule
    repeats within the day, such as ``*/15 * * * *`` or ``@hourly``); it decides how a
    repeated wall-clock hour is treated (:mod:`.timing`).
    """

    text: str
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]
    any_day: bool
    any_weekday: bool
    wildcard_time: bool

    def matches_day(self, day: date) -> bool:
        """Whether ``day`` is a day of the schedule (month and the day-fields rule)."""
        if day.month not in self.months:
            return False
        in_month = day.day in self.days
        in_week = day.isoweekday() % 7 in self.weekdays
        if self.any_day or self.any_weekday:
            return in_month and in_week
        return in_month or in_week

    def matches(self, wall: datetime) -> bool:
        """Whether the minute of the wall-clock time ``wall`` is a slot of the schedule."""
        return (
            wall.minute in self.minutes
            and wall.hour in self.hours
            and self.matches_day(wall.date())
        )

    def next_wall(self, wall: datetime) -> datetime | None:
        """The first matching wall-clock minute strictly after ``wall`` (naive), or
        ``None`` past the year 9999."""
        t = wall.replace(second=0, microsecond=0, tzinfo=None)
        try:
            t += _MINUTE
            limit = t.year + _SEARCH_YEARS
            while t.year <= limit:
                if t.month not in self.months:
                    t = _first_of_next_month(t)
                elif not self.matches_day(t.date()):
                    t = datetime(t.year, t.month, t.day) + timedelta(days=1)
                elif t.hour not in self.hours:
                    later = [h for h in self.hours if h > t.hour]
                    if later:
                        t = t.replace(hour=later[0], minute=0)
                    else:
                        t = datetime(t.year, t.month, t.day) + timedelta(days=1)
                elif t.minute not in self.minutes:
                    later = [m for m in self.minutes if m > t.minute]
                    if later:
                        t = t.replace(minute=later[0])
                    else:
                        t = t.replace(minute=0) + timedelta(hours=1)
                else:
                    return t
        except OverflowError:
            return None
        return None  # pragma: no cover - parse_cron refuses expressions that never match

    def prev_wall(self, wall: datetime) -> datetime | None:
        """The last matching wall-clock minute at or before ``wall`` (naive), or ``None``
        before the year 1."""
        t = wall.replace(second=0, microsecond=0, tzinfo=None)
        limit = t.year - _SEARCH_YEARS
        try:
            while t.year >= limit:
                if t.month not in self.months:
                    t = datetime(t.year, t.month, 1) - _MINUTE
                elif not self.matches_day(t.date()):
                    t = datetime(t.year, t.month, t.day) - _MINUTE
                elif t.hour not in self.hours:
                    earlier = [h for h in self.hours if h < t.hour]
                    if earlier:
                        t = t.replace(hour=earlier[-1], minute=59)
                    else:
                        t = datetime(t.year, t.month, t.day) - _MINUTE
                elif t.minute not in self.minutes:
                    earlier = [m for m in self.minutes if m < t.minute]
                    t = t.replace(minute=earlier[-1]) if earlier else t.replace(minute=0) - _MINUTE
                else:
                    return t
        except OverflowError:
            return None
        return None  # pragma: no cover - parse_cron refuses expressions that never match


def _first_of_next_month(t: datetime) -> datetime:
    if t.month == 12:
        return datetime(t.year + 1, 1, 1)
    return datetime(t.year, t.month + 1, 1)


def _value(text: str, field: str, low: int, high: int, names: dict[str, int]) -> int:
    word = text.strip().lower()
    if word in names:
        return names[word]
    if not (word.isascii() and word.isdigit()):
        raise ValueError(f"{text!r} is not a number{' or a name' if names else ''}")
    number = int(word)
    if not low <= number <= high:
        raise ValueError(f"{number} is outside {low}-{high}")
    return number


def _field(text: str, field: str, low: int, high: int, names: dict[str, int]) -> set[int]:
    values: set[int] = set()
    for item in text.split(","):
        if not item:
            raise ValueError("an empty list item")
        part, slash, step_text = item.partition("/")
        step = 1
        if slash:
            if not (step_text.isascii() and step_text.isdigit()) or int(step_text) < 1:
                raise ValueError(f"step {step_text!r} must be a whole number >= 1")
            step = int(step_text)
        if part == "*":
            first, last = low, high
        elif "-" in part:
            a, _, b = part.partition("-")
            first = _value(a, field, low, high, names)
            last = _value(b, field, low, high, names)
            if first > last:
                raise ValueError(f"range {part!r} runs backwards")
        else:
            first = _value(part, field, low, high, names)
            last = high if slash else first
        values.update(range(first, last + 1, step))
    return values


def parse_cron(text: str) -> Cron:
    """Parse a five-field cron expression or macro (see the module docstring).

    Raises :class:`~django_taskclaim.exceptions.ConfigurationError` with one line naming
    the field and the problem, also for an expression that can never match (such as
    ``0 0 30 2 *``, the 30th of February).
    """
    if not isinstance(text, str):
        raise ConfigurationError(f"a cron expression must be text, got {text!r}")
    expression = MACROS.get(text.strip().lower(), text)
    parts = expression.split()
    if len(parts) != 5:
        raise ConfigurationError(
            f"cron expression {text!r} must have 5 fields (minute hour day-of-month month "
            f"day-of-week) or be one of {', '.join(MACROS)}; it has {len(parts)}"
        )
    sets: list[set[int]] = []
    for part, (field, low, high, names) in zip(parts, _FIELDS, strict=True):
        try:
            sets.append(_field(part, field, low, high, names))
        except ValueError as exc:
            raise ConfigurationError(f"cron expression {text!r}, {field} field: {exc}") from None
    minutes, hours, days, months, weekdays = sets
    weekdays = {d % 7 for d in weekdays}
    any_day, any_weekday = parts[2].startswith("*"), parts[4].startswith("*")
    if any_day or any_weekday:  # both day fields must match: is there such a day?
        longest = max(29 if m == 2 else calendar.monthrange(2001, m)[1] for m in months)
        if min(days) > longest:
            raise ConfigurationError(
                f"cron expression {text!r} never matches: no month it names has day {min(days)}"
            )
    return Cron(
        text=text.strip(),
        minutes=tuple(sorted(minutes)),
        hours=tuple(sorted(hours)),
        days=frozenset(days),
        months=frozenset(months),
        weekdays=frozenset(weekdays),
        any_day=any_day,
        any_weekday=any_weekday,
        wildcard_time=parts[0].startswith("*") or parts[1].startswith("*"),
    )
