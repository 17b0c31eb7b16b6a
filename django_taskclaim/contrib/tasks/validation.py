"""What ``TaskClaimBackend`` checks of its options and of each task before it writes.

The numbers of ``TASKS[alias]["OPTIONS"]`` (:func:`number_option`,
:func:`max_attempts_value`) and a task's ``priority`` and ``run_after``
(:func:`check_priority`, :func:`check_run_after`): each raises Django's
``InvalidTaskBackend`` / ``InvalidTask`` (or :class:`~.exceptions.InvalidTaskValue`) with
one line naming the value and its bound. Used by :mod:`.backend`; what a row stores of
the call is checked in :mod:`.arguments`.
"""

from __future__ import annotations

import math
from dataclasses import fields
from datetime import UTC, datetime, timedelta
from typing import Any

from django.tasks import Task
from django.tasks.base import TASK_MAX_PRIORITY, TASK_MIN_PRIORITY
from django.tasks.exceptions import InvalidTask, InvalidTaskBackend

from django_taskclaim.config import bounds
from django_taskclaim.contrib.tasks.exceptions import InvalidTaskValue

#: Keys accepted in ``TASKS[alias]["OPTIONS"]`` and what they mean.
OPTION_NAMES = {
    "database": "alias of the database holding the task table (default: the router's choice)",
    "max_attempts": "attempts (claims) a task gets before it ends FAILED (1-1000)",
    "retry_backoff": "seconds before the first retry; doubles on each further attempt",
    "retry_backoff_max": "cap of the retry backoff, seconds",
    "retry_jitter": "± fraction of random spread applied to each backoff (0-1)",
}


def number_option(value: Any, name: str, *, low: float, high: float | None = None) -> float:
    """``value`` (a number or a ``timedelta``) as a ``float`` of at least ``low`` (at most
    ``high``), or ``InvalidTaskBackend`` naming ``name``."""
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidTaskBackend(f"{name} must be a number, got {value!r}")
    if value < low or (high is not None and value > high):
        within = f">= {low}" if high is None else f"between {low} and {high}"
        raise InvalidTaskBackend(f"{name} must be {within}, got {value!r}")
    return float(value)


def max_attempts_value(value: Any, where: str) -> int:
    """``value`` if it is a whole number of attempts a task may get, else
    ``InvalidTaskBackend`` naming ``where``."""
    from django_taskclaim.contrib.tasks.models import (
        MAX_ATTEMPTS_CEILING,  # deferred: models need the app registry
    )

    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or not (1 <= value <= MAX_ATTEMPTS_CEILING)
    ):
        raise InvalidTaskBackend(
            f"{where} must be a whole number between 1 and {MAX_ATTEMPTS_CEILING}, got {value!r}"
        )
    return value


def check_priority(priority: Any) -> None:
    """``InvalidTask`` unless ``priority`` is a number; :class:`InvalidTaskValue` for NaN
    or an infinity (Django's own range check would raise a raw ``ValueError``)."""
    if isinstance(priority, bool) or not isinstance(priority, int | float):
        raise InvalidTask(f"priority must be a whole number, got {priority!r}")
    if isinstance(priority, float) and not math.isfinite(priority):
        raise InvalidTaskValue(
            f"priority must be a whole number between {TASK_MIN_PRIORITY} and "
            f"{TASK_MAX_PRIORITY}, got {priority!r}"
        )


def check_run_after(run_after: datetime | timedelta | None) -> None:
    """:class:`InvalidTaskValue` for a ``run_after`` no database can store: a negative or
    longer than :data:`~django_taskclaim.config.bounds.MAX_AGE` ``timedelta``, an aware
    ``datetime`` outside years 1 to 9999 once in UTC."""
    if isinstance(run_after, timedelta):
        if run_after < timedelta(0):
            raise InvalidTaskValue(f"run_after must not be a negative timedelta, got {run_after!r}")
        if run_after.total_seconds() > bounds.MAX_AGE:
            raise InvalidTaskValue(
                f"run_after must be at most {bounds.MAX_AGE / bounds.DAY:g} days ahead, "
                f"got {run_after!r}"
            )
    elif isinstance(run_after, datetime) and run_after.utcoffset() is not None:
        try:
            run_after.astimezone(UTC)
        except OverflowError:
            raise InvalidTaskValue(
                f"run_after {run_after.isoformat()} is out of range: it must be between "
                f"{datetime.min.isoformat()} and {datetime.max.isoformat()} in UTC"
            ) from None


def copy_task(task: Task, **changes: Any) -> Task:
    """A copy of ``task`` with ``changes``, without running its validation."""
    copy = object.__new__(type(task))
    for f in fields(task):
        object.__setattr__(copy, f.name, changes.get(f.name, getattr(task, f.name)))
    return copy
