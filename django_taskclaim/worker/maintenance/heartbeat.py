"""The heartbeat thread: keeps the leases of every row the process holds.

Every ``interval`` (``TASKCLAIM_HEARTBEAT_INTERVAL``, or a third of the lease; always
under half of it) it extends, per model, the leases of the ledger's rows: claimed,
running (except ``ClaimMeta.atomic`` bodies, whose row lock is held by their own
transaction) and run-but-unacknowledged (buffered or being written). It only renews: it
writes no outcome, and a row another session holds locked (a web request's
``select_for_update()``, a completion waiting on that lock) is skipped, never waited for
(:meth:`~django_taskclaim.model.queryset.ClaimQuerySetMixin.renew_leases`), so one locked row
never lets the other leases lapse.

A row whose extension fails was taken back (cancelled, released, reaped and re-claimed):
it is marked lost, never started if it had not been; if it is running, its cancellation
flag is set (``task.cancel_requested()``) and ``on_lost`` is called (an async body gets
``CancelledError``). Its holder's later writes are fenced out by the token anyway.

A lease that could not be renewed (database unreachable, row locked by someone else)
is watched: one interval before it can lapse, the body running under it is told to stop
the same way, and an unstarted row is never started — before another worker could take
the row, not after. The thread also refreshes the registry. It never dies: an error is
logged and the next beat comes sooner. After each beat it calls ``on_beat`` (the worker
logs there each body still running past its deadline and grace: :mod:`..deadlines`;
its lease was just renewed, so it is never run twice at once). Under ``--processes`` it
records each renewed lease's time and tells the supervisor the earliest after every
loop (:mod:`..leasewatch`): a process whose heartbeat falls silent (a body holding the
GIL) is killed by its supervisor before any of its leases can lapse.
After each beat or registry touch it adds the finished attempts counted since to the
per-minute history (:mod:`..history`: one upsert, after the leases are renewed), and
gives the queue depth sampler its turn (:mod:`.depth`: about once a minute, one lease
statement per model, a sample where it wins).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from django.db import DatabaseError
from django.db.models import Model

from django_taskclaim.config.options import get_options
from django_taskclaim.model.queryset import ClaimQuerySet
from django_taskclaim.settle.outcome import cancel_flag
from django_taskclaim.telemetry import instruments
from django_taskclaim.worker.leasewatch import LeaseReport, lease_until
from django_taskclaim.worker.ledger import Ledger
from django_taskclaim.worker.maintenance.depth import DepthSampler
from django_taskclaim.worker.maintenance.registry import REGISTRY_INTERVAL, Registry
from django_taskclaim.worker.service import Service

logger = logging.getLogger("django_taskclaim.worker")


class Heartbeat(Service):
    def __init__(
        self,
        ledger: Ledger,
        registry: Registry,
        *,
        interval: float,
        lease_for: Callable[[type[Model]], float],
        using: str,
        worker_id: str,
        halt: threading.Event | None = None,
        on_lost: Callable[[Any], None] | None = None,
        on_beat: Callable[[], None] | None = None,
        lease_report: LeaseReport | None = None,
        depth: DepthSampler | None = None,
    ) -> None:
        super().__init__(
            "taskclaim-heartbeat",
            worker_id=worker_id,
            using=using,
            halt=halt,
            databases=(registry.db,),
        )
        self.on_lost = on_lost
        self.on_beat = on_beat
        self.ledger = ledger
        self.registry = registry
        self.interval = interval
        self.lease_for = lease_for
        #: id(task) → (the task, monotonic time by which its lease surely still runs).
        self._until: dict[int, tuple[Any, float]] = {}
        self.telemetry = instruments()  # None without OpenTelemetry: nothing measured
        #: Under ``--processes``: the lease times kept on the supervisor's pipe.
        self.lease_report = lease_report
        #: The queue depth samples this process may take (``None``: none).
        self.depth = depth

    def loop(self) -> None:
        """Beat every ``interval``, touch the registry in between; never dies: an error
        is logged (warn once per outage, an unexpected one always, with its traceback)
        and the next beat comes sooner — never later than one interval, so that leases
        that could not be renewed are still watched in time (:meth:`stop_lapsing`)."""
        interval = self.interval
        touch_every = min(interval, REGISTRY_INTERVAL)
        next_beat = time.monotonic() + interval
        next_touch = time.monotonic() + touch_every
        while not self.wait(min(next_beat, next_touch) - time.monotonic()):
            try:  # this thread never dies: leases of running tasks depend on it
                now = time.monotonic()
                if now >= next_beat:
                    self.beat()
                    next_beat = time.monotonic() + interval
                    next_touch = time.monotonic() + touch_every
                    self.recovered("heartbeat resumed worker=%s", self.worker_id)
                elif now >= next_touch:
                    self.registry.touch()
                    next_touch = time.monotonic() + touch_every
            except Exception as exc:
                self.failed(
                    exc,
                    "heartbeat failed worker=%s error=%s",
                    self.worker_id,
                    always_warn=not isinstance(exc, DatabaseError),
                )
                next_beat = time.monotonic() + min(interval, self.retry_delay())
                next_touch = next_beat
            self.ledger.history.flush(self.using)  # the charts' counts; never raises
            if self.depth is not None:
                self.depth.tick()  # the depth chart's samples; never raises
            self.stop_lapsing()
            if self.lease_report is not None:  # after a beat, and while none can run
                self.lease_report.refresh()

    def beat(self) -> None:
        """Renew every held lease (one transaction per model; rows locked by another
        session skipped), then touch the registry."""
        by_model: dict[type[Model], list[tuple[Any, int]]] = {}
        held = self.ledger.held(skip_running=lambda t: get_options(type(t)).atomic)
        self._track(held)
        for task in held:
            by_model.setdefault(type(task), []).append((task, task.version))
        for model, pairs in by_model.items():
            snaps = [_Snap(task.pk, version) for task, version in pairs]
            lease = self.lease_for(model)
            sent = time.monotonic()
            lost, busy = ClaimQuerySet(model=model, using=self.using).renew_leases(snaps, lease)
            not_renewed = {(s.pk, s.version) for s in (*lost, *busy)}
            if self.telemetry is not None:
                self.telemetry.leases(model._meta.label, len(pairs) - len(not_renewed))
            for task, version in pairs:
                if (task.pk, version) not in not_renewed:
                    self._until[id(task)] = (task, sent + lease)
                    if self.lease_report is not None:
                        lease_until(task, sent, lease)
            if busy:
                logger.info(
                    "lease not renewed: row locked by another session tasks=%s worker=%s",
                    ",".join(f"{model._meta.label}:{s.pk}" for s in busy),
                    self.worker_id,
                )
            if lost:
                self.mark_lost(pairs, {(s.pk, s.version) for s in lost})
        if self.on_beat is not None:
            self.on_beat()  # e.g. log the bodies still running past their deadline
        self.registry.touch()

    def _track(self, held: list[Any]) -> None:
        """Start watching newly held rows, forget those no longer held. A new row's lease
        began at its claim, at most one interval before this beat first sees it."""
        now = time.monotonic()
        ids = {id(t) for t in held}
        for key in [k for k in self._until if k not in ids]:
            del self._until[key]
        for task in held:
            if id(task) not in self._until:
                start = now - self.interval
                self._until[id(task)] = (task, start + self.lease_for(type(task)))

    def stop_lapsing(self) -> None:
        """Tell every body whose lease could not be renewed, one interval before it can
        lapse, to stop (cancellation flag, ``on_lost``); an unstarted row is then never
        started. Nothing is written: if a renewal lands after all, the body's own
        outcome write is still valid."""
        if not self._until:
            return
        margin = time.monotonic() + self.interval
        for task in self.ledger.startable():
            entry = self._until.get(id(task))
            if entry is None or entry[1] > margin:
                continue
            flag = cancel_flag(task)
            if flag.is_set():
                continue
            flag.set()
            if self.on_lost is not None:
                self.on_lost(task)
            logger.warning(
                "lease not renewed task=%s:%s attempt=%s worker=%s: it may lapse in %.1fs, "
                "the task is asked to stop (cancellation flag)",
                type(task)._meta.label,
                task.pk,
                task.attempts,
                self.worker_id,
                max(0.0, entry[1] - time.monotonic()),
            )

    def mark_lost(self, held: list[tuple[Any, int]], lost: set[tuple[Any, int]]) -> None:
        for task, version in held:
            if (task.pk, version) not in lost:
                continue
            opts = get_options(type(task))
            if opts.state_of(getattr(task, opts.status_field)) != "processing":
                continue  # settled since the snapshot
            where = self.ledger.mark_lost(task, version)
            if where is not None:
                cancel_flag(task).set()
                if self.telemetry is not None:
                    self.telemetry.lease_lost(task)
            if where == "running" and self.on_lost is not None:
                self.on_lost(task)
            label = type(task)._meta.label
            if where == "claimed":
                logger.warning(
                    "claim lost before start task=%s:%s worker=%s: skipped",
                    label,
                    task.pk,
                    self.worker_id,
                )
            elif where == "running":
                logger.warning(
                    "claim lost while running task=%s:%s attempt=%s worker=%s: "
                    "its later writes will not land",
                    label,
                    task.pk,
                    task.attempts,
                    self.worker_id,
                )


class _Snap:
    """The (pk, token) a lease extension is fenced on, taken before the statement."""

    __slots__ = ("pk", "version")

    def __init__(self, pk: Any, version: int) -> None:
        self.pk = pk
        self.version = version
