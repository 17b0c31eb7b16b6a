"""The database-side gauges for alerting: per model and queue, the rows ``ready``,
``processing`` and ``failed``, the leases expired and the age of the oldest row ready
to run; the paused queues; the rate limits' rings; the live and silent workers.

Cheap enough to scrape every few seconds: per model one aggregate query over its
``ready`` and ``processing`` rows (through the claim and lease partial indexes, never a
finished row) and one count of its ``failed`` rows (a scan of the table unless the model
has an index over them: docs/observability.md), one read of the database clock, one of
the pause table, per rate-limited model the reads of
:func:`~django_taskclaim.flow.rate_view.rate_view` (never an idle key's ring), and one of
the live workers' models. Every age
is the database's ``now()`` minus a stored time (DB CLOCK: never the web server's
clock). Served as Prometheus text by :mod:`.views` and ``manage.py taskclaim_metrics``.

The series stay bounded whatever the rows hold: per model, the
``TASKCLAIM_METRICS_MAX_QUEUES`` busiest queues have series of their own, the others
are summed up under the queue :data:`OTHER_QUEUES` (:func:`capped`); so are the paused
queues past that many.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

from django.db import models, router
from django.db.models import Aggregate, Count, Min, Q

from django_taskclaim.config.options import ClaimOptions, get_options
from django_taskclaim.config.settings import taskclaim_settings
from django_taskclaim.db import DbNow, db_now
from django_taskclaim.flow.rate_view import KeyRings, RateRing, rate_view
from django_taskclaim.rules import lease_expired_q, live_worker_q, ready_since, silent_worker_q
from django_taskclaim.telemetry import OTHER_QUEUES  # a queue of that name: summed up too

__all__ = [
    "OTHER_QUEUES",
    "QUEUE_FIELD",
    "Gauges",
    "QueueGauges",
    "capped",
    "capped_pauses",
    "collect",
    "event_waits",
    "queue_gauges",
]

#: The field a model's queues are told apart by (the worker's ``--queue``).
QUEUE_FIELD = "queue_name"
#: The states counted, each a gauge (``waiting``: rows that wait for prerequisites).
STATES = ("ready", "processing", "failed", "waiting")
#: The states of live work: their partial indexes (claim, lease) serve the gauges' read.
LIVE_STATES = ("ready", "processing")


@dataclass(frozen=True)
class QueueGauges:
    """The gauges of one queue of one model (``queue`` is ``""`` for a model without
    queues, and for rows whose ``queue_name`` is empty)."""

    model: str
    queue: str
    ready: int
    processing: int
    failed: int
    expired: int
    #: seconds since the oldest row ready to run now was created (database clock); 0.0
    #: when none is; None when the model has no ``created_at`` field
    oldest_ready_age: float | None
    #: rows ``waiting`` for prerequisites (``after=``; 0 for a model none ever waited in)
    waiting: int = 0


@dataclass
class Gauges:
    """Every gauge of one database at one moment (``now``: its clock)."""

    now: datetime
    queues: list[QueueGauges] = field(default_factory=list)
    #: (model label, queue) of each paused queue; queue ``""``: all of the model's queues
    paused: list[tuple[str, str]] = field(default_factory=list)
    #: the rings of the rate limits (a per-key ring only while it has a start in its
    #: window: one series per key ever seen would grow without bound)
    rate_rings: list[RateRing] = field(default_factory=list)
    #: per model with ``key_rate_limit``: its key rings summed up
    rate_keys: list[KeyRings] = field(default_factory=list)
    live_workers: int = 0
    silent_workers: int = 0
    #: model label -> live workers that serve it
    live_workers_by_model: dict[str, int] = field(default_factory=dict)
    #: model label -> its rows parked until an event (``wait_for_event()``)
    event_waits: dict[str, int] = field(default_factory=dict)


def _has_queues(model: type[models.Model]) -> bool:
    return any(f.name == QUEUE_FIELD for f in model._meta.concrete_fields)


def _due_q(opts: ClaimOptions) -> Q:
    """``ready`` and due: the rows ``claimable()`` returns (its ``run_after`` rule)."""
    q = opts.status_q("ready")
    if opts.has("run_after"):
        q &= Q(run_after__isnull=True) | Q(run_after__lte=DbNow())
    return q


def _waiting(
    model: type[models.Model], opts: ClaimOptions, base: models.QuerySet, using: str
) -> dict[str, int]:
    """Per queue, the rows of ``model`` waiting for prerequisites. Counted only for a
    model some row of which waits or waited (one probe of the fan-in counters' unique
    index: every row ``after=`` made wait has a counter), so a model that never used
    ``after=`` pays one indexed read and no scan; for one that did, a count of its
    ``waiting`` rows (a scan of the table unless an index serves ``status = 'waiting'``:
    docs/observability.md)."""
    from django_taskclaim.models import TaskFanIn  # the app registry first

    if opts.statuses.get("waiting") is None:
        return {}
    if not TaskFanIn._base_manager.using(using).filter(dependent_model=opts.label).exists():
        return {}
    waiting_qs = base.filter(opts.status_q("waiting"))
    if _has_queues(model):
        return {
            str(row[QUEUE_FIELD] or ""): int(row["tc_waiting"])
            for row in waiting_qs.values(QUEUE_FIELD).annotate(tc_waiting=Count("*"))
        }
    count = waiting_qs.count()
    return {"": count} if count else {}


def event_waits(labels: Iterable[str], using: str) -> dict[str, int]:
    """Per model label of ``labels``, its rows parked until an event on ``using``: one
    grouped count of the event waits (a small table: a wait is deleted once its row
    has its event or timed out)."""
    from django_taskclaim.models import TaskEventWait  # the app registry first

    wanted = set(labels)
    counts = dict.fromkeys(sorted(wanted), 0)
    for label, n in (
        TaskEventWait._base_manager.using(using)
        .order_by()
        .values("task_model")
        .annotate(n=Count("pk"))
        .values_list("task_model", "n")
    ):
        if label in wanted:
            counts[label] = int(n)
    return counts


def queue_gauges(model: type[models.Model], now: datetime, *, using: str) -> list[QueueGauges]:
    """The gauges of ``model`` on ``using``, one per queue that has ``ready``,
    ``processing`` or ``failed`` rows (one entry with zeros, queue ``""``, when none
    has: a model's gauges never vanish); ``now`` is the database clock. Two queries:
    one over the ``ready`` and ``processing`` rows (``status = 'ready' OR status =
    'processing'``, which the claim and lease partial indexes serve together: never a
    finished row), one counting the ``failed`` rows."""
    opts = get_options(model)
    label = opts.label
    # OR of equalities, not IN: PostgreSQL combines the two partial indexes for an OR
    # (BitmapOr); for ``= ANY(array)`` it scans the table.
    live = opts.status_q("ready") | opts.status_q("processing")
    # Prefixed names: an annotation may not take the name of one of the model's fields.
    figures: dict[str, Aggregate] = {
        f"tc_{state}": Count("pk", filter=opts.status_q(state)) for state in LIVE_STATES
    }
    figures["tc_expired"] = Count("pk", filter=lease_expired_q(opts))
    if opts.has("created_at"):
        figures["tc_oldest"] = Min(ready_since(opts), filter=_due_q(opts))
    base = model._base_manager.using(using).order_by()
    failed_qs = base.filter(opts.status_q("failed"))
    waiting = _waiting(model, opts, base, using)
    if _has_queues(model):
        rows = {
            str(row[QUEUE_FIELD] or ""): row
            for row in base.filter(live).values(QUEUE_FIELD).annotate(**figures)
        }
        failed = {
            str(row[QUEUE_FIELD] or ""): int(row["tc_failed"])
            for row in failed_qs.values(QUEUE_FIELD).annotate(tc_failed=Count("*"))
        }
    else:
        row = base.filter(live).aggregate(**figures)
        count = failed_qs.count()
        rows = {"": row} if row["tc_ready"] or row["tc_processing"] else {}
        failed = {"": count} if count else {}
    found = []
    for queue in sorted(set(rows) | set(failed) | set(waiting)):
        row = rows.get(queue, {})
        oldest = row.get("tc_oldest")
        found.append(
            QueueGauges(
                model=label,
                queue=queue,
                ready=int(row.get("tc_ready") or 0),
                processing=int(row.get("tc_processing") or 0),
                failed=failed.get(queue, 0),
                expired=int(row.get("tc_expired") or 0),
                oldest_ready_age=(
                    None
                    if not opts.has("created_at")
                    else 0.0
                    if oldest is None
                    else max(0.0, (now - oldest).total_seconds())
                ),
                waiting=waiting.get(queue, 0),
            )
        )
    if not found:
        age = 0.0 if opts.has("created_at") else None
        found.append(QueueGauges(label, "", 0, 0, 0, 0, age))
    return found


def _rows_of(g: QueueGauges) -> int:
    return g.ready + g.processing + g.failed + g.waiting


def capped(found: list[QueueGauges], limit: int | None = None) -> list[QueueGauges]:
    """``found`` (the gauges of one model's queues) with at most ``limit`` (default:
    ``TASKCLAIM_METRICS_MAX_QUEUES``) queues of their own, the busiest (most ``ready``,
    ``processing``, ``failed`` and ``waiting`` rows; by name among equals), in queue
    order, and one more, queue :data:`OTHER_QUEUES`, that sums up the others (its age:
    the oldest of theirs). ``found`` as it is when it has no more queues than that."""
    limit = taskclaim_settings.METRICS_MAX_QUEUES if limit is None else limit
    if len(found) <= limit:
        return found
    # A queue named like the sum ranks last: it is summed up, never a second such series.
    ranked = sorted(found, key=lambda g: (g.queue == OTHER_QUEUES, -_rows_of(g), g.queue))
    kept, rest = ranked[:limit], ranked[limit:]
    ages = [g.oldest_ready_age for g in rest if g.oldest_ready_age is not None]
    other = QueueGauges(
        model=found[0].model,
        queue=OTHER_QUEUES,
        ready=sum(g.ready for g in rest),
        processing=sum(g.processing for g in rest),
        failed=sum(g.failed for g in rest),
        expired=sum(g.expired for g in rest),
        oldest_ready_age=None if found[0].oldest_ready_age is None else max(ages, default=0.0),
        waiting=sum(g.waiting for g in rest),
    )
    return [*sorted(kept, key=lambda g: g.queue), other]


def capped_pauses(paused: list[tuple[str, str]], limit: int | None = None) -> list[tuple[str, str]]:
    """``paused`` ((model, queue) pairs, sorted) with at most ``limit`` (default:
    ``TASKCLAIM_METRICS_MAX_QUEUES``) paused queues per model, the first by name, the
    pause of the whole model (queue ``""``) always kept; the others of a model become
    one pair ``(model, OTHER_QUEUES)``, listed once."""
    limit = taskclaim_settings.METRICS_MAX_QUEUES if limit is None else limit
    shown: list[tuple[str, str]] = []
    named: dict[str, int] = {}
    for model, queue in paused:
        if queue and queue != OTHER_QUEUES and named.get(model, 0) < limit:
            named[model] = named.get(model, 0) + 1
        elif queue:
            if (model, OTHER_QUEUES) not in shown:
                shown.append((model, OTHER_QUEUES))
            continue
        shown.append((model, queue))
    return shown


def collect(
    targets: Iterable[type[models.Model]] | None = None, *, using: str | None = None
) -> Gauges:
    """The gauges of ``targets`` (default: every claimable model but an unused
    ``PeriodicRun``, :func:`~django_taskclaim.periodic.reported.reported_models`), the
    paused queues and the workers, read from ``using`` (default: each model's read database;
    the clock, pauses and workers from the ``WorkerProcess`` table's). Every age against
    the database clock."""
    from django_taskclaim.models import QueuePause, WorkerProcess  # the app registry first
    from django_taskclaim.periodic.reported import reported_models

    chosen = sorted(
        targets if targets is not None else reported_models(using), key=lambda m: m._meta.label
    )
    home = using or router.db_for_read(WorkerProcess)
    clocks: dict[str, datetime] = {}
    gauges = Gauges(now=db_now(home))
    clocks[home] = gauges.now
    for model in chosen:
        db = using or router.db_for_read(model)
        if db not in clocks:
            clocks[db] = db_now(db)
        gauges.queues.extend(capped(queue_gauges(model, clocks[db], using=db)))
    by_db: dict[str, list[str]] = {}
    for model in chosen:
        by_db.setdefault(using or router.db_for_read(model), []).append(model._meta.label)
    for db, labels in by_db.items():
        gauges.event_waits.update(event_waits(labels, db))
    for rated in rate_view(chosen, using=using):
        gauges.rate_rings.extend(r for r in rated.rings if r.per != "key" or r.starts)
        if rated.keys is not None:
            gauges.rate_keys.append(rated.keys)
    gauges.paused = capped_pauses(
        list(
            QueuePause.objects.using(home).order_by("model", "queue").values_list("model", "queue")
        )
    )
    workers = WorkerProcess.objects.using(home)
    gauges.silent_workers = workers.filter(silent_worker_q()).count()
    by_model: dict[str, int] = {model._meta.label: 0 for model in chosen}
    for labels in workers.filter(live_worker_q()).values_list("model_labels", flat=True):
        gauges.live_workers += 1
        for label in set(labels or []):
            if label in by_model:
                by_model[label] += 1
    gauges.live_workers_by_model = by_model
    return gauges
