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

Start: the worker waits for its database and checks its schema first
(:mod:`.preflight`): a table or column missing ends it with one line naming
``migrate`` (:data:`~.exits.EXIT_CONFIG`). A database that fails is retried, reported
at once and then every :data:`~.preflight.WARN_EVERY` seconds; a ``--burst`` worker
gives up after :data:`~.preflight.BURST_WAIT` seconds, at start or when every claim
fails (:data:`~.exits.EXIT_UNAVAILABLE`).

A supervised process (``parent`` given) never outlives its supervisor: when the
supervisor is gone (``SIGHUP`` from ``PR_SET_PDEATHSIG`` on Linux, and a parent-pid
check every second everywhere) it stops at once, without a grace period: unstarted rows
are released and running rows requeued, fenced, as when ``--grace`` runs out.
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

from django.db import DatabaseError, connections
from django.db.models import Model

from django_taskclaim.claim import was_recovered
from django_taskclaim.db import default_worker_id
from django_taskclaim.wakeup.notify import Listener
from django_taskclaim.worker.acks import Acks
from django_taskclaim.worker.claimer import Claimer
from django_taskclaim.worker.config import WorkerConfig
from django_taskclaim.worker.executors import Executors
from django_taskclaim.worker.exits import (
    EXIT_BROKEN,
    EXIT_CONFIG,
    EXIT_FORCED,
    EXIT_GRACE_EXPIRED,
    EXIT_OK,
    EXIT_UNAVAILABLE,
)
from django_taskclaim.worker.handback import Handback
from django_taskclaim.worker.heartbeat import Heartbeat
from django_taskclaim.worker.ledger import Ledger
from django_taskclaim.worker.preflight import (
    BURST_WAIT,
    DatabaseMissingError,
    DatabaseUnavailableError,
    Outage,
    describe_problems,
    wait_for_database,
)
from django_taskclaim.worker.reaping import Reaping, reap_before_burst
from django_taskclaim.worker.registry import Registry
from django_taskclaim.worker.scheduler import Scheduler
from django_taskclaim.worker.scope import Scope

logger = logging.getLogger("django_taskclaim.worker")

#: Seconds async bodies cancelled at the end of the grace period get to end (their
#: ``finally`` blocks, their requeue) before the rows still running are requeued.
CANCEL_WAIT = 2.0

#: The signal a supervised process gets when its supervisor dies (``PR_SET_PDEATHSIG``).
PARENT_DEATH_SIGNAL = signal.SIGHUP


class Worker:
    """Run the tasks of claimable models until stopped (see the module docstring).

    ``run()`` blocks and returns an exit code from :data:`~.exits.EXIT_CODES`. Signals
    are handled only when ``run()`` is called from the main thread. ``parent`` is the
    pid of the supervisor this process must not outlive (``None``: not supervised).
    """

    def __init__(self, config: WorkerConfig, *, parent: int | None = None) -> None:
        self.config = config
        self.parent = parent
        self.using = config.using
        self.worker_id = config.worker_id or default_worker_id()
        self._stopping = threading.Event()  # no new claims, nothing new started
        self._halt = threading.Event()  # helper threads end
        self._main_wake = threading.Event()
        self._stop_reason = ""
        self._signals = 0
        self._broken = False
        self._orphaned = False
        self._gave_up = False
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
        # Claim failures reported every WARN_EVERY seconds while they last (the claimer
        # logs the first one itself); --burst gives up on them after BURST_WAIT.
        self.claim_outage = Outage(
            "claim",
            self.worker_id,
            give_up_after=BURST_WAIT if config.burst else None,
            warn_first=False,
        )
        self.claimer = Claimer(
            config,
            self.ledger,
            self.acks,
            worker_id=self.worker_id,
            queryset=self._claim_queryset,
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
            if self.parent is not None:
                previous[PARENT_DEATH_SIGNAL] = signal.signal(
                    PARENT_DEATH_SIGNAL, self._on_parent_signal
                )
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
    def _claim_queryset(self, model: type[Model]) -> Any:
        """What the claimer claims from: :meth:`queryset`, its claims' database errors
        counted by :attr:`claim_outage`."""
        return _WatchedClaims(self.scope.queryset(model), self.claim_outage)

    def _preflight(self) -> int | None:
        """Wait for the database and check the schema; an exit code if the worker must
        not start (``EXIT_OK``: stopped while waiting), else ``None``."""
        try:
            problems = wait_for_database(
                self.config.models,
                self.using,
                stopping=self._stopping,
                wake=self._main_wake,
                worker_id=self.worker_id,
                burst=self.config.burst,
            )
        except DatabaseUnavailableError as exc:
            logger.error("%s worker=%s", exc, self.worker_id)
            return EXIT_UNAVAILABLE
        except DatabaseMissingError as exc:
            logger.error("%s worker=%s", exc, self.worker_id)
            return EXIT_CONFIG
        if problems is None:
            return EXIT_OK
        if problems:
            logger.error("%s worker=%s", describe_problems(problems, self.using), self.worker_id)
            connections.close_all()
            return EXIT_CONFIG
        return None

    def _run(self) -> int:
        started = time.monotonic()
        c = self.config
        refused = self._preflight()
        if refused is not None:
            return refused
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
            if not self._gave_up and self.claim_outage.exhausted():
                self._gave_up = True
                logger.error(
                    "%s worker=%s", self.claim_outage.give_up_line(self.using), self.worker_id
                )
                self.request_stop("database unavailable")
            self._check_parent()
            if self._orphaned and grace_deadline is not None:
                grace_deadline = min(grace_deadline, now)
            if self._stopping.is_set():
                if grace_deadline is None:
                    grace = 0.0 if self._orphaned else c.grace
                    grace_deadline = now + grace
                    self.ledger.stop()
                    self.handback.release(self.ledger.take_unstarted())
                    running = len(self.ledger.running())
                    if running:
                        logger.info(
                            "stopping worker=%s reason=%s running=%s grace=%ss",
                            self.worker_id,
                            self._stop_reason,
                            running,
                            grace,
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
        if self._gave_up and code == EXIT_OK:
            code = EXIT_UNAVAILABLE
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

    def _on_parent_signal(self, signum: int, frame: Any) -> None:
        self._check_parent()
        self._main_wake.set()

    def _check_parent(self) -> None:
        """Stop at once, without grace, when the supervisor is gone (our parent changed)."""
        if self.parent is None or self._orphaned or os.getppid() == self.parent:
            return
        self._orphaned = True
        logger.warning(
            "supervisor gone (pid %s): stopping now worker=%s, giving back the rows held",
            self.parent,
            self.worker_id,
        )
        self.request_stop("supervisor gone")


class _WatchedClaims:
    """A queryset whose ``claim()`` reports its database errors and successes to an
    :class:`~.preflight.Outage` (the claimer retries them as before)."""

    def __init__(self, queryset: Any, outage: Outage) -> None:
        self.queryset = queryset
        self.outage = outage

    def claim(self, *args: Any, **kwargs: Any) -> Any:
        try:
            rows = self.queryset.claim(*args, **kwargs)
        except DatabaseError as exc:
            self.outage.failed(exc)
            raise
        self.outage.ok()
        return rows
