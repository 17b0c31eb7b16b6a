"""Numeric bounds, and the one validator they all go through.

A number that reaches a statement, a sleep or a thread pool is checked here first:
finite, of the right kind, within its bounds. The ranges are declared beside what they
bound: each ``TASKCLAIM_*`` setting's in :data:`django_taskclaim.config.settings.TABLE`
(system check ``taskclaim.E005``), each command option's in its table of
:class:`~django_taskclaim.config.commandline.Option` (the worker's, the relay's, the
reaper's); a range shared by a setting and the ``ClaimMeta`` options or call arguments
that fall back to it is named here (:data:`LEASE` …), as are those of the other
commands, the locks and the batch sizes. One option has one
range wherever it is given, and an absurd value is a one-line error instead of a
``DataError``, an ``OverflowError`` or a busy loop.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django_taskclaim.exceptions import ConfigurationError

DAY = 24 * 3600.0
#: The longest lease a claim or a lock may take (30 days). Longer tasks are kept alive
#: by heartbeats; a lease is never a way to park a row.
MAX_LEASE = 30 * DAY


@dataclass(frozen=True)
class Bound:
    """An inclusive range ``low ≤ value ≤ high``; ``whole`` numbers only if set."""

    low: float
    high: float
    whole: bool = False

    def text(self) -> str:
        return f"from {self.low:g} to {self.high:g}"


#: ``TASKCLAIM_LEASE``, ``TASKCLAIM_MAX_ATTEMPTS``, ``TASKCLAIM_RETRY_BACKOFF`` (and
#: ``_MAX``), ``TASKCLAIM_RETRY_JITTER`` and ``TASKCLAIM_CLAIM_GATE``, the ``ClaimMeta``
#: options that fall back to them and the arguments of ``claim()`` / ``extend_lease()``:
#: one range each, wherever the value is given.
LEASE = Bound(0.001, MAX_LEASE)
MAX_ATTEMPTS = Bound(1, 1_000_000, whole=True)
RETRY_BACKOFF = Bound(0.0, 365 * DAY)
RETRY_JITTER = Bound(0.0, 1.0)
CLAIM_GATE = Bound(1, 100_000, whole=True)
#: ``ClaimMeta.rate_limit`` / ``key_rate_limit`` (``"N/window"``): starts per window (one
#: slot row each in the database) and the window, from 10 ms to a day.
RATE_COUNT = Bound(1, 10_000, whole=True)
RATE_WINDOW = Bound(0.01, DAY)
#: ``TASKCLAIM_TIMEOUT``, ``ClaimMeta.timeout`` and a row's ``task_timeout``: a body's
#: deadline, from 1 ms to a year (heartbeats keep its lease meanwhile).
TIMEOUT = Bound(0.001, 365 * DAY)
#: ``TASKCLAIM_TIMEOUT_GRACE``: how long a body past its deadline has to stop before its
#: supervised process is replaced.
TIMEOUT_GRACE = Bound(0.0, MAX_LEASE)

#: ``LeaseLock(ttl=…)``: from 50 ms (shorter cannot be renewed in time) to 30 days.
LOCK_TTL = Bound(0.05, MAX_LEASE)

#: Rows one ``claim(n)`` may take, and rows per statement of ``reap()`` / ``prune()``
#: (``taskclaim_prune --batch-size``).
CLAIM_SIZE = Bound(1, 100_000, whole=True)
BATCH_SIZE = Bound(1, 100_000, whole=True)
#: ``ClaimMeta.concurrency_limit``: rows ``processing`` at once per key value.
CONCURRENCY_LIMIT = Bound(1, 1000, whole=True)
#: ``Retry(delay=…)`` and ``retry(delay=…)``: from now to a year ahead.
RETRY_DELAY = Bound(0.0, 365 * DAY)
#: The longest span the database's clock is moved by (100 years): the age of
#: ``taskclaim_prune --older-than`` / ``prune(older_than=…)`` / ``archive_finished``, and
#: how far ahead a ``django.tasks`` ``run_after`` timedelta may reach. It keeps the
#: database's ``now() ± span`` well inside every database's timestamps (years 1-9999);
#: a longer span is a mistake, not a schedule.
MAX_AGE = 36500 * DAY
AGE = Bound(0.0, MAX_AGE)


def number(
    value: Any,
    name: str,
    bound: Bound,
    *,
    parse: bool = False,
    seconds: bool = False,
    error: type[Exception] = ConfigurationError,
) -> Any:
    """``value`` as an ``int`` (``bound.whole``) or a ``float`` within ``bound``, or
    ``error`` with one line naming ``name``, what it must be and what it got.

    ``parse`` accepts text (command-line options); ``seconds`` accepts a ``timedelta``.
    ``bool`` is never a number; NaN and infinities never pass. The messages say
    ``must be a whole number`` / ``a finite number`` / ``> 0`` / ``>= 0`` /
    ``from LOW to HIGH``, whichever applies first.
    """
    # The hot path (every claim checks its size and lease): a plain int, or a float
    # where fractions are allowed, within the bound. NaN and infinities are never
    # within it, ``bool`` is not ``int`` by type: everything else takes the checks below.
    kind_of = type(value)
    if (kind_of is int or (kind_of is float and not bound.whole)) and (
        bound.low <= value <= bound.high
    ):
        return value if bound.whole else float(value)
    if seconds and isinstance(value, timedelta):
        value = value.total_seconds()
    kind: type = int if bound.whole else float
    what = "a whole number" if bound.whole else "a number"
    if seconds and not bound.whole:
        what += " of seconds"
    if isinstance(value, bool):
        raise error(f"{name} must be {what}, got {value!r}")
    if isinstance(value, str):
        if not parse:
            raise error(f"{name} must be {what}, got {value!r}")
        try:
            number_ = kind(value)
        except (TypeError, ValueError, OverflowError):
            raise error(f"{name} must be {what}, got {value!r}") from None
    elif bound.whole:
        if not isinstance(value, int):
            raise error(f"{name} must be {what}, got {value!r}")
        number_ = value
    else:
        if not isinstance(value, int | float):
            raise error(f"{name} must be {what}, got {value!r}")
        number_ = float(value)
    # An int is finite (and isfinite() of one too large for a float raises OverflowError).
    if isinstance(number_, float) and not math.isfinite(number_):
        raise error(f"{name} must be a finite number, got {value!r}")
    if number_ < 0 or (number_ == 0 and bound.low > 0):
        raise error(f"{name} must be {'> 0' if bound.low > 0 else '>= 0'}, got {value!r}")
    if not bound.low <= number_ <= bound.high:
        raise error(f"{name} must be {bound.text()}, got {value!r}")
    return number_


def span(
    value: Any, name: str, bound: Bound, *, error: type[Exception] = ConfigurationError
) -> timedelta:
    """``value``, a ``timedelta`` within ``bound`` (in seconds), or ``error`` with one
    line naming ``name``, the bound (in days) and what it got."""
    if not isinstance(value, timedelta):
        raise error(f"{name} must be a timedelta, got {value!r}")
    if not bound.low <= value.total_seconds() <= bound.high:
        raise error(
            f"{name} must be from {bound.low / DAY:g} to {bound.high / DAY:g} days, got {value!r}"
        )
    return value
