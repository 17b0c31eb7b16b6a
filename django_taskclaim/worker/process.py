"""One worker process: the pieces wired together, its main loop, signals and grace.

    claimer ──rows──▶ ledger ──take──▶ executors ──settle──▶ acks ──UPDATE──▶ database
                        ▲                                      ▲
               heartbeat (extends every held lease, writes due acks, registry)
               reaping (periodic recovery of expired leases), listener (LISTEN wakeups)

Shutdown: the first SIGTERM/SIGINT stops claiming and starting, releases the claimed
but unstarted rows at once (attempt not counted) and lets running tasks finish within
``grace`` seconds; then async bodies get ``CancelledError`` and up to
:data:`CANCEL_WAIT` seconds to end, and every row still running is requeued
(:data:`~.exits.EXIT_GRACE_EXPIRED`); the second signal exits at once
(:data:`~.exits.EXIT_FORCED`; leases recover the rest).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from django.db import connections
from django.db.models import Model

from ..db import default_worker_id
from ..notify import Listener
from ..strategies import was_recovered
from .acks import Acks
from .claimer import Claimer
from .config import WorkerConfig
from .dbconn import wait_for_database
from .executors import Executors
from .exits import EXIT_BROKEN, EXIT_FORCED, EXIT_GRACE_EXPIRED, EXIT_OK
from .handback import Handback
from .heartbeat import Heartbeat
from .ledger import Ledger
from .reaping import Reaping, reap_before_burst
from .registry import Registry
from .scheduler import Scheduler
from .scope import Scope

logger = logging.getLogger("django_taskclaim.worker")

#: Seconds async bodies cancelled at the end of the grace period get to end (their
#: ``finally`` blocks, their requeue) before the rows still running are requeued.
CANCEL_WAIT = 2.0


class Worker:
    """Run the tasks of claimable models until stopped (see the module docstring).

    ``run()`` blocks and returns an exit code from :data:`~.exits.EXIT_CODES`. Signals
    are handled only when ``run()`` is called from the main thread.
    """

    def __init__(self, config: WorkerConfig) -> None:
        self.config = config
        self.using = config.using
        self.worker_id = config.worker_id or default_worker_id()
        self._stopping = threading.Event()  # no new claims, nothing new started
        self._halt = threading.Event()  # helper threads end
        self._main_wake = threading.Event()
        self._stop_reason = ""
        self._signals = 0
        self._broken = False
        self.ledger = Ledger(
            capacity=config.concurrency * config.batch,
            claim_size=max(config.batch, config.concurrency),
            max_tasks=config.max_tasks,
            recovered=was_recovered,
        )
        self.acks = Acks(
            self.ledger,
            window=config.ack_window,
            batch=config.batch,
            using=self.using,
            worker_id=self.worker_id,
            halt=self._halt,
        )
        self.scope = Scope(config)
        self.handback = Handback(self.ledger, using=self.using, worker_id=self.worker_id)
        self.registry = Registry(
            self.worker_id, list(self.scope.labels.values()), config.concurrency, self.ledger
        )
        self.claimer = Claimer(
            config,
            self.ledger,
            self.acks,
            worker_id=self.worker_id,
            queryset=self.scope.queryset,
            work_left=self.scope.work_left,
            release=self.handback.release,
            stopping=self._stopping,
        )
        self.executors = Executors(
            config,
            self.ledger,
            self.acks,
            worker_id=self.worker_id,
            halt=self._halt,
            wake_main=self._main_wake,
        )
        self._listener: Any = None
        self._helpers: list[threading.Thread] = []

    # -- public -------------------------------------------------------------------------
    @property
    def lease(self) -> float:
        """Seconds each claim is leased for (``--lease`` or the shortest model lease)."""
        return self.config.shortest_lease

    def describe(self) -> str:
        """The startup line: what runs where (never credentials)."""
        return self.scope.describe(self.worker_id, self.lease)

    def request_stop(self, reason: str = "requested") -> None:
        """Begin a graceful stop: no new claims, unstarted rows released, grace starts."""
        if not self._stopping.is_set():
            self._stop_reason = reason
            self._stopping.set()
        self.claimer.wake.set()
        self._main_wake.set()

    def run(self, announce: Callable[[], None] | None = None) -> int:
        """Run until stopped; return an exit code (see :data:`~.exits.EXIT_CODES`).

        ``announce`` (e.g. printing :meth:`describe`) is called once the signal handlers
        are in place: from then on SIGTERM means a graceful stop."""
        in_main = threading.current_thread() is threading.main_thread()
        previous: dict[int, Any] = {}
        if in_main:
            for sig in (signal.SIGTERM, signal.SIGINT):
                previous[sig] = signal.signal(sig, self._on_signal)
        try:
            if announce is not None:
                announce()
            return self._run()
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def queryset(self, model: type[Model]) -> Any:
        """The rows of ``model`` this worker serves (``--queue`` applied)."""
        return self.scope.queryset(model)

    def leftover(self) -> str:
        """One line for the end of a ``--burst`` run (see :meth:`.scope.Scope.leftover`)."""
        return self.scope.leftover()

    # -- main loop ------------------------------------------------------------------------
    def _run(self) -> int:
        started = time.monotonic()
        c = self.config
        if not wait_for_database(self.using, self._stopping, self._main_wake, self.worker_id):
            return EXIT_OK
        if self.config.burst and self.config.reap:
            reap_before_burst(self.config.models, using=self.using, worker_id=self.worker_id)
        self.registry.register()
        connections.close_all()  # the main thread needs a connection again only to stop
        self._start_helpers()
        self.executors.start()
        self.claimer.start()
        grace_deadline: float | None = None
        code = EXIT_OK
        while True:
            if not self._stopping.is_set() and not self.executors.replace_crashed():
                self._broken = True
                self.request_stop("executors crashing")
            if self.claimer.crashed:
                self._broken = True
            if not self.executors.alive():
                if self._stopping.is_set() or self.executors.all_finished():
                    break
                continue  # they crashed: replaced (or found broken) at the top of the loop
            now = time.monotonic()
            expired = c.max_runtime is not None and now - started >= c.max_runtime
            if expired and not self._stopping.is_set():
                logger.info("max runtime reached worker=%s", self.worker_id)
                self.request_stop("max-runtime")
            if self._stopping.is_set():
                if grace_deadline is None:
                    grace_deadline = now + c.grace
                    self.ledger.stop()
                    self.handback.release(self.ledger.take_unstarted())
                    running = len(self.ledger.running())
                    if running:
                        logger.info(
                            "stopping worker=%s reason=%s running=%s grace=%ss",
                            self.worker_id,
                            self._stop_reason,
                            running,
                            c.grace,
                        )
                elif now >= grace_deadline:
                    code = EXIT_GRACE_EXPIRED
                    self.executors.cancel_async(wait=CANCEL_WAIT)
                    self.acks.flush()
                    self.handback.requeue_running()
                    break
            timeout = 1.0 if grace_deadline is None else max(0.01, min(1.0, grace_deadline - now))
            self._main_wake.wait(timeout)
            self._main_wake.clear()
        if self._broken and code == EXIT_OK:
            code = EXIT_BROKEN
        self._stopping.set()
        self.ledger.stop()
        self.claimer.wake.set()
        # A claim in flight ends in the ledger's refusal and the claimer's own release.
        self.claimer.join(timeout=max(5.0, c.grace))
        self.handback.release(self.ledger.take_unstarted())  # e.g. executors broken before taking
        self._halt.set()
        self.acks.new_deadline.set()
        self.claimer.wake.set()
        if code == EXIT_OK:
            self.acks.flush()
        if self._listener is not None:
            self._listener.stop()
        if code == EXIT_OK:
            for t in self._helpers:
                t.join(timeout=5)
            if self._listener is not None:
                self._listener.join(timeout=3)
        self.executors.loop.stop()
        self.registry.deregister()
        logger.info(
            "worker stopped worker=%s processed=%s exit=%s",
            self.worker_id,
            self.ledger.processed,
            code,
        )
        connections.close_all()
        return code

    def _start_helpers(self) -> None:
        if self.scope.use_listen():
            self._listener = Listener(self.using, self.scope.labels.values(), self._on_notify)
            self._listener.start()
        self._helpers.append(
            Heartbeat(
                self.ledger,
                self.acks,
                self.registry,
                interval=self.config.heartbeat_interval,
                lease_for=self.config.lease_for,
                using=self.using,
                worker_id=self.worker_id,
                halt=self._halt,
                on_lost=self.executors.claim_lost,
            )
        )
        if self.config.reap:
            self._helpers.append(
                Reaping(
                    self.config.models,
                    using=self.using,
                    lock_db=self.registry.db,
                    worker_id=self.worker_id,
                    halt=self._halt,
                    stopping=self._stopping,
                    on_requeued=self._after_reap,
                )
            )
        if self.config.scheduler and not self.config.burst:
            self._helpers.append(
                Scheduler(
                    using=self.using,
                    worker_id=self.worker_id,
                    halt=self._halt,
                    stopping=self._stopping,
                    served=self.config.models,
                )
            )
        for t in self._helpers:
            t.start()

    def _after_reap(self) -> None:
        self.handback.notify_ready(self.config.models)
        self.claimer.wake.set()

    def _on_signal(self, signum: int, frame: Any) -> None:
        self._signals += 1
        name = signal.Signals(signum).name
        if self._signals > 1:
            logger.warning(
                "second %s: exiting now worker=%s (leases recover the held rows)",
                name,
                self.worker_id,
            )
            for handler in logging.getLogger().handlers + logger.handlers:
                try:
                    handler.flush()
                except Exception:
                    pass
            sys.stderr.flush()
            os._exit(EXIT_FORCED)
        logger.info("%s received: stopping worker=%s", name, self.worker_id)
        self.request_stop(name)

    def _on_notify(self, label: str | None) -> None:
        self.claimer.wake.set()
