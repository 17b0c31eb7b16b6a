"""The race lab: every claim technique run by concurrent processes, double claims counted.

``manage.py taskclaim_racelab`` (see ``docs/racelab.md``) fills a scratch table with M
ready rows and lets N forked claimer processes drain it with one technique at a time —
the library's strategies, the two lock-table techniques done right, and the broken
recipes the articles warn about. Every claim is recorded; a row handed out more than
once is a **double claim**. The lab creates its scratch tables itself (no migration in
the user's project) and drops them afterwards.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import socket
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from typing import Any

from django.db import DatabaseError, IntegrityError, connections, models, transaction
from django.db.models import F

from .db import DbNow, is_transient
from .exceptions import ClaimLost
from .mixins import ClaimableModel, claim_indexes
from .strategies import STRATEGIES

logger = logging.getLogger("django_taskclaim.racelab")

#: app label of the scratch models: not an installed app, so migrations never see them
LAB_APP_LABEL = "taskclaim_racelab"


# -- scratch tables (created and dropped by the lab) -----------------------------------


class LabTask(ClaimableModel):
    """The rows the claimers fight over."""

    class ClaimMeta:
        lease = 300
        ordering = ("created_at", "pk")
        max_attempts = 1000

    class Meta:
        app_label = LAB_APP_LABEL
        db_table = "taskclaim_racelab_task"
        managed = False
        indexes = claim_indexes("tcrl_task", order=("created_at", "id"))


class LabInsertLock(models.Model):
    """Insert-as-lock: the task id is the primary key; the INSERT that wins holds it."""

    task_id = models.BigIntegerField(primary_key=True)
    owner = models.CharField(max_length=255)

    class Meta:
        app_label = LAB_APP_LABEL
        db_table = "taskclaim_racelab_insertlock"
        managed = False

    def __str__(self) -> str:
        return f"lock {self.task_id}"


class LabLease(models.Model):
    """Lease-lock table: one row per key, reusable once ``locked_until`` has passed."""

    key = models.CharField(max_length=100, unique=True)
    owner = models.CharField(max_length=255)
    locked_until = models.DateTimeField()

    class Meta:
        app_label = LAB_APP_LABEL
        db_table = "taskclaim_racelab_lease"
        managed = False

    def __str__(self) -> str:
        return self.key


class LabBatchLock(models.Model):
    """The broken lock table of the articles: one row holding the ids a consumer took."""

    owner = models.CharField(max_length=255)
    ids = models.TextField()

    class Meta:
        app_label = LAB_APP_LABEL
        db_table = "taskclaim_racelab_batchlock"
        managed = False

    def __str__(self) -> str:
        return f"{self.owner}: {self.ids}"


SCRATCH_MODELS: tuple[type[models.Model], ...] = (LabTask, LabInsertLock, LabLease, LabBatchLock)


# -- techniques -------------------------------------------------------------------------


@dataclass
class Context:
    """What a claimer process knows: its database, name, batch size and timings."""

    using: str
    worker: str
    batch: int
    work: float
    window: float
    retried: int = 0
    lost: int = 0

    def tasks(self) -> Any:
        return LabTask.objects.using(self.using)

    def ready_ids(self, limit: int) -> list[int]:
        qs = self.tasks().filter(status="ready").order_by("created_at", "pk")
        return list(qs.values_list("pk", flat=True)[:limit])

    def do_work(self) -> None:
        if self.work > 0:
            time.sleep(self.work)

    def race_window(self) -> None:
        if self.window > 0:
            time.sleep(self.window)

    def finish(self, pks: Iterable[int]) -> None:
        """The broken recipes' completion: an unconditional ``UPDATE … status = done``."""
        self.tasks().filter(pk__in=list(pks)).update(status="done", locked_until=None)


Record = Callable[[Sequence[int]], None]


class Technique:
    """One way of claiming rows. ``take`` claims, works and finishes up to ``batch`` rows."""

    name = ""
    kind = ""  # "ours", "lock table" or "broken"
    description = ""

    @property
    def safe(self) -> bool:
        return self.kind != "broken"

    def unsupported(self, using: str) -> str | None:
        """The reason this technique cannot run on ``using``, or ``None``."""
        return None

    def take(self, ctx: Context, record: Record) -> int:
        """Claim, process and finish some rows; call ``record`` with the ids claimed."""
        raise NotImplementedError


