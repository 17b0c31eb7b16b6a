"""Executor threads: each takes a claimed row from the ledger, runs its body and settles
the outcome (:func:`~django_taskclaim.settle.outcome.settle`); nothing else.

An ``async def`` body runs on the process's event loop (:mod:`.aio`) while its
executor waits, so it shares the executors' slots; its outcome is settled here as a
sync body's is. A body learns that its claim was taken back through its cancellation
flag (``task.cancel_requested()``, or the ``cancel`` argument: :mod:`.bodies`), and an
async body through ``CancelledError``; whatever it then does is fenced out. The same
flag tells a body it ran past its deadline (:mod:`.deadlines`); its attempt is then a
``TimeoutError`` failure.

Executors never die silently: a body's ``BaseException`` is that task's failure
(:class:`~django_taskclaim.settle.outcome.TaskAborted`); an executor that crashes for any
other reason is logged and replaced by :meth:`Executors.replace_crashed`; after
:data:`~.exits.MAX_CRASHES` crashes within :data:`~.exits.CRASH_WINDOW` seconds the
worker stops with :data:`~.exits.EXIT_BROKEN` so that its supervisor restarts it.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from typing import Any, cast

from django.db import DatabaseError, connections
from django.db.models import Model

from django_taskclaim.config.options import get_options
from django_taskclaim.exceptions import ClaimLost, Retry, Snooze
from django_taskclaim.row.claimable import Claimable
from django_taskclaim.settle.outcome import Attempt, TaskAborted, attempt, cancel_flag, settle
from django_taskclaim.settle.transitions import RETRY_IN_ATTR, Outcome
from django_taskclaim.settle.writes import storable_text
from django_taskclaim.telemetry import instruments
from django_taskclaim.worker.acks import Acks, fail_unstorable
from django_taskclaim.worker.aio import EventLoop
from django_taskclaim.worker.bodies import Body
from django_taskclaim.worker.config import WorkerConfig
from django_taskclaim.worker.dbconn import (
    backoff,
    close,
    connection_trouble,
    drop_stale,
    epoch,
)
from django_taskclaim.worker.deadlines import Deadlines
from django_taskclaim.worker.exits import CRASH_WINDOW, MAX_CRASHES
from django_taskclaim.worker.ledger import Ledger
from django_taskclaim.worker.service import one_line

logger = logging.getLogger("django_taskclaim.worker")

#: Seconds between two looks, by one executor, for a connection its server hung up
#: (:func:`~.dbconn.drop_stale`): a hang-up is then replaced before the next task that
#: starts this long after it (an outage another thread saw: before the very next task).
STALE_POLL = 0.05


class Executors:
    """``config.concurrency`` executor threads and their replacement after a crash."""

    def __init__(
        self,
        config: WorkerConfig,
        ledger: Ledger,
        acks: Acks,
        *,
        worker_id: str,
        halt: threading.Event,
        wake_main: threading.Event,
        deadline_report: int | None = None,
    ) -> None:
        self.config = config
        self.ledger = ledger
        self.acks = acks
        self.worker_id = worker_id
        self.halt = halt
        self.wake_main = wake_main
        self.threads: list[threading.Thread] = []
        self.loop = EventLoop(worker_id=worker_id)
        #: The deadlines of the bodies run here (``deadline_report``: the supervisor's pipe).
        self.deadlines = Deadlines(
            worker_id=worker_id,
            lease_for=config.lease_for,
            cancel_async=self.loop.cancel,
            report_fd=deadline_report,
        )
        self._bodies: dict[type, Body] = {}
        #: Per executor thread: the row whose body it runs and since when (monotonic).
        self._since: dict[str, tuple[Any, float]] = {}
        #: Per executor thread: the outage epoch and the time of its last drop_stale().
        self._stale_seen: dict[str, tuple[int, float]] = {}
        self._grace_over = False  # async bodies cancelled at the end of the grace period
        self._finished: set[str] = set()  # ended normally (not crashed)
        self._crashes: list[float] = []  # monotonic times of crashes
        self.telemetry = instruments()  # None without OpenTelemetry: nothing measured

    def running_for(self) -> list[tuple[Any, float]]:
        """The bodies running now, as (row, seconds running), for the worker registry."""
        now = time.monotonic()
        return [(task, now - since) for task, since in dict(self._since).values()]

    def start(self) -> None:
        for index in range(self.config.concurrency):
            self._start(index)

    def _start(self, index: int) -> None:
        t = threading.Thread(target=self._main, name=f"taskclaim-exec-{index}", daemon=True)
        if index < len(self.threads):
            self.threads[index] = t
        else:
            self.threads.append(t)
        t.start()

    def alive(self) -> bool:
        return any(t.is_alive() for t in self.threads)

    def all_finished(self) -> bool:
        """Whether every executor ended normally (none crashed)."""
        return all(not t.is_alive() and t.name in self._finished for t in self.threads)

    def replace_crashed(self) -> bool:
        """Restart each executor that died of an error; return False (broken) once they
        crashed :data:`MAX_CRASHES` times within :data:`CRASH_WINDOW` seconds."""
        for index, t in enumerate(self.threads):
            if t.is_alive() or t.name in self._finished:
                continue
            now = time.monotonic()
            self._crashes = [c for c in self._crashes if now - c < CRASH_WINDOW] + [now]
            if len(self._crashes) >= MAX_CRASHES:
                logger.error(
                    "executors keep crashing worker=%s crashes=%s in %ss: stopping",
                    self.worker_id,
                    len(self._crashes),
                    CRASH_WINDOW,
                )
                return False
            logger.warning("replacing crashed executor %s worker=%s", t.name, self.worker_id)
            self._start(index)
        return True

    # -- one thread ---------------------------------------------------------------------
    def _main(self) -> None:
        me = threading.current_thread().name
        try:
            self._loop(me)
            self._finished.add(me)
        except BaseException as exc:  # never silently: logged, then replaced
            logger.error(
                "executor crashed thread=%s worker=%s error=%s",
                me,
                self.worker_id,
                one_line(exc),
                exc_info=exc,
            )
        finally:
            connections.close_all()  # this thread's connections only
            self.wake_main.set()

    def _loop(self, me: str) -> None:
        while True:
            task = self.ledger.take(me, timeout=1.0)
            if task is None:
                if self.ledger.closed:
                    return
                continue
            try:
                self.run_one(task, me)
            finally:
                self.ledger.settled(me)
            self.acks.flush(due_only=True)

    def run_one(self, task: Claimable, me: str | None = None) -> Outcome:
        """Run one claimed row and record its outcome; return the outcome (``me``: the
        calling executor thread's name, looked up when not given)."""
        if me is None:
            me = threading.current_thread().name
        label = type(task)._meta.label
        # A connection dead since an outage is replaced, not failed on (at once: the
        # outage epoch moved); the server hanging up an idle one is looked for at most
        # every STALE_POLL seconds (a system call per task was a tenth of its cost).
        now = time.monotonic()
        seen = self._stale_seen.get(me)
        if seen is None or seen[0] != epoch() or now - seen[1] >= STALE_POLL:
            drop_stale()
            self._stale_seen[me] = (epoch(), now)
        alone = self.ledger.runs_alone(task)
        if alone:
            self._wait_alone(me)
        flag = cancel_flag(task)  # before the body: the heartbeat may set it any time
        started = time.monotonic()
        self._since[me] = (task, started)
        try:
            done = self._attempt(task, flag, label)
        finally:
            del self._since[me]
        ended = time.monotonic() if self.telemetry is not None else 0.0
        self.ledger.finishing(me)
        lost = flag.is_set() or self.ledger.is_lost(task)
        # A lost claim's outcome is written (fenced: it affects nothing) at once, never
        # deferred, so that it is reported now.
        # A row run alone has its outcome written now, not deferred: the next row of this
        # process starts only once it is (see Ledger.take), and the claimer claims that
        # row meanwhile, so the two round trips overlap.
        defer = None
        if self.acks.enabled and not lost and not alone:
            journal = self.ledger.history.attempts

            def defer(buffered: Claimable) -> None:
                # Noted before it is buffered: its batch may land before settle() returns.
                journal.deferring(buffered, started)
                self.acks.defer(buffered)

        try:
            outcome = settle(task, done, defer=defer)
        except Exception as exc:  # a refused value fails its row; an outage is waited out
            outcome = self._settle_again(task, done, exc)
        if outcome is not Outcome.DEFERRED:  # counted once written (Acks.flush)
            self.ledger.history.count(task, outcome)  # done / failed, for the admin's charts
        self.ledger.history.attempts.note(task, outcome, done.error, started)
        if self.telemetry is not None:
            self.telemetry.ran(task, outcome, started, ended)
        self._log_outcome(task, outcome, done, label, started)
        return outcome

    def _wait_alone(self, me: str) -> None:
        """Thread ``me``'s row runs alone: it may be the task that killed a worker, and
        nothing else of this process may be lost with it. The claimer claims nothing
        while its body may run; wait for the rows running beside it, then for every
        pending completion to be written (here, or by the thread already writing it)."""
        while not self.ledger.wait_alone(me, 1.0):
            if self.halt.is_set():
                break
        self.acks.flush()
        while not self.ledger.wait_written(1.0):
            if self.halt.is_set():
                break

    def _attempt(self, task: Claimable, flag: threading.Event, label: str) -> Attempt:
        """Run ``task``'s body, within its deadline, unless its claim was taken back
        before it started; return what became of it."""
        handler, sync = self._handler(task, flag)
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug(
                "task started task=%s:%s attempt=%s worker=%s",
                label,
                task.pk,
                task.attempts,
                self.worker_id,
            )
        if flag.is_set():  # taken back between claim and start: never started
            return Attempt(error=ClaimLost(f"{label} pk={task.pk}: claim lost before start"))
        self.deadlines.arm(task)
        done = attempt(task, handler, catch_base_exceptions=True, sync=sync)
        timeout = self.deadlines.disarm(task)
        if timeout is not None:  # ran past its deadline: a TimeoutError failure
            done = self.deadlines.past(task, done, timeout)
        if self._grace_over and _cancelled(done):
            # Cancelled at the end of the grace period: requeued at once, as a sync
            # body still running then is (this attempt counts).
            reason = f"worker {self.worker_id} stopped after its grace period"
            done = Attempt(error=Retry(delay=0, reason=reason))
        return done

    def _log_outcome(
        self, task: Claimable, outcome: Outcome, done: Attempt, label: str, started: float
    ) -> None:
        """Say what became of ``task``: a lost claim, a retry (with why), else the
        outcome (a deferred one once its completion is written)."""
        if outcome is Outcome.LOST or self.ledger.is_lost(task):
            logger.warning(
                "claim lost task=%s:%s attempt=%s worker=%s: its writes did not land",
                label,
                task.pk,
                task.attempts,
                self.worker_id,
            )
        if outcome is Outcome.READY and isinstance(done.error, Snooze):
            logger.info(
                "task snoozed task=%s:%s for %.1fs (attempt not counted) worker=%s",
                label,
                task.pk,
                task.__dict__.get(RETRY_IN_ATTR, 0.0),
                self.worker_id,
            )
        elif outcome is Outcome.READY and done.error is not None:
            logger.info(
                "task %s, will retry task=%s:%s (attempt %s/%s) in %.1fs worker=%s "
                "duration=%.3fs error=%s",
                "asked to retry" if isinstance(done.error, Retry) else "failed",
                label,
                task.pk,
                task.attempts,
                get_options(task).max_attempts,
                task.__dict__.get(RETRY_IN_ATTR, 0.0),
                self.worker_id,
                time.monotonic() - started,
                storable_text(one_line(done.error)),
            )
        elif outcome is not Outcome.DEFERRED:  # logged once its completion is written
            log = logger.debug if outcome is Outcome.DONE else logger.info
            log(
                "task %s task=%s:%s attempt=%s worker=%s duration=%.3fs",
                outcome,
                label,
                task.pk,
                task.attempts,
                self.worker_id,
                time.monotonic() - started,
            )

    def _handler(self, task: Claimable, flag: threading.Event) -> tuple[Any, bool]:
        """The callable :func:`~django_taskclaim.settle.outcome.attempt` runs for ``task``,
        and whether it is known to be a plain function (no coroutine to run)."""
        model = cast(type[Model], type(task))  # model_of(), without the call
        body = self._bodies.get(model)
        if body is None:
            body = self._bodies[model] = Body.of(self.config.handlers[model])
        if body.plain is not None:  # a sync body without the cancel flag: the usual
            return body.plain
        kwargs = body.kwargs(flag) if body.wants_cancel else None
        if body.is_async and not get_options(model).atomic:
            return (lambda t: self.loop.run(body.handler, t, kwargs or {})), True
        if kwargs:  # a partial: an atomic async body is still seen as a coroutine function
            return functools.partial(body.handler, **kwargs), not body.is_async
        return body.handler, not body.is_async

    def claim_lost(self, task: Claimable) -> None:
        """The heartbeat found the claim of running ``task`` taken back: set its flag,
        and raise ``CancelledError`` into its body if that runs on the event loop."""
        cancel_flag(task).set()
        if self.loop.cancel(task):
            logger.info(
                "async body cancelled: claim lost task=%s:%s worker=%s",
                type(task)._meta.label,
                task.pk,
                self.worker_id,
            )

    def cancel_async(self, *, wait: float) -> None:
        """The grace period is over: raise ``CancelledError`` into every async body and
        give them up to ``wait`` seconds to end (each executor requeues its row)."""
        self._grace_over = True
        cancelled = self.loop.cancel_all()
        if cancelled:
            logger.info(
                "grace period over: async bodies cancelled=%s worker=%s",
                len(cancelled),
                self.worker_id,
            )
            self.ledger.wait_settled(cancelled, wait)

    def _settle_again(self, task: Claimable, done: Attempt, exc: BaseException) -> Outcome:
        """The outcome write failed. An outage: once the connection is back, make the
        same fenced write again (``done`` is known; a write that had landed is then seen
        as ``lost`` and nothing more is written). Anything else (a value the database
        refuses: encoding, NUL, data, constraint, size) is the row's permanent failure
        (:func:`~.acks.fail_unstorable`): never left ``processing`` to run again."""
        label = type(task)._meta.label
        failures = 0
        while True:
            if not (isinstance(exc, DatabaseError) and connection_trouble(exc)):
                close(self.config.using)
                return fail_unstorable(task, exc, worker_id=self.worker_id)
            failures += 1
            close(self.config.using)
            log = logger.warning if failures == 1 else logger.debug
            log(
                "database error while recording outcome task=%s:%s worker=%s error=%s",
                label,
                task.pk,
                self.worker_id,
                one_line(exc),
            )
            if self.halt.wait(backoff(failures)):
                return Outcome.ABANDONED
            try:
                return settle(task, done)
            except Exception as again:
                exc = again


def _cancelled(done: Attempt) -> bool:
    """Whether the body ended with ``asyncio.CancelledError``."""
    error = done.error
    return isinstance(error, TaskAborted) and isinstance(error.__cause__, asyncio.CancelledError)
