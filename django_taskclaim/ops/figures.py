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
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connections, models, router
from django.db.models import Min, Q
from django.db.models.expressions import CombinedExpression
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from django_taskclaim.backends import for_connection
from django_taskclaim.config.options import claimable_models, get_options
from django_taskclaim.config.settings import taskclaim_settings
from django_taskclaim.db import DbNow
from django_taskclaim.model.queryset import as_claim_queryset
from django_taskclaim.model.status import STATE_NAMES
from django_taskclaim.recovery.prune import (
    PruneResult as PruneResult,  # retention's names, importable here too
)
from django_taskclaim.recovery.prune import parse_age as parse_age
from django_taskclaim.recovery.prune import prune as prune
from django_taskclaim.recovery.prune import prune_models as prune_models

logger = logging.getLogger("django_taskclaim.ops.figures")

#: Windows (minutes) of the "done recently" figures.
THROUGHPUT_WINDOWS = (5, 60)


def db_now(using: str = "default") -> datetime:
    """The database server's current time (aware when ``USE_TZ``), one cheap query.

    Lease and age figures are differences against this value, so a web server with a
    skewed clock still shows what the database (and therefore the reaper) sees.
    """
    conn = connections[using]
    statement = for_connection(conn).read_clock(use_tz=settings.USE_TZ)
    if statement is None:  # pragma: no cover - other vendors
        return timezone.now()
    with conn.cursor() as cursor:
        cursor.execute(statement.sql, statement.params or None)  # no params: % stays literal
        value = cursor.fetchone()[0]
    if isinstance(value, str):
        value = parse_datetime(value)
    if value is None:  # pragma: no cover - defensive
        return timezone.now()
    if timezone.is_naive(value):
        value = timezone.make_aware(value, UTC)
    return value


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


# -- the live-worker rule ------------------------------------------------------------


def silent_after() -> float:
    """Seconds of registry silence after which a worker is *shown* as silent
    (``TASKCLAIM_WORKER_SILENT_AFTER``). Display only: silence is not death, and no row
    is taken from a silent worker before its lease ends."""
    return float(taskclaim_settings.WORKER_SILENT_AFTER)


def silence_cutoff() -> CombinedExpression:
    """The database's ``now()`` minus :func:`silent_after`: a registered worker whose
    last heartbeat (``last_seen``) is before it is silent, at or after it live."""
    return DbNow() - timedelta(seconds=silent_after())


def live_worker_q() -> Q:
    """Registered workers that are not stopped and were heard from at or after
    :func:`silence_cutoff` (database clock): the dashboard's and ``taskclaim_stats``'
    live workers, the admin's "live" filter and badge."""
    return Q(stopped_at__isnull=True, last_seen__gte=silence_cutoff())


def silent_worker_q() -> Q:
    """Registered workers that are not stopped and were last heard from before
    :func:`silence_cutoff`: the complement of :func:`live_worker_q` among the workers
    not stopped. Shown to operators, never taken as proof of death."""
    return Q(stopped_at__isnull=True, last_seen__lt=silence_cutoff())


def heard_from_recently(last_seen: datetime, now: datetime) -> bool:
    """:func:`live_worker_q`'s heartbeat test for a value already read: whether
    ``last_seen`` is at or after :func:`silence_cutoff` when the database's clock reads
    ``now``."""
    return last_seen >= now - timedelta(seconds=silent_after())


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


def model_stats(
    model: type[models.Model], *, using: str | None = None, queryset: Any = None
) -> ModelStats:
    """Figures of one claimable model (or of ``queryset`` restricted to it).

    Counts per logical state and ``expired`` leases come from two aggregate queries;
    the oldest ready age and the done-recently windows from one more each. Nothing is
    loaded row by row, so it stays cheap on large tables given the claim indexes.
    """
    opts = get_options(model)
    db = using or router.db_for_read(model)
    qs = as_claim_queryset(
        queryset if queryset is not None else model._base_manager.using(db).all()
    )
    counts = qs.state_counts()
    expired = qs.expired().count()
    oldest: float | None = None
    if opts.has("created_at") and counts.get("ready"):
        first = qs.claimable().aggregate(first=Min("created_at"))["first"]
        if first is not None:
            oldest = max(0.0, (db_now(db) - first).total_seconds())
    done_last: dict[int, int | None] = {}
    for minutes in THROUGHPUT_WINDOWS:
        if opts.has("finished_at"):
            done_last[minutes] = qs.filter(
                opts.status_q("done"), finished_at__gte=DbNow() - timedelta(minutes=minutes)
            ).count()
        else:
            done_last[minutes] = None
    return ModelStats(
        label=opts.label,
        verbose_name=str(model._meta.verbose_name_plural),
        counts=counts,
        expired=expired,
        total=sum(counts.values()),
        oldest_ready_age=oldest,
        done_last=done_last,
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
    targets: Iterable[type[models.Model]] | None = None, *, using: str | None = None
) -> Snapshot:
    """Figures of ``targets`` (default: every claimable model) and the live workers."""
    chosen = list(targets) if targets is not None else list(claimable_models())
    snap = Snapshot(now=db_now(using or "default"))
    for model in sorted(chosen, key=lambda m: m._meta.label):
        snap.models.append(model_stats(model, using=using))
    snap.workers = live_workers(using)
    return snap


def format_snapshot(snap: Snapshot) -> str:
    """``taskclaim_stats``' text: a fixed-width table (a row per model, a column per
    state and figure, ``-`` where a model cannot say), then the live workers."""

    def age(seconds: float | None) -> str:
        return "-" if seconds is None else humanize_seconds(seconds)

    def count(value: int | None) -> str:
        return "-" if value is None else str(value)

    header = ["model", *STATE_NAMES, "expired", "oldest_ready", "done_5m", "done_60m", "total"]
    rows = [
        [
            m.label,
            *[count(m.counts.get(s)) for s in STATE_NAMES],
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
    lines += ["", f"live workers: {len(snap.workers)}"]
    lines += [
        f"  {w.worker_id}  host={w.hostname} pid={w.pid} threads={w.concurrency} "
        f"in_flight={w.in_flight} processed={w.processed} seen={age(w.seen_ago)} ago"
        for w in snap.workers
    ]
    return "\n".join(lines)
