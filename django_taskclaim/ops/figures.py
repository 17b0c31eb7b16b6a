"""Numbers about the queues: per-state counts, expired leases, throughput, workers.

Shared by the admin dashboard, ``manage.py taskclaim_stats`` (:func:`format_snapshot`),
the doctor and the worker registry; retention of finished rows is in
:mod:`~django_taskclaim.recovery.prune`. Every time-based figure is computed by the database with
its own ``now()`` (never the web server's clock).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import connections, models, router
from django.db.models import Min

from django_taskclaim.backends.history import history_sql
from django_taskclaim.config.discovery import claimable_models
from django_taskclaim.config.options import ClaimOptions, get_options
from django_taskclaim.db import DbNow, db_now
from django_taskclaim.model.indexes import serves_status
from django_taskclaim.model.queryset import as_claim_queryset
from django_taskclaim.ops.history import done_in_windows, uses_history, whole_table
from django_taskclaim.row.status import STATE_NAMES
from django_taskclaim.rules import live_worker_q, ready_since

logger = logging.getLogger("django_taskclaim.ops.figures")

#: Windows (minutes) of the "done recently" figures.
THROUGHPUT_WINDOWS = (5, 60)


def humanize_seconds(seconds: float) -> str:
    """A duration for people, sign ignored: ``75`` → ``"1m 15s"``; ``7300`` →
    ``"2h 01m"``; ``90000`` → ``"1d 01h"``."""
    s = int(abs(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h {(s % 3600) // 60:02d}m"
    return f"{s // 86400}d {(s % 86400) // 3600:02d}h"


@dataclass
class ModelStats:
    """Queue figures of one claimable model."""

    label: str
    verbose_name: str
    counts: dict[str, int]
    expired: int
    total: int
    oldest_ready_age: float | None  # seconds; None when no ready row or no created_at
    done_last: dict[int, int | None]  # minutes -> rows finished done in that window
    #: States whose count is the planner's estimate (large PostgreSQL tables, ``fast``)
    estimated: list[str] = field(default_factory=list)
    #: Where ``done_last`` comes from: ``"rows"`` (``finished_at``) or ``"history"``
    done_source: str = "rows"
    #: Of the model's ``ready`` rows, those parked until an event (``wait_for_event()``)
    parked: int = 0

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready dictionary (window keys become ``"5m"``, ``"60m"``)."""
        data = asdict(self)
        data["done_last"] = {f"{k}m": v for k, v in self.done_last.items()}
        return data


@dataclass
class WorkerInfo:
    """A registered worker process that sent a heartbeat recently."""

    worker_id: str
    hostname: str
    pid: int
    models: list[str]
    concurrency: int
    in_flight: int
    processed: int
    started_at: datetime
    last_seen: datetime
    seen_ago: float

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready dictionary (datetimes as ISO 8601)."""
        data = asdict(self)
        data["started_at"] = self.started_at.isoformat()
        data["last_seen"] = self.last_seen.isoformat()
        return data


@dataclass
class Snapshot:
    """Everything the dashboard and ``taskclaim_stats`` show, taken at ``now``."""

    now: datetime
    models: list[ModelStats] = field(default_factory=list)
    workers: list[WorkerInfo] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready dictionary."""
        return {
            "now": self.now.isoformat(),
            "models": [m.as_dict() for m in self.models],
            "workers": [w.as_dict() for w in self.workers],
        }


#: With ``fast``, a PostgreSQL table the planner estimates above this many rows gets its
#: finished states (done, failed, cancelled) and waiting rows estimated instead of counted.
EXACT_UP_TO = 100_000
#: States counted exactly even then: their partial indexes (claim, lease) serve the count.
INDEXED_STATES = ("ready", "processing")


def _indexed_states(model: type[models.Model], opts: ClaimOptions) -> set[str]:
    """The finished states an index of the model counts without a scan of the table
    (a partial index over the ``failed`` rows, as docs/observability.md suggests, or an
    index led by the status column): counted exactly on a large table too."""
    field = opts.status_field
    if getattr(model._meta.get_field(field), "db_index", False):
        return {s for s, v in opts.statuses.items() if v is not None}
    return {
        state
        for state, value in opts.statuses.items()
        if value is not None
        and any(serves_status(index, field, value) for index in model._meta.indexes)
    }