class Strategy(Technique):
    """One of the library's claim strategies, through ``claim()`` and ``complete()``."""

    kind = "ours"

    def __init__(self, name: str, description: str) -> None:
        self.name = name
        self.description = description

    def unsupported(self, using: str) -> str | None:
        if not STRATEGIES[self.name].supported(using):
            conn = connections[using]
            return f"strategy {self.name!r} is not supported on {conn.display_name}"
        return None

    def take(self, ctx: Context, record: Record) -> int:
        if STRATEGIES[self.name].needs_caller_atomic:
            with transaction.atomic(using=ctx.using):
                rows = ctx.tasks().claim(ctx.batch, strategy=self.name, worker=ctx.worker)
                record([r.pk for r in rows])
                ctx.do_work()
                self._complete(ctx, rows)
            return len(rows)
        rows = ctx.tasks().claim(ctx.batch, strategy=self.name, worker=ctx.worker)
        record([r.pk for r in rows])
        ctx.do_work()
        self._complete(ctx, rows)
        return len(rows)

    @staticmethod
    def _complete(ctx: Context, rows: Iterable[Any]) -> None:
        for row in rows:
            try:
                row.complete()
            except ClaimLost:
                ctx.lost += 1


class _LockThenCheck(Technique):
    """Shared part of the two correct lock-table techniques.

    After the lock is won the row's status is re-checked in the claiming UPDATE
    (``… WHERE pk = %s AND status = 'ready'``): a claimer that read the row as ready
    before another one finished it and released the lock gets 0 rows and lets go.
    """

    kind = "lock table"

    def acquire(self, ctx: Context, pk: int) -> bool:
        raise NotImplementedError

    def release(self, ctx: Context, pk: int) -> None:
        raise NotImplementedError

    def take(self, ctx: Context, record: Record) -> int:
        won: list[int] = []
        for pk in ctx.ready_ids(ctx.batch * 4 + 4):
            if len(won) >= ctx.batch:
                break
            if not self.acquire(ctx, pk):
                continue
            hit = (
                ctx.tasks()
                .filter(pk=pk, status="ready")
                .update(status="processing", locked_by=ctx.worker, version=F("version") + 1)
            )
            if hit == 1:
                won.append(pk)
            else:
                self.release(ctx, pk)
        if not won:
            return 0
        record(won)
        ctx.do_work()
        ctx.tasks().filter(pk__in=won, status="processing").update(status="done", locked_until=None)
        for pk in won:
            self.release(ctx, pk)
        return len(won)


class InsertLock(_LockThenCheck):
    name = "insert-as-lock"
    description = (
        "INSERT the task id into a lock table (primary key); the loser gets a unique violation"
    )

    def acquire(self, ctx: Context, pk: int) -> bool:
        try:
            with transaction.atomic(using=ctx.using):
                LabInsertLock._default_manager.using(ctx.using).create(task_id=pk, owner=ctx.worker)
        except IntegrityError:
            ctx.retried += 1
            return False
        return True

    def release(self, ctx: Context, pk: int) -> None:
        LabInsertLock._default_manager.using(ctx.using).filter(
            task_id=pk, owner=ctx.worker
        ).delete()


class LeaseLockTable(_LockThenCheck):
    name = "lease-lock table"
    description = "a (key, locked_until) row per task: insert, or take over an expired lease"
    ttl = 300.0

    def acquire(self, ctx: Context, pk: int) -> bool:
        leases = LabLease._default_manager.using(ctx.using)
        until = DbNow() + timedelta(seconds=self.ttl)
        try:
            with transaction.atomic(using=ctx.using):
                leases.create(key=f"task:{pk}", owner=ctx.worker, locked_until=until)
            return True
        except IntegrityError:
            ctx.retried += 1
        taken = leases.filter(key=f"task:{pk}", locked_until__lt=DbNow()).update(
            owner=ctx.worker, locked_until=until
        )
        return taken == 1

    def release(self, ctx: Context, pk: int) -> None:
        LabLease._default_manager.using(ctx.using).filter(
            key=f"task:{pk}", owner=ctx.worker
        ).delete()


