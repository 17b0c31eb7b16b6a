"""The claim techniques the lab races: the library's strategies, two correct lock
tables, and the broken recipes the articles warn about.

Each :class:`Technique` claims, "works" and finishes up to ``batch`` rows of the lab's
task table per :meth:`Technique.take`, reporting every row it was handed to ``record``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.db import IntegrityError, connections, transaction
from django.db.models import F

from django_taskclaim.claim import STRATEGIES
from django_taskclaim.contrib.racelab.models import LabBatchLock, LabInsertLock, LabLease, LabTask
from django_taskclaim.db import DbNow
from django_taskclaim.exceptions import ClaimLost


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
        """The lab's rows (``LabTask``) on this claimer's database."""
        return LabTask.objects.using(self.using)

    def ready_ids(self, limit: int) -> list[int]:
        """Up to ``limit`` ids of rows read as ready, oldest first (a plain read: no lock)."""
        qs = self.tasks().filter(status="ready").order_by("created_at", "pk")
        return list(qs.values_list("pk", flat=True)[:limit])

    def do_work(self) -> None:
        """Stand for the job: sleep ``work`` seconds between claim and completion."""
        if self.work > 0:
            time.sleep(self.work)

    def race_window(self) -> None:
        """Stand for application code between a broken recipe's read and its write."""
        if self.window > 0:
            time.sleep(self.window)

    def finish(self, pks: Iterable[int]) -> None:
        """The broken recipes' completion: an unconditional ``UPDATE … status = done``."""
        self.tasks().filter(pk__in=list(pks)).update(status="done", locked_until=None)


#: Called by :meth:`Technique.take` with the ids of the rows it was handed.
Record = Callable[[Sequence[int]], None]


class Technique:
    """One way of claiming rows. ``take`` claims, works and finishes up to ``batch`` rows."""

    name = ""
    kind = ""  # "ours", "lock table" or "broken"
    description = ""

    @property
    def safe(self) -> bool:
        """Whether the technique must never double-claim (every kind but ``broken``)."""
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
        """Why the strategy cannot run on ``using`` (its own check), or ``None``."""
        if not STRATEGIES[self.name].supported(using):
            conn = connections[using]
            return f"strategy {self.name!r} is not supported on {conn.display_name}"
        return None

    def take(self, ctx: Context, record: Record) -> int:
        """``claim()`` a batch, record it, work, ``complete()`` each row; a lost claim
        is counted in ``ctx.lost``. Strategies that hold their locks for the job run it
        all inside one ``atomic()`` block."""
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
        """Try to take the lock of row ``pk``; ``True`` if this claimer now holds it."""
        raise NotImplementedError

    def release(self, ctx: Context, pk: int) -> None:
        """Let go of the lock of row ``pk`` if this claimer holds it."""
        raise NotImplementedError

    def take(self, ctx: Context, record: Record) -> int:
        """Lock candidates one by one, claim each only if it is still ready, work,
        finish the rows won and release their locks."""
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
    """A lock table keyed by the task id: the INSERT that succeeds holds the row."""

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
    """A ``(key, owner, locked_until)`` table: insert a lease or take over an expired one."""

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
    """Broken on purpose: a lock row written after a plain read of the lock table."""

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
            for held in locks.values_list("ids", flat=True):
                taken.update(json.loads(held))
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
    """Broken on purpose: the row is locked, but the UPDATE does not re-check its status."""

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
    """Broken on purpose: read the head row, update it by id with no condition."""

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


#: Every technique the lab races, by name, in the order a full run takes them.
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