def never_waited(model: type[models.Model], db: str) -> bool:
    """Whether no row of ``model`` waits or waited for prerequisites: one probe of the
    fan-in counters' unique index (``after=`` writes a counter for every row it makes
    wait), so its ``waiting`` count is exactly 0 without a look at its rows."""
    from django_taskclaim.models import TaskFanIn  # deferred: the app registry first

    label = get_options(model).label
    return not TaskFanIn._base_manager.using(db).filter(dependent_model=label).exists()


def _estimated_counts(
    model: type[models.Model], db: str
) -> tuple[dict[str, int], list[str]] | None:
    """Per-state counts of a large table, and the states among them that are estimates:
    ``ready`` / ``processing`` and a state an index serves exact (one indexed count
    each), ``waiting`` exactly 0 for a model no row of which ever waited
    (:func:`never_waited`), the other states from the planner's statistics (0 for a
    value the statistics say no row holds); ``None`` when the table is not large (or
    its vendor keeps no statistics): count it exactly."""
    opts = get_options(model)
    connection = connections[db]
    sql = history_sql(connection)
    if sql is None:
        return None
    column = str(model._meta.get_field(opts.status_field).column)  # type: ignore[union-attr]
    with connection.cursor() as cursor:
        estimate = sql.state_estimate(cursor, model._meta.db_table, column)
    if estimate is None or estimate.rows <= EXACT_UP_TO:
        return None
    qs = model._base_manager.using(db)
    exact = {*INDEXED_STATES, *_indexed_states(model, opts)}
    if opts.statuses.get("waiting") is not None and never_waited(model, db):
        exact.add("waiting")  # exactly 0, without a look at the rows
    counts: dict[str, int] = {}
    others: list[str] = []  # estimated states whose value is not a most common one
    for state, value in opts.statuses.items():
        if value is None:
            continue
        counts[state] = 0
        if state == "waiting" and state in exact:
            continue
        if state in exact:
            counts[state] = qs.filter(opts.status_q(state)).count()
        elif str(value) in estimate.fractions:
            counts[state] = round(estimate.rows * estimate.fractions[str(value)])
        else:
            others.append(state)
    # The rows the most common values leave belong to the planner's other distinct
    # values. A state counted exactly that is not a most common value is one of them:
    # its rows and its place come off, and what is left is spread over the rest; with
    # none left, a state not counted is estimated at 0 (never the rounding of the stored
    # frequencies, nor the rows of a state counted already: "≈34 cancelled" in a table
    # that has none).
    counted = [
        n
        for state, n in counts.items()
        if n and state in exact and str(opts.statuses[state]) not in estimate.fractions
    ]
    unknown = estimate.others - len(counted)
    left = max(0.0, estimate.others_fraction * estimate.rows - sum(counted))
    for state in others:
        counts[state] = round(left / unknown) if unknown > 0 else 0
    estimated = [state for state in counts if state not in exact]
    return counts, estimated


def model_stats(
    model: type[models.Model],
    *,
    using: str | None = None,
    queryset: Any = None,
    fast: bool = False,
    throughput: bool = True,
) -> ModelStats:
    """Figures of one claimable model (or of ``queryset`` restricted to it).

    Counts per logical state and ``expired`` leases come from two aggregate queries;
    the oldest ready age and the done-recently windows from one more each. Nothing is
    loaded row by row.

    With ``fast`` (the dashboard), nothing scans the finished rows when the rows asked
    about are all of the model's: the done-recently windows come from the workers'
    per-minute history once it has rows of the model
    (:func:`~django_taskclaim.ops.history.uses_history`; whole minutes, the current one
    included), and on a PostgreSQL table the planner estimates above
    :data:`EXACT_UP_TO` rows, ``done`` / ``failed`` / ``cancelled`` are the planner's
    estimates (listed in ``estimated``) while ``ready`` and ``processing`` stay exact, as
    does a finished state one of the model's ``Meta.indexes`` covers (a partial index over
    the ``failed`` rows: :func:`~django_taskclaim.model.indexes.serves_status`).
    Without ``fast``, or over a filtered ``queryset``, every figure is exact.

    ``throughput=False`` leaves out the done-recently windows (``done_last`` empty), for a
    page that shows none (the changelist's summary): over the rows, each is a count of
    the finished rows.
    """
    opts = get_options(model)
    db = using or router.db_for_read(model)
    qs = as_claim_queryset(
        queryset if queryset is not None else model._base_manager.using(db).all()
    )
    whole = fast and whole_table(queryset)
    estimates = _estimated_counts(model, db) if whole else None
    counts, estimated = estimates if estimates is not None else (qs.state_counts(), [])
    expired = qs.expired().count()
    oldest: float | None = None
    if opts.has("created_at") and counts.get("ready"):
        first = qs.claimable().aggregate(first=Min(ready_since(opts)))["first"]
        if first is not None:
            oldest = max(0.0, (db_now(db) - first).total_seconds())
    done_last: dict[int, int | None] = {}
    done_source = "rows"
    if throughput and whole and uses_history(model, using=db):
        done_source = "history"
        done_last.update(done_in_windows(opts.label, THROUGHPUT_WINDOWS, db_now(db), using=db))
    for minutes in THROUGHPUT_WINDOWS if throughput and done_source == "rows" else ():
        if opts.has("finished_at"):
            done_last[minutes] = qs.filter(
                opts.status_q("done"), finished_at__gte=DbNow() - timedelta(minutes=minutes)
            ).count()
        else:
            done_last[minutes] = None
    from django_taskclaim.models import TaskEventWait  # deferred: the app registry first

    # One indexed count (the waits' unique index leads with the model); the waits table
    # holds only current waits: a wait is deleted once its row has its event.
    parked = TaskEventWait._base_manager.using(db).filter(task_model=opts.label).count()
    return ModelStats(
        label=opts.label,
        verbose_name=str(model._meta.verbose_name_plural),
        counts=counts,
        expired=expired,
        total=sum(counts.values()),
        oldest_ready_age=oldest,
        done_last=done_last,
        estimated=estimated,
        done_source=done_source,
        parked=parked,
    )


