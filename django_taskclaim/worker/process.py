"""One worker process: the pieces wired together, its main loop, signals and grace.

    claimer ──rows──▶ ledger ──take──▶ executors ──settle──▶ acks ──UPDATE──▶ database
                        ▲                                      ▲
      services (:mod:`.maintenance`, one :class:`~.service.Service` base): heartbeat
      (every held lease, the registry), reaping, scheduler, listener (LISTEN wake-ups)

Shutdown: the first SIGTERM/SIGINT stops claiming and starting, releases the claimed
but unstarted rows at once (attempt not counted) and lets running tasks finish within
``grace`` seconds; then async bodies get ``CancelledError`` and up to
:data:`CANCEL_WAIT` seconds to end, and every row still running is requeued
(:data:`~.exits.EXIT_GRACE_EXPIRED`); the second signal exits at once
(:data:`~.exits.EXIT_FORCED`; leases recover the rest).

Start: the worker waits for its database and checks its schema (:mod:`.preflight`;
a missing table or column: one line naming ``migrate``, :data:`~.exits.EXIT_CONFIG`).
A failing database is retried, reported as an :class:`~.service.Outage`; a ``--burst``
worker gives up after :func:`~.preflight.burst_wait` seconds, at start or when every
claim fails (:data:`~.exits.EXIT_UNAVAILABLE`).

A supervised process (``parent`` given) never outlives its supervisor: when the
supervisor is gone it stops at once, without a grace period: unstarted rows are
released and running rows requeued, fenced, as when ``--grace`` runs out. The signals,
the stop's events and the watch of the supervisor are :mod:`.stopping`'s.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from django.db import connections
from django.db.models import Model

from django_taskclaim.db import default_worker_id
from django_taskclaim.settle.deadline import uses_deadlines
from django_taskclaim.worker.acks import Acks
from django_taskclaim.worker.claimer import Claimer
from django_taskclaim.worker.config import WorkerConfig
from django_taskclaim.worker.executors import Executors
from django_taskclaim.worker.exits import (
    EXIT_BROKEN,
    EXIT_GRACE_EXPIRED,
    EXIT_OK,
    EXIT_UNAVAILABLE,
)
from django_taskclaim.worker.handback import Handback
from django_taskclaim.worker.leasewatch import LeaseReport
from django_taskclaim.worker.ledger import Ledger
from django_taskclaim.worker.maintenance.depth import depth_sampler
from django_taskclaim.worker.maintenance.heartbeat import Heartbeat
from django_taskclaim.worker.maintenance.listener import Listener
from django_taskclaim.worker.maintenance.reaping import Reaping, reap_before_burst
from django_taskclaim.worker.maintenance.registry import Registry
from django_taskclaim.worker.maintenance.scheduler import Scheduler
from django_taskclaim.worker.preflight import burst_wait, refusal
from django_taskclaim.worker.scope import Scope
from django_taskclaim.worker.service import Outage, Service
from django_taskclaim.worker.stopping import Stop

logger = logging.getLogger("django_taskclaim.worker")

#: Seconds async bodies cancelled at the end of the grace period get to end (their
#: ``finally`` blocks, their requeue) before the rows still running are requeued.
CANCEL_WAIT = 2.0


class Worker:
    """Run the tasks of claimable models until stopped (see the module docstring).

    ``run()`` blocks and returns an exit code from :data:`~.exits.EXIT_CODES`. Signals
    are handled only when ``run()`` is called from the main thread. ``parent`` is the
    pid of the supervisor this process must not outlive (``None``: not supervised);
    ``report_fd`` the pipe on which it tells that supervisor the deadlines of the bodies
    it runs (:mod:`.deadlines`) and how long its leases surely run (:mod:`.leasewatch`).
    """

    def __init__(
        self, config: WorkerConfig, *, parent: int | None = None, report_fd: int | None = None
    ) -> None:
        self.config = config
        self.parent = parent
        self.using = config.using
        self.worker_id = config.worker_id or default_worker_id()
        self._stop = Stop(self.worker_id, parent, wake=lambda: self.claimer.wake.set())
        self._stopping = self._stop.stopping  # no new claims, nothing new started
        self._halt = self._stop.halt  # the threads end (the services' stop event)
        self._main_wake = self._stop.main_wake
        self._broken = False
        self._gave_up = False
        self.ledger = Ledger(
            capacity=config.concurrency * config.batch,
            claim_size=max(config.batch, config.concurrency),
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
        #: Under ``--processes``: the lease times kept on the supervisor's pipe.
        self.lease_report = (
            None
            if report_fd is None
            else LeaseReport(report_fd, self.ledger, worker_id=self.worker_id)
        )
        # Claim failures reported every WARN_EVERY seconds while they last (the claimer
        # logs the first one itself); --burst gives up on them after burst_wait().
        self.claim_outage = Outage(
            "claim",
            self.worker_id,
            using=self.using,
            give_up_after=burst_wait() if config.burst else None,
            warn_first=False,
        )
        self.claimer = self._claimer()
        self.executors = Executors(
            config,
            self.ledger,
            self.acks,
            worker_id=self.worker_id,
            halt=self._halt,
            wake_main=self._main_wake,
            deadline_report=report_fd,
        )
        self.registry.running = self.executors.running_for
        self.ledger.history.attempts.worker_id = self.worker_id
        self.registry.on_stop_request = self._stop_requested
        #: The background services (heartbeat, reaping, scheduler, listener), once started.
        self._services: list[Service] = []

    def _claimer(self) -> Claimer:
        """The one thread of this process that claims (started by :meth:`_start`)."""
        return Claimer(
            self.config,
            self.ledger,
            self.acks,
            worker_id=self.worker_id,
            queryset=self.scope.queryset,
            work_left=self.scope.work_left,
            release=self.handback.release,
            stopping=self._stopping,
            outage=self.claim_outage,
            lease_report=self.lease_report,
        )

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
        self._stop.request(reason)

    def _stop_requested(self, by: str) -> None:
        """An operator asked this worker to stop (the registry found the request)."""
        logger.info("stop requested by=%r: stopping worker=%s", by, self.worker_id)
        self._stop.request(f"stop requested by {by}")

    def run(self, announce: Callable[[], None] | None = None) -> int:
        """Run until stopped; return an exit code (see :data:`~.exits.EXIT_CODES`).

        ``announce`` (e.g. printing :meth:`describe`) is called once the signal handlers
        are in place: from then on SIGTERM means a graceful stop."""
        with self._stop.signals_handled():
            if announce is not None:
                announce()
            return self._run()

    def queryset(self, model: type[Model]) -> Any:
        """The rows of ``model`` this worker serves (``--queue`` applied)."""
        return self.scope.queryset(model)

    def leftover(self) -> str:
        """One line for the end of a ``--burst`` run (see :meth:`.scope.Scope.leftover`)."""
        return self.scope.leftover()

    # -- main loop ------------------------------------------------------------------------
    def _run(self) -> int:
        started = time.monotonic()  # --max-runtime counts the wait for the database too
        refused = refusal(
            self.config.models,
            self.using,
            stopping=self._stopping,
            wake=self._main_wake,
            worker_id=self.worker_id,
            burst=self.config.burst,
        )
        if refused is not None:
            return refused
        self._start()
        return self._shut_down(self._main_loop(started))

    def _start(self) -> None:
        """After the preflight: reap once for ``--burst``, register, start the threads."""
        if self.config.burst and self.config.reap:
            reap_before_burst(self.config.models, using=self.using, worker_id=self.worker_id)
        self.registry.register()
        connections.close_all()  # the main thread needs a connection again only to stop
        if self.parent is None:
            self._warn_unsupervised()
        self._start_services()
        self.executors.start()
        self.claimer.start()

    def _main_loop(self, started: float) -> int:
        """Watch the threads, the limits and the supervisor until the worker is done or
        its grace runs out; return the exit code so far."""
        grace_deadline: float | None = None
        while True:
            if not self._stopping.is_set() and not self.executors.replace_crashed():
                self._broken = True
                self.request_stop("executors crashing")
            if self.claimer.crashed:
                self._broken = True
            if not self.executors.alive():
                if self._stopping.is_set() or self.executors.all_finished():
                    return EXIT_OK
                continue  # they crashed: replaced (or found broken) at the top of the loop
            now = time.monotonic()
            self._check_limits(now - started)
            if self._stop.orphaned and grace_deadline is not None:
                grace_deadline = min(grace_deadline, now)
            if self._stopping.is_set():
                if grace_deadline is None:
                    grace_deadline = now + self._begin_grace()
                elif now >= grace_deadline:
                    self._grace_expired()
                    return EXIT_GRACE_EXPIRED
            timeout = 1.0 if grace_deadline is None else max(0.01, min(1.0, grace_deadline - now))
            self._main_wake.wait(timeout)
            self._main_wake.clear()

    def _check_limits(self, ran: float) -> None:
        """Stop on ``--max-runtime``, on a ``--burst`` claim outage that lasted too
        long, or when the supervisor is gone."""
        max_runtime = self.config.max_runtime
        if max_runtime is not None and ran >= max_runtime and not self._stopping.is_set():
            logger.info("max runtime reached worker=%s", self.worker_id)
            self.request_stop("max-runtime")
        if not self._gave_up and self.claim_outage.exhausted():
            self._gave_up = True
            logger.error("%s worker=%s", self.claim_outage.give_up_line(self.using), self.worker_id)
            self.request_stop("database unavailable")
        self._stop.check_parent()

    def _begin_grace(self) -> float:
        """The stop begins: nothing more is started, unstarted rows are given back;
        return the grace (seconds) the running ones get."""
        grace = 0.0 if self._stop.orphaned else self.config.grace
        self.ledger.stop()
        self.handback.release(self.ledger.take_unstarted())
        running = len(self.ledger.running())
        if running:
            logger.info(
                "stopping worker=%s reason=%r running=%s grace=%ss",
                self.worker_id,
                self._stop.reason,
                running,
                grace,
            )
        return grace

    def _grace_expired(self) -> None:
        """Cancel async bodies, write what is acknowledged, requeue what still runs."""
        self.executors.cancel_async(wait=CANCEL_WAIT)
        self.acks.flush()
        self.handback.requeue_running()

    def _shut_down(self, code: int) -> int:
        """Stop the claimer and the services, give back what is held, deregister;
        return the final exit code."""
        if self._broken and code == EXIT_OK:
            code = EXIT_BROKEN
        if self._gave_up and code == EXIT_OK:
            code = EXIT_UNAVAILABLE
        self._stopping.set()
        self.ledger.stop()
        self.claimer.wake.set()
        # A claim in flight ends in the ledger's refusal and the claimer's own release.
        self.claimer.join(timeout=max(5.0, self.config.grace))
        self.handback.release(self.ledger.take_unstarted())  # e.g. executors broken before taking
        self._halt.set()
        self.acks.new_deadline.set()
        self.claimer.wake.set()
        if code == EXIT_OK:
            self.acks.flush()
        for service in self._services:
            service.stop()
        for service in self._services if code == EXIT_OK else ():
            service.join(timeout=5)
        if self.lease_report is not None:  # nothing held now: no lease for the supervisor to watch
            self.lease_report.refresh()
        self.executors.loop.stop()
        self.ledger.history.flush(self.using)  # the last counts of the charts; never raises
        self.registry.deregister()
        logger.info(
            "worker stopped worker=%s processed=%s exit=%s",
            self.worker_id,
            self.ledger.processed,
            code,
        )
        connections.close_all()
        return code

    def _warn_unsupervised(self) -> None:
        """Unsupervised (``--no-supervisor``, or ``Worker.run()`` from Python), say once
        what a model with a deadline gives up: a body that stalls this whole process (a C
        call holding the GIL, ``SIGSTOP``) stops the heartbeat too, so past its lease
        another worker may run the row beside it (its writes land nowhere: fenced). The
        supervisor (the command's default) kills such a process first
        (:mod:`.leasewatch`)."""
        timed = [m._meta.label for m in self.config.models if uses_deadlines(m)]
        if not timed:
            return
        logger.warning(
            "worker without its supervisor: a task body that stalls this whole process (a "
            "C call holding the GIL, SIGSTOP) longer than its lease (%gs) can be run again "
            "by another worker while it still runs; its own writes then land nowhere "
            "(fenced). Run the worker command without --no-supervisor to have such a "
            "process killed before its leases lapse models=%s worker=%s",
            self.lease,
            ",".join(timed),
            self.worker_id,
        )

    def _start_services(self) -> None:
        """Start the listener (LISTEN wake-ups), the heartbeat, reaping, the scheduler."""
        c, add = self.config, self._services.append
        if self.scope.use_listen():
            labels = self.scope.labels.values()
            add(Listener(self.using, labels, self._on_notify, worker_id=self.worker_id))
        add(
            Heartbeat(
                self.ledger,
                self.registry,
                interval=c.heartbeat_interval,
                lease_for=c.lease_for,
                using=self.using,
                worker_id=self.worker_id,
                halt=self._halt,
                on_lost=self.executors.claim_lost,
                on_beat=self.executors.deadlines.beat,
                lease_report=self.lease_report,
                depth=depth_sampler(c.models, using=self.using, worker_id=self.worker_id),
            )
        )
        if c.reap:
            add(
                Reaping(
                    c.models,
                    using=self.using,
                    lock_db=self.registry.db,
                    worker_id=self.worker_id,
                    halt=self._halt,
                    stopping=self._stopping,
                    on_requeued=self._after_reap,
                )
            )
        if c.scheduler and not c.burst:
            add(
                Scheduler(
                    using=self.using,
                    worker_id=self.worker_id,
                    halt=self._halt,
                    stopping=self._stopping,
                    served=c.models,
                )
            )
        for service in self._services:
            service.start()

    def _after_reap(self) -> None:
        self.handback.notify_ready(self.config.models)
        self.claimer.wake.set()

    def _on_notify(self, label: str | None) -> None:
        self.claimer.wake.set()
