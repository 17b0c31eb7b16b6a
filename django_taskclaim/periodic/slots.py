"""Slots in the database: the insert-as-lock enqueue, the planner the worker's scheduler
ticks, the run of a periodic function, and what the admin shows. ORM only.

Exactly once per slot: :func:`enqueue_slot` inserts the slot's
:class:`~django_taskclaim.models.PeriodicSlot` row (unique on schedule and slot) and the
work in one transaction. A concurrent scheduler's insert of the same slot waits for that
transaction, then fails on the unique constraint inside a savepoint: it enqueues nothing.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.apps import apps
from django.db import IntegrityError, InterfaceError, OperationalError, transaction
from django.db.models import Model

from django_taskclaim.config import bounds
from django_taskclaim.config.options import get_options
from django_taskclaim.db import DbNow, retry_transient
from django_taskclaim.models import PeriodicRun, PeriodicSlot
from django_taskclaim.periodic.registry import Schedule

__all__ = [
    "Planner",
    "ScheduleState",
    "enqueue_slot",
    "last_slot",
    "prune_slots",
    "schedule_state",
]

logger = logging.getLogger("django_taskclaim.periodic")

#: ``prune_slots(older_than=…)``: from now to ten years back.
PRUNE_AGE = bounds.Bound(0.0, 3650 * bounds.DAY)
#: Longest pause of a schedule whose enqueue keeps failing (its hook raises, its table
#: is missing): the error is logged once per pause, not at every tick.
MAX_ERROR_PAUSE = 60.0


def last_slot(name: str, *, using: str = "default") -> datetime | None:
    """The latest slot recorded for the schedule ``name`` (one index probe), or ``None``."""
    return (
        PeriodicSlot.objects.using(using)
        .filter(schedule=name)
        .order_by("-slot")
        .values_list("slot", flat=True)
        .first()
    )


def _create_work(schedule: Schedule, slot: datetime, using: str) -> Model | None:
    if schedule.function is not None:
        return PeriodicRun.objects.using(using).create(
            schedule=schedule.name, slot=slot, function=schedule.function
        )
    model = schedule.model
    if model is None:  # pragma: no cover - the decorator sets one of the two
        raise ValueError(f"schedule {schedule.name!r} has neither a function nor a model")
    hook = getattr(model, "for_slot", None)
    if callable(hook):
        row = hook(slot)
        if row is None:
            return None
        if not isinstance(row, model):
            raise TypeError(f"{model.__name__}.for_slot() must return a {model.__name__} or None")
    else:
        row = model()
    row.save(using=using)
    return row


def enqueue_slot(
    schedule: Schedule, slot: datetime, *, using: str = "default", by: str = ""
) -> PeriodicSlot | None:
    """Enqueue ``slot`` of ``schedule`` unless it already was; return its new
    ``PeriodicSlot`` row, or ``None`` when the slot was enqueued before (by anyone).

    The slot row and the work (a ``PeriodicRun``, or a row of the schedule's model)
    commit together or not at all; an error creating the work propagates and records
    nothing. Deadlocks and busy errors are retried (outside a caller's transaction).
    """
    if slot.tzinfo is None:
        raise ValueError(f"a slot must be timezone-aware, got {slot!r}")
    slot = slot.astimezone(UTC)

    def once() -> PeriodicSlot | None:
        with transaction.atomic(using=using):
            try:
                with transaction.atomic(using=using):  # the savepoint the loser rolls back
                    row = PeriodicSlot.objects.using(using).create(
                        schedule=schedule.name,
                        slot=slot,
                        enqueued_by=by[:255],
                        target=schedule.target_label,
                    )
            except IntegrityError:
                return None
            work = _create_work(schedule, slot, using)
            if work is not None:
                row.target_pk = str(work.pk)
                row.save(using=using, update_fields=["target_pk"])
            return row

    return retry_transient(once, using, what=f"enqueue of periodic slot {schedule.name}")


class Planner:
    """Enqueues the due slots of ``schedules`` at each :meth:`tick` (the worker's
    scheduler thread calls it; tests call it with any ``now``).

    A schedule with no slot recorded yet starts after the first ``now`` this planner
    saw: its first run is its first slot after that, never one from before.
    """

    def __init__(self, schedules: list[Schedule], *, using: str = "default", by: str = "") -> None:
        self.schedules = schedules
        self.using = using
        self.by = by
        self._known: dict[str, datetime] = {}  # a slot known to be recorded or passed over
        self._floor: dict[str, datetime] = {}
        self._paused: dict[str, tuple[int, float]] = {}  # name -> (errors, until monotonic)

    def tick(self, now: datetime) -> list[PeriodicSlot]:
        """Enqueue what is due at ``now`` (database clock); return the slots this call
        enqueued. A schedule whose enqueue fails is logged and paused (backoff up to
        :data:`MAX_ERROR_PAUSE`); connection errors propagate."""
        enqueued: list[PeriodicSlot] = []
        for schedule in self.schedules:
            errors, until = self._paused.get(schedule.name, (0, 0.0))
            if errors and time.monotonic() < until:
                continue
            try:
                enqueued += self._tick_one(schedule, now)
            except (OperationalError, InterfaceError):
                raise
            except Exception as exc:
                pause = min(MAX_ERROR_PAUSE, 5.0 * 2.0**errors)
                self._paused[schedule.name] = (errors + 1, time.monotonic() + pause)
                logger.error(
                    "periodic enqueue failed schedule=%s error=%s (retrying in %gs)",
                    schedule.name,
                    exc,
                    pause,
                    exc_info=exc,
                )
            else:
                self._paused.pop(schedule.name, None)
        return enqueued

    def _tick_one(self, schedule: Schedule, now: datetime) -> list[PeriodicSlot]:
        latest = schedule.last_at_or_before(now)
        known = self._known.get(schedule.name)
        if latest is None or (known is not None and known >= latest):
            return []
        last = last_slot(schedule.name, using=self.using)  # the cheap pre-check
        since = last if last is not None else self._floor.setdefault(schedule.name, now)
        due = schedule.due(since, now)
        if due.passed_over is not None:
            logger.info(
                "periodic slots passed over schedule=%s missed=%s from=%s to=%s enqueued=%s",
                schedule.name,
                schedule.missed,
                since.isoformat(),
                due.passed_over.isoformat(),
                len(due.slots),
            )
        done = []
        for slot in due.slots:
            row = enqueue_slot(schedule, slot, using=self.using, by=self.by)
            if row is not None:
                done.append(row)
                logger.debug("periodic slot enqueued schedule=%s slot=%s", schedule.name, slot)
        self._known[schedule.name] = latest
        return done

    def next_due(self, now: datetime) -> datetime | None:
        """The earliest slot after ``now`` over all schedules, or ``None`` if none has one."""
        found = [s.next_after(now) for s in self.schedules]
        return min((f for f in found if f is not None), default=None)


@dataclass(frozen=True)
class ScheduleState:
    """What the admin shows of one schedule: the latest slot recorded (``last_slot``,
    when it was enqueued and by whom), the state of the row it created (``outcome``:
    ``ready`` … ``failed``, or ``""`` when unknown) with its last error, and the next
    slot (``overdue`` when it is already due: no scheduler has enqueued it)."""

    schedule: Schedule
    next_slot: datetime | None
    overdue: bool
    last_slot: datetime | None
    last_enqueued_at: datetime | None
    last_enqueued_by: str
    outcome: str
    last_error: str
    target_pk: str


def schedule_state(schedule: Schedule, now: datetime, *, using: str = "default") -> ScheduleState:
    """The :class:`ScheduleState` of ``schedule`` at ``now`` (the database clock); two
    or three indexed queries."""
    row = PeriodicSlot.objects.using(using).filter(schedule=schedule.name).order_by("-slot").first()
    outcome = error = ""
    if row is not None and row.target and row.target_pk:
        try:
            model = apps.get_model(row.target)
        except (LookupError, ValueError):
            model = None
        work = (
            model._default_manager.using(using).filter(pk=row.target_pk).first()
            if model is not None
            else None
        )
        if work is not None and model is not None:
            opts = get_options(model)
            outcome = opts.state_of(getattr(work, opts.status_field)) or ""
            error = str(getattr(work, "last_error", "") or "")
    following = schedule.next_after(row.slot if row is not None else now)
    return ScheduleState(
        schedule=schedule,
        next_slot=following,
        overdue=following is not None and following <= now,
        last_slot=row.slot if row is not None else None,
        last_enqueued_at=row.created_at if row is not None else None,
        last_enqueued_by=row.enqueued_by if row is not None else "",
        outcome=outcome,
        last_error=error,
        target_pk=row.target_pk if row is not None else "",
    )


def prune_slots(
    older_than: float | timedelta, *, using: str = "default", batch_size: int = 1000
) -> int:
    """Delete the ``PeriodicSlot`` rows whose slot is older than ``older_than`` (seconds
    or ``timedelta``, database clock), in batches; return how many. Each schedule's
    latest row is always kept: it is where the schedule resumes, so no pruned slot is
    ever enqueued again. (Finished ``PeriodicRun`` rows go with ``taskclaim_prune``.)"""
    age = bounds.number(older_than, "older_than", PRUNE_AGE, seconds=True)
    size = bounds.number(batch_size, "batch_size", bounds.BATCH_SIZE)
    slots = PeriodicSlot.objects.using(using)
    newest: list[int] = []
    for name in slots.order_by().values_list("schedule", flat=True).distinct():
        pk = slots.filter(schedule=name).order_by("-slot").values_list("pk", flat=True).first()
        if pk is not None:
            newest.append(pk)
    old = slots.filter(slot__lt=DbNow() - timedelta(seconds=age)).exclude(pk__in=newest)
    total = 0
    while pks := list(old.order_by("slot").values_list("pk", flat=True)[:size]):
        total += slots.filter(pk__in=pks).delete()[0]
    return total