def live_workers(using: str | None = None) -> list[WorkerInfo]:
    """Registered workers not stopped and heard from within :func:`silent_after` seconds
    (:func:`live_worker_q`, database clock), ordered by id."""
    from django_taskclaim.models import WorkerProcess  # deferred: models need the app registry

    db = using or router.db_for_read(WorkerProcess)
    rows = WorkerProcess.objects.using(db).filter(live_worker_q())
    now = db_now(db)
    return [
        WorkerInfo(
            worker_id=w.worker_id,
            hostname=w.hostname,
            pid=w.pid,
            models=list(w.model_labels or []),
            concurrency=w.concurrency,
            in_flight=w.in_flight,
            processed=w.processed,
            started_at=w.started_at,
            last_seen=w.last_seen,
            seen_ago=max(0.0, (now - w.last_seen).total_seconds()),
        )
        for w in rows.order_by("worker_id")
    ]


def snapshot(
    targets: Iterable[type[models.Model]] | None = None,
    *,
    using: str | None = None,
    fast: bool = False,
) -> Snapshot:
    """Figures of ``targets`` (default: every claimable model) and the live workers;
    ``fast``: nothing scans the finished rows (:func:`model_stats`)."""
    chosen = list(targets) if targets is not None else list(claimable_models())
    snap = Snapshot(now=db_now(using or "default"))
    for model in sorted(chosen, key=lambda m: m._meta.label):
        snap.models.append(model_stats(model, using=using, fast=fast))
    snap.workers = live_workers(using)
    return snap


def format_snapshot(snap: Snapshot) -> str:
    """``taskclaim_stats``' text: a fixed-width table (a row per model, a column per
    state and figure, ``-`` where a model cannot say), then the live workers."""

    def age(seconds: float | None) -> str:
        return "-" if seconds is None else humanize_seconds(seconds)

    def count(value: int | None) -> str:
        return "-" if value is None else str(value)

    def state(m: ModelStats, name: str) -> str:
        text = count(m.counts.get(name))
        return f"≈{text}" if name in m.estimated else text

    header = ["model", *STATE_NAMES, "expired", "oldest_ready", "done_5m", "done_60m", "total"]
    rows = [
        [
            m.label,
            *[state(m, s) for s in STATE_NAMES],
            str(m.expired),
            age(m.oldest_ready_age),
            count(m.done_last.get(5)),
            count(m.done_last.get(60)),
            str(m.total),
        ]
        for m in snap.models
    ]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = [
        "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        )
        for r in [header, *rows]
    ]
    if not rows:
        lines.append("(no claimable models)")
    if any(m.estimated for m in snap.models):
        lines.append("≈ the planner's estimate of a large table (--exact counts every row)")
    lines += ["", f"live workers: {len(snap.workers)}"]
    lines += [
        f"  {w.worker_id}  host={w.hostname} pid={w.pid} threads={w.concurrency} "
        f"in_flight={w.in_flight} processed={w.processed} seen={age(w.seen_ago)} ago"
        for w in snap.workers
    ]
    return "\n".join(lines)
