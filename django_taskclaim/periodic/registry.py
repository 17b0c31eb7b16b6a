"""``@periodic``: schedules declared in code, kept in one registry per process.

A schedule is found by every process that imports the module declaring it. The worker's
scheduler and the admin call :func:`discover` first, which imports the ``periodic``
module of every installed app (as the admin imports ``admin`` modules); schedules
declared in ``models.py`` or anywhere ``AppConfig.ready()`` imports are found too.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, tzinfo
from typing import Any, TypeVar

from django.db import models
from django.utils.module_loading import autodiscover_modules

from django_taskclaim.config import bounds
from django_taskclaim.config.discovery import is_claimable
from django_taskclaim.exceptions import ConfigurationError
from django_taskclaim.periodic.timing import CronTiming, Timing, parse_timing, parse_zone, zone_name

__all__ = [
    "MISSED_POLICIES",
    "PERIODIC_RUN",
    "Due",
    "Schedule",
    "discover",
    "get",
    "periodic",
    "register",
    "schedules",
    "unregister",
]

#: What happens to slots that passed while no scheduler ran (see ``docs/periodic.md``).
MISSED_POLICIES = ("skip", "catch_up")
#: ``max_catch_up``: slots one catch-up may enqueue.
MAX_CATCH_UP = bounds.Bound(1, 10_000, whole=True)
DEFAULT_MAX_CATCH_UP = 100
#: The model whose rows run decorated functions.
PERIODIC_RUN = "taskclaim.PeriodicRun"
NAME_MAX_LENGTH = 200
_TINY = timedelta(microseconds=1)

T = TypeVar("T")


@dataclass(frozen=True)
class Due:
    """The slots to enqueue now (oldest first), and ``passed_over``: the latest slot
    after the last recorded one that the missed-slot policy leaves out (``None`` if it
    leaves out none)."""

    slots: list[datetime]
    passed_over: datetime | None = None


@dataclass(frozen=True)
class Schedule:
    """A registered schedule: its ``name`` (the key of its slots), ``timing``, zone,
    missed-slot policy, and what a slot enqueues: a ``function`` (dotted path, run by a
    :class:`~django_taskclaim.models.PeriodicRun` row) or a row of ``model``."""

    name: str
    timing: Timing
    zone: tzinfo
    missed: str = "skip"
    max_catch_up: int = DEFAULT_MAX_CATCH_UP
    function: str | None = None
    model: type[models.Model] | None = field(default=None, compare=False)
    model_label: str | None = None

    @property
    def text(self) -> str:
        """The schedule as declared (``0 3 * * *``, ``every 10s``)."""
        return self.timing.text

    @property
    def zone_name(self) -> str:
        """The zone cron fields are read in (intervals ignore it)."""
        return zone_name(self.zone) if isinstance(self.timing, CronTiming) else "UTC"

    @property
    def target_label(self) -> str:
        """The label of the model a slot creates a row of."""
        return self.model_label or PERIODIC_RUN

    @property
    def target(self) -> str:
        """What a slot runs: the function's dotted path or the model's label."""
        return self.function or self.target_label

    def next_after(self, moment: datetime) -> datetime | None:
        """The first slot strictly after ``moment`` (aware)."""
        return self.timing.next_after(moment)

    def last_at_or_before(self, moment: datetime) -> datetime | None:
        """The last slot at or before ``moment`` (aware)."""
        return self.timing.last_at_or_before(moment)

    def due(self, since: datetime, now: datetime) -> Due:
        """The slots after ``since`` (the last slot recorded, exclusive) and at or before
        ``now`` to enqueue: ``skip`` keeps only the latest, ``catch_up`` the latest
        ``max_catch_up``. Slots at or before ``since`` are never returned."""
        latest = self.last_at_or_before(now)
        if latest is None or latest <= since:
            return Due([])
        limit = 1 if self.missed == "skip" else self.max_catch_up
        found = [latest]
        passed_over = None
        while True:
            earlier = self.last_at_or_before(found[-1] - _TINY)
            if earlier is None or earlier <= since:
                break
            if len(found) >= limit:
                passed_over = earlier
                break
            found.append(earlier)
        return Due(found[::-1], passed_over)


_registry: dict[str, Schedule] = {}
_lock = threading.Lock()
_discovered = False


def register(schedule: Schedule) -> Schedule:
    """Add ``schedule`` to this process's registry; the same declaration again is a
    no-op. Two different schedules with one name (names compare case-insensitively, as
    MySQL's default collation does) are a ``ConfigurationError``."""
    with _lock:
        for existing in _registry.values():
            if existing.name.lower() != schedule.name.lower():
                continue
            if existing == schedule:
                return existing
            raise ConfigurationError(
                f"two periodic schedules are named {schedule.name!r} ({existing.target} and "
                f"{schedule.target}): give one of them another name=..."
            )
        _registry[schedule.name] = schedule
    return schedule


def unregister(name: str) -> Schedule | None:
    """Remove the schedule named ``name`` from this process's registry (for tests);
    return it, or ``None`` if there was none."""
    with _lock:
        return _registry.pop(name, None)


def get(name: str) -> Schedule | None:
    """The registered schedule named ``name``, or ``None``."""
    return _registry.get(name)


def schedules() -> list[Schedule]:
    """Every schedule registered in this process, by name (call :func:`discover` first
    to include the ``periodic`` modules of the installed apps)."""
    with _lock:
        return sorted(_registry.values(), key=lambda s: s.name)


def discover() -> None:
    """Import the ``periodic`` module of every installed app (once per process), so
    the schedules they declare are registered. An error in such a module propagates."""
    global _discovered
    if _discovered:
        return
    autodiscover_modules("periodic")
    _discovered = True


def _check_function(func: Callable[..., Any]) -> str:
    qualname = getattr(func, "__qualname__", "")
    module = getattr(func, "__module__", None)
    if not module or not qualname or "." in qualname or "<" in qualname:
        raise ConfigurationError(
            f"@periodic goes on a module-level function (the worker imports it by its "
            f"dotted path), not on {func!r}"
        )
    try:
        parameters = list(inspect.signature(func).parameters.values())
    except (TypeError, ValueError):
        parameters = []
    required = [
        p
        for p in parameters
        if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    keyword_only = [p for p in parameters if p.kind is p.KEYWORD_ONLY and p.default is p.empty]
    if len(required) > 1 or keyword_only:
        raise ConfigurationError(
            f"periodic function {module}.{qualname} must take no argument or one (the "
            "PeriodicRun row being run)"
        )
    return f"{module}.{qualname}"


def _check_model(model: type[models.Model]) -> str:
    if model._meta.abstract or model._meta.proxy or not is_claimable(model):
        raise ConfigurationError(
            f"@periodic on a model needs a concrete claimable model (ClaimableModel), "
            f"not {model.__name__}"
        )
    return str(model._meta.label)


def periodic(
    schedule: str | None = None,
    *,
    every: str | int | float | timedelta | None = None,
    name: str | None = None,
    tz: str | tzinfo = "UTC",
    missed: str = "skip",
    max_catch_up: int = DEFAULT_MAX_CATCH_UP,
) -> Callable[[T], T]:
    """Declare periodic work: enqueue it once per slot of ``schedule`` across all hosts.

    ``schedule`` is a five-field cron expression or macro read on the wall clock of
    ``tz`` (``"0 3 * * *"``, ``"@hourly"``), or an interval (``"every 10s"``; or
    ``every=timedelta(...)``). On a module-level function, each slot enqueues a
    :class:`~django_taskclaim.models.PeriodicRun` row that calls it (with the row if it
    takes an argument); on a claimable model, each slot creates one row of it: the
    unsaved instance its classmethod ``for_slot(slot)`` returns (``None``: nothing for
    this slot), else ``Model()``. ``name`` (default: the function's dotted path or the
    model's label) keys the slots: renaming it starts the schedule afresh. ``missed``:
    after slots passed with no scheduler running, ``"skip"`` enqueues only the latest;
    ``"catch_up"`` enqueues each, at most the latest ``max_catch_up``.

    Guarantee: each slot is enqueued at most once however many schedulers run (its
    ``PeriodicSlot`` row commits in the same transaction as the work), and by one of
    them as long as any runs. Invalid arguments raise ``ConfigurationError`` at once.
    """
    zone = parse_zone(tz)
    timing = parse_timing(schedule, every, zone)
    if missed not in MISSED_POLICIES:
        raise ConfigurationError(
            f"missed must be one of {', '.join(map(repr, MISSED_POLICIES))}, got {missed!r}"
        )
    catch_up = int(bounds.number(max_catch_up, "max_catch_up", MAX_CATCH_UP))

    def decorate(target: T) -> T:
        function = model_label = None
        model = None
        if isinstance(target, type) and issubclass(target, models.Model):
            model, model_label = target, _check_model(target)
        elif callable(target):
            function = _check_function(target)
        else:
            raise ConfigurationError(f"@periodic goes on a function or a model, not {target!r}")
        key = function or model_label or ""
        if name is not None:
            key = name
        if not isinstance(key, str) or not key.strip() or key != key.strip():
            raise ConfigurationError(f"a schedule name must be non-blank text, got {key!r}")
        if len(key) > NAME_MAX_LENGTH:
            raise ConfigurationError(
                f"schedule name {key[:40]!r}… is longer than {NAME_MAX_LENGTH} characters"
            )
        register(
            Schedule(
                name=key,
                timing=timing,
                zone=zone,
                missed=missed,
                max_catch_up=catch_up,
                function=function,
                model=model,
                model_label=model_label,
            )
        )
        return target

    return decorate