class BrokenBatchLock(Technique):
    name = "broken: lock table after plain SELECT"
    kind = "broken"
    description = (
        "READ COMMITTED: SELECT ready rows, SELECT the lock table, INSERT one lock row "
        "holding the ids (write skew)"
    )

    def take(self, ctx: Context, record: Record) -> int:
        locks = LabBatchLock._default_manager.using(ctx.using)
        with transaction.atomic(using=ctx.using):
            taken: set[int] = set()
            for ids in locks.values_list("ids", flat=True):
                taken.update(json.loads(ids))
            ids = [pk for pk in ctx.ready_ids(ctx.batch + len(taken)) if pk not in taken]
            ids = ids[: ctx.batch]
            if not ids:
                return 0
            ctx.race_window()
            lock = locks.create(owner=ctx.worker, ids=json.dumps(ids))
        record(ids)
        ctx.do_work()
        ctx.finish(ids)
        locks.filter(pk=lock.pk).delete()
        return len(ids)


class BrokenForUpdate(Technique):
    name = "broken: FOR UPDATE, unconditional UPDATE"
    kind = "broken"
    description = (
        "pick the oldest ready id, SELECT … FOR UPDATE it by id, then UPDATE status "
        "without re-checking it"
    )

    def take(self, ctx: Context, record: Record) -> int:
        ids = ctx.ready_ids(ctx.batch)
        if not ids:
            return 0
        with transaction.atomic(using=ctx.using):
            list(ctx.tasks().select_for_update().filter(pk__in=ids).values_list("pk", flat=True))
            ctx.race_window()
            ctx.tasks().filter(pk__in=ids).update(status="processing", locked_by=ctx.worker)
        record(ids)
        ctx.do_work()
        ctx.finish(ids)
        return len(ids)


class BrokenSelectUpdate(Technique):
    name = "broken: SELECT then UPDATE"
    kind = "broken"
    description = "SELECT the oldest ready id, then UPDATE it by id alone, no condition"

    def take(self, ctx: Context, record: Record) -> int:
        ids = ctx.ready_ids(ctx.batch)
        if not ids:
            return 0
        ctx.race_window()
        ctx.tasks().filter(pk__in=ids).update(status="processing", locked_by=ctx.worker)
        record(ids)
        ctx.do_work()
        ctx.finish(ids)
        return len(ids)


TECHNIQUES: dict[str, Technique] = {
    t.name: t
    for t in (
        Strategy("skip_locked", "one UPDATE … WHERE pk IN (SELECT … FOR UPDATE SKIP LOCKED)"),
        Strategy("cas", "read candidates, UPDATE … WHERE pk, version and status still match"),
        Strategy("advisory", "candidates guarded by pg_try_advisory_xact_lock"),
        Strategy("serializable", "SELECT + UPDATE at SERIALIZABLE, failures retried"),
        Strategy("hold", "FOR UPDATE SKIP LOCKED held for the whole (short) job"),
        InsertLock(),
        LeaseLockTable(),
        BrokenBatchLock(),
        BrokenForUpdate(),
        BrokenSelectUpdate(),
    )
}
#: short names accepted by ``--technique`` (``broken-select-update`` …)
ALIASES: dict[str, str] = {
    "insert-lock": "insert-as-lock",
    "lease-lock": "lease-lock table",
    "broken-lock-table": "broken: lock table after plain SELECT",
    "broken-for-update": "broken: FOR UPDATE, unconditional UPDATE",
    "broken-select-update": "broken: SELECT then UPDATE",
}


def technique_names() -> list[str]:
    """Every name ``--technique`` accepts: strategy names and short aliases."""
    return [n for n in TECHNIQUES if ":" not in n and " " not in n] + list(ALIASES)


def get_technique(name: str) -> Technique:
    """Look a technique up by its name or short alias (``KeyError`` if unknown)."""
    return TECHNIQUES[ALIASES.get(name, name)]


