"""Exceptions raised by django-taskclaim.

Errors end in ``Error`` and derive from :class:`TaskClaimError`. The control-flow
exceptions a task body may raise (:class:`Retry`, :class:`Fail`) and the fencing signal
:class:`ClaimLost` are named for what they mean.
"""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any

from django.core.exceptions import ImproperlyConfigured


class TaskClaimError(Exception):
    """Base class of every error raised by django-taskclaim."""


class ConfigurationError(TaskClaimError, ImproperlyConfigured):
    """A setting, a model's ``ClaimMeta`` option or an argument is invalid."""


class NotClaimableError(ConfigurationError):
    """The model lacks the fields a claim needs (it does not use the mixins)."""


class StrategyNotSupportedError(ConfigurationError):
    """The requested claim strategy is unknown or unsupported by the database."""


class DependencyError(TaskClaimError, ValueError):
    """An ``after=`` cannot be recorded: a prerequisite that is unsaved, the row itself,
    of a model that does not declare ``ClaimMeta.dependents``, on another database or
    gone; or a dependent model that maps no ``waiting`` state. Nothing was written.

    A cycle cannot be made: a new row can only wait for rows that exist already."""


class ClaimInTransactionError(TaskClaimError):
    """A claim was attempted inside the caller's open ``atomic()`` block.

    The claim would stay invisible to other workers (and to the reaper) until the
    caller commits, and its row locks would be held for the rest of the block.
    """


class ClaimLost(TaskClaimError):
    """The worker no longer holds the task: its fenced write affected nothing.

    Raised when the claim token (``version``) no longer matches, because the lease
    expired and the task was reaped or claimed by another worker, or because somebody
    changed the row (admin action, cancel). Nothing was written.
    """

    def __init__(self, message: str = "", *, task: object = None) -> None:
        super().__init__(message or "the claim on this task was lost; nothing was written")
        self.task = task


class LockNotAcquired(TaskClaimError):
    """A lock could not be acquired (already held elsewhere, or the wait timed out)."""


class LockUsageError(ConfigurationError, ValueError):
    """A lock was asked for with an invalid key, timeout or mode, or one the database
    (or the declared connection pooler) cannot honour. Nothing was locked."""


class LockLost(TaskClaimError):
    """A lock was held but is not any more: a lease taken over after it expired, or a
    session advisory lock that vanished with its connection. The protected block ran
    (at least in part) without the lock."""


#: The longest ``Retry(delay=…)``: a year (``config.bounds.RETRY_DELAY`` has the same
#: range; ``tests/unit/test_bounds.py`` checks that both refuse the same values alike).
RETRY_DELAY_MAX = 365 * 24 * 3600.0


def _retry_delay(delay: Any, what: str = "Retry delay") -> float:
    """``delay`` in seconds, or ``ValueError`` worded as ``config.bounds.number`` words it.

    Checked here rather than with ``config.bounds``: the bounds raise this module's
    :class:`ConfigurationError`, so this module stays below them."""
    seconds = delay.total_seconds() if isinstance(delay, timedelta) else delay
    shown = seconds if isinstance(delay, timedelta) else delay
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        raise ValueError(f"{what} must be a number of seconds, got {shown!r}")
    if not math.isfinite(seconds):
        raise ValueError(f"{what} must be a finite number, got {shown!r}")
    if seconds < 0:
        raise ValueError(f"{what} must be >= 0, got {shown!r}")
    if seconds > RETRY_DELAY_MAX:
        raise ValueError(f"{what} must be from 0 to {RETRY_DELAY_MAX:g}, got {shown!r}")
    return float(seconds)


class Retry(Exception):
    """Raise from a task body to run it again later.

    ``delay`` (seconds or ``timedelta``) overrides the model's backoff. The attempt
    counts towards ``max_attempts``; once exhausted the task ends ``failed``.
    """

    def __init__(self, delay: float | timedelta | None = None, reason: str = "") -> None:
        seconds = None if delay is None else _retry_delay(delay)
        #: Seconds before the next attempt (a ``timedelta`` given is converted), or ``None``
        #: for the model's backoff.
        self.delay: float | None = seconds
        self.reason = reason
        super().__init__(reason or (f"retry in {seconds:g}s" if seconds is not None else "retry"))


class Snooze(Exception):
    """Raise from a task body to park its row until later: ``ready`` again after
    ``delay`` (seconds or ``timedelta``), its worker slot freed at once. Unlike
    :class:`Retry` the attempt is not counted and no error is recorded; the row's
    completed steps (``task.step()``) are kept, so the next run picks up after them.
    Needs the model's ``run_after`` field (``ScheduleFieldsMixin``): on a model without
    one the attempt is retried with an error saying so."""

    def __init__(self, delay: float | timedelta = 0.0, reason: str = "") -> None:
        #: Seconds until the row is due again (a ``timedelta`` given is converted).
        self.delay: float = _retry_delay(delay, "Snooze delay")
        self.reason = reason
        super().__init__(reason or f"snooze for {self.delay:g}s")


class Parked(Snooze):
    """Raised by ``task.wait_for_event()`` when it parked the row until the event: the
    row is already written back (``ready``, due at the event or the deadline), so the
    worker only frees the slot. Let it propagate; a body that catches it runs on
    without a claim (its writes are fenced out)."""


class EventTimeout(TaskClaimError):
    """``task.wait_for_event(name, timeout)`` found the deadline passed with no event:
    the body's to handle (catch it to go on without the event; uncaught, the attempt
    is retried as any error). A new wait for the same name starts a new deadline."""

    def __init__(self, name: str, timeout: float) -> None:
        self.name = name
        self.timeout = timeout
        super().__init__(f"event {name!r} was not emitted within {timeout:g}s")


class Fail(Exception):
    """Raise from a task body to fail the task permanently (no further retries)."""

    def __init__(self, reason: str = "failed") -> None:
        self.reason = reason
        super().__init__(reason)
