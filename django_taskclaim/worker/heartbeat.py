"""The heartbeat thread: keeps the leases of every row the process holds.

Every ``interval`` (``TASKCLAIM_HEARTBEAT_INTERVAL``, or a third of the lease; always
under half of it) it extends, in one fenced statement per model, the leases of the
ledger's rows: claimed, running (except ``ClaimMeta.atomic`` bodies, whose row lock is
held by their own transaction) and run-but-unacknowledged. A row whose extension fails
was taken back (cancelled, released, reaped and re-claimed): it is marked lost, never
started if it had not been; if it is running, its cancellation flag is set
(``task.cancel_requested()``) and ``on_lost`` is called (an async body gets
``CancelledError``). Its holder's later writes are fenced out by the token anyway. In
between, it writes buffered completions as their ``ack_window`` runs out and refreshes
the registry. The thread never dies: an error is logged and the next beat comes sooner.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from django.db import DatabaseError
from django.db.models import Model

from ..lifecycle import cancel_flag
from ..options import get_options
from ..querysets import ClaimQuerySet
from .acks import Acks
from .dbconn import close, one_line
from .ledger import Ledger
from .registry import REGISTRY_INTERVAL, Registry

logger = logging.getLogger("django_taskclaim.worker")


class Heartbeat(threading.Thread):
    def __init__(
        self,
        ledger: Ledger,
        acks: Acks,
        registry: Registry,
        *,
        interval: float,
        lease_for: Callable[[type[Model]], float],
        using: str,
        worker_id: str,
        halt: threading.Event,
        on_lost: Callable[[Any], None] | None = None,
    ) -> None:
        super().__init__(name="taskclaim-heartbeat", daemon=True)
        self.on_lost = on_lost
        self.ledger = ledger
        self.acks = acks
        self.registry = registry
        self.interval = interval
        self.lease_for = lease_for
        self.using = using
        self.worker_id = worker_id
        self.halt = halt
        self.wake = acks.new_deadline  # set when a new ack deadline exists

    def run(self) -> None:
        failures = 0
        interval = self.interval
        touch_every = min(interval, REGISTRY_INTERVAL)
        next_beat = time.monotonic() + interval
        next_touch = time.monotonic() + touch_every
        while not self.halt.is_set():
            due = self.ledger.acks_due_at(self.acks.window) if self.acks.enabled else None
            wake_at = min(next_beat, next_touch) if due is None else min(next_beat, next_touch, due)
            self.wake.wait(max(0.0, wake_at - time.monotonic()))
            self.wake.clear()
            if self.halt.is_set():
                break
            try:  # this thread never dies: leases of running tasks depend on it
                if due is not None and time.monotonic() >= due:
                    self.acks.flush(due_only=True)
                now = time.monotonic()
                if now >= next_beat:
                    self.beat()
                    next_beat = time.monotonic() + interval
                    next_touch = time.monotonic() + touch_every
                    if failures:
                        logger.info("heartbeat resumed worker=%s", self.worker_id)
                    failures = 0
                elif now >= next_touch:
                    self.registry.touch()
                    next_touch = time.monotonic() + touch_every
            except Exception as exc:
                failures += 1
                trouble = isinstance(exc, DatabaseError)
                log = logger.warning if failures == 1 or not trouble else logger.debug
                log(
                    "heartbeat failed worker=%s error=%s",
                    self.worker_id,
                    one_line(exc),
                    exc_info=None if trouble else exc,
                )
                close(self.using)
                close(self.registry.db)
                next_beat = time.monotonic() + min(interval, 1.0)
                next_touch = next_beat
        close(self.using)
        close(self.registry.db)

    def beat(self) -> None:
        """Extend every held lease (one statement per model), then touch the registry."""
        by_model: dict[type[Model], list[tuple[Any, int]]] = {}
        for task in self.ledger.held(skip_running=lambda t: get_options(type(t)).atomic):
            by_model.setdefault(type(task), []).append((task, task.version))
        for model, held in by_model.items():
            snaps = [_Snap(task.pk, version) for task, version in held]
            lost = ClaimQuerySet(model=model, using=self.using).extend_leases(
                snaps, self.lease_for(model)
            )
            if lost:
                self.mark_lost(held, {(s.pk, s.version) for s in lost})
        self.registry.touch()

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