# -- one claimer process -----------------------------------------------------------------


class _RetryCounter(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if str(record.msg).startswith("retrying"):
            self.count += 1


def _claimer(
    technique_name: str,
    ctx: Context,
    barrier: Any,
    results: Any,
    deadline_s: float,
) -> None:
    # Our strategies retry transient errors inside the library and log each retry.
    counter = _RetryCounter()
    db_logger = logging.getLogger("django_taskclaim.db")
    db_logger.addHandler(counter)
    db_logger.setLevel(logging.DEBUG)
    db_logger.propagate = False
    technique = get_technique(technique_name)
    claimed: list[int] = []
    error = ""
    start = end = time.monotonic()
    try:
        barrier.wait(timeout=60)
        start = time.monotonic()
        deadline = start + deadline_s
        idle = 0
        while time.monotonic() < deadline:
            try:
                got = technique.take(ctx, claimed.extend)
            except DatabaseError as exc:
                if isinstance(exc, IntegrityError) or is_transient(exc, ctx.using):
                    ctx.retried += 1
                    continue
                raise
            if got:
                idle = 0
                continue
            if not ctx.tasks().filter(status="ready").exists():
                break
            idle += 1  # ready rows remain but others hold them: try again shortly
            time.sleep(min(0.05, 0.001 * idle))
        end = time.monotonic()
    except Exception as exc:  # reported to the parent, which prints it
        end = time.monotonic()
        error = f"{type(exc).__name__}: {exc}"
    finally:
        connections.close_all()
    results.put(
        {
            "claimed": claimed,
            "retried": ctx.retried + counter.count,
            "lost": ctx.lost,
            "start": start,
            "end": end,
            "error": error,
            "timed_out": not error and end >= start + deadline_s,
        }
    )


# -- the lab -------------------------------------------------------------------------------


@dataclass
class LabResult:
    """One line of the lab's table."""

    technique: str
    kind: str
    claims: int = 0
    seconds: float = 0.0
    double_claims: int = 0
    never_claimed: int = 0
    retried_errors: int = 0
    lost: int = 0
    skipped: str = ""
    errors: list[str] = field(default_factory=list)

    @property
    def claims_per_s(self) -> float:
        return self.claims / self.seconds if self.seconds > 0 else 0.0

    @property
    def verdict(self) -> str:
        if self.skipped:
            return "skipped"
        if self.errors:
            return "error"
        if self.double_claims or self.never_claimed:
            return "UNSAFE (expected)" if self.kind == "broken" else "UNSAFE"
        return "no race seen" if self.kind == "broken" else "ok"

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["claims_per_s"] = round(self.claims_per_s, 1)
        data["verdict"] = self.verdict
        return data


class RaceLab:
    """Runs techniques against scratch tables on database ``using``.

    Guarantee: the scratch tables exist only while :meth:`run` runs (they are dropped
    afterwards, also on errors); nothing else in the database is touched. The lab
    creates rows and lets ``processes`` forked claimers drain them; each claim is
    recorded, so ``double_claims`` counts every extra hand-out of a row and
    ``never_claimed`` every row no claimer got before the run ended.
    """

    def __init__(
        self,
        *,
        using: str = "default",
        processes: int = 4,
        rows: int = 2000,
        batch: int = 1,
        work: float = 0.0,
        window: float = 0.0,
        timeout: float = 120.0,
    ) -> None:
        self.using = using
        self.processes = processes
        self.rows = rows
        self.batch = batch
        self.work = work
        self.window = window
        self.timeout = timeout

    # -- scratch tables --
    def create_tables(self) -> None:
        """(Re)create the scratch tables, dropping leftovers of an interrupted run."""
        self.drop_tables()
        conn = connections[self.using]
        with conn.schema_editor() as editor:
            for model in SCRATCH_MODELS:
                editor.create_model(model)

    def drop_tables(self) -> None:
        """Drop the scratch tables that exist."""
        conn = connections[self.using]
        existing = set(conn.introspection.table_names())
        with conn.schema_editor() as editor:
            for model in SCRATCH_MODELS:
                if model._meta.db_table in existing:
                    editor.delete_model(model)

    def _fill(self) -> None:
        for model in SCRATCH_MODELS:
            model._base_manager.using(self.using).all().delete()
        LabTask.objects.using(self.using).bulk_create(
            [LabTask() for _ in range(self.rows)], batch_size=1000
        )

    # -- running --
    def run(
        self,
        techniques: Iterable[str] | None = None,
        *,
        on_result: Callable[[LabResult], None] | None = None,
    ) -> list[LabResult]:
        """Run each technique (default: all) in turn; return one result per technique."""
        names = list(techniques) if techniques is not None else list(TECHNIQUES)
        chosen = [get_technique(n) for n in names]
        results: list[LabResult] = []
        self.create_tables()
        try:
            for technique in chosen:
                result = self.run_one(technique)
                results.append(result)
                if on_result is not None:
                    on_result(result)
        finally:
            self.drop_tables()
        return results

    def run_one(self, technique: Technique) -> LabResult:
        """Run one technique on freshly filled scratch tables (which must exist)."""
        result = LabResult(technique.name, technique.kind)
        reason = technique.unsupported(self.using)
        if reason:
            result.skipped = reason
            return result
        self._fill()
        ids = set(LabTask.objects.using(self.using).values_list("pk", flat=True))
        connections.close_all()  # children open their own connections
        mp = multiprocessing.get_context("fork")
        barrier = mp.Barrier(self.processes)
        queue = mp.Queue()
        host = socket.gethostname()
        procs = []
        for i in range(self.processes):
            ctx = Context(
                using=self.using,
                worker=f"{host}:lab-{os.getpid()}-{i}",
                batch=self.batch,
                work=self.work,
                window=self.window,
            )
            proc = mp.Process(
                target=_claimer,
                args=(technique.name, ctx, barrier, queue, self.timeout),
                daemon=True,
            )
            proc.start()
            procs.append(proc)
        reports = []
        try:
            for _ in procs:
                reports.append(queue.get(timeout=self.timeout + 90))
        finally:
            for proc in procs:
                proc.join(timeout=30)
                if proc.is_alive():  # pragma: no cover - a wedged claimer
                    proc.kill()
                    proc.join()
        counts: Counter[int] = Counter()
        for report in reports:
            counts.update(report["claimed"])
            result.retried_errors += report["retried"]
            result.lost += report["lost"]
            if report["error"]:
                result.errors.append(report["error"])
            if report["timed_out"]:
                result.errors.append(f"timed out after {self.timeout:g}s")
        result.claims = sum(counts.values())
        result.double_claims = sum(n - 1 for n in counts.values() if n > 1)
        result.never_claimed = len(ids - set(counts))
        result.seconds = max(r["end"] for r in reports) - min(r["start"] for r in reports)
        logger.info(
            "racelab technique=%s claims=%s doubles=%s never=%s retried=%s seconds=%.3f",
            technique.name,
            result.claims,
            result.double_claims,
            result.never_claimed,
            result.retried_errors,
            result.seconds,
        )
        return result


HEADER = ("technique", "kind", "claims/s", "double claims", "never claimed", "retried", "verdict")


def format_table(results: Sequence[LabResult]) -> str:
    """The lab's result table as fixed-width text."""
    rows = [HEADER]
    for r in results:
        if r.skipped:
            rows.append((r.technique, r.kind, "-", "-", "-", "-", f"skipped: {r.skipped}"))
            continue
        verdict = r.verdict + (f" ({'; '.join(r.errors)})" if r.errors else "")
        rows.append(
            (
                r.technique,
                r.kind,
                f"{r.claims_per_s:,.0f}",
                str(r.double_claims),
                str(r.never_claimed),
                str(r.retried_errors),
                verdict,
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(HEADER) - 1)]
    lines = []
    for row in rows:
        cells = [
            row[i].ljust(widths[i]) if i < 2 else row[i].rjust(widths[i])
            for i in range(len(widths))
        ]
        lines.append("  ".join([*cells, row[-1]]))
    return "\n".join(lines)
