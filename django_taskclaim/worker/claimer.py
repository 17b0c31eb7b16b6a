"""The claimer: the one thread of a process that claims rows, for all its executors.

One claim statement per round trip, however many executor threads the process runs, so
concurrent claimers grow with processes, not with processes × threads. The size of each
claim follows the executors' demand (:meth:`~.ledger.Ledger.room`): a full ``--batch``
per executor once it fits, else just what idle executors need, never more than
``--concurrency`` × ``--batch`` rows held. Models are claimed from in rotation.

A recovered row (its last holder lost it: :func:`~django_taskclaim.claim.was_recovered`)
may be the task that killed a worker. While a crash of its process could not use up its
attempts (:func:`may_share`: at least two would be left) it runs like any row, beside
others, in batches. Otherwise it runs alone: the process holds at most one such row at a
time, queued after the rest of its claim, and claims nothing more while its body may run
(see :meth:`~.ledger.Ledger.wait_alone`); further such rows of the claim are given back
unstarted at once, in one fenced statement per model (attempt not charged, still marked
recovered), each to get its own turn. Recovered rows sort first (they are the oldest), so
after a claim that returned one to run alone the claimer claims one row at a time until
a claim returns none: no full batch is claimed to keep one row of it.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from typing import Any

from django.db import DatabaseError, connections
from django.db.models import Model

from django_taskclaim.claim.base import was_recovered
from django_taskclaim.claim.paused import keep_fresh
from django_taskclaim.claim.rate import wait_hint
from django_taskclaim.config.options import get_options
from django_taskclaim.settle.transitions import give_back
from django_taskclaim.telemetry import instruments
from django_taskclaim.worker.acks import Acks
from django_taskclaim.worker.config import WorkerConfig
from django_taskclaim.worker.dbconn import backoff, close, drop_stale, pause
from django_taskclaim.worker.leasewatch import LeaseReport, lease_until
from django_taskclaim.worker.ledger import Ledger
from django_taskclaim.worker.service import Outage, one_line

logger = logging.getLogger("django_taskclaim.worker")


class Claimer(threading.Thread):
    def __init__(
        self,
        config: WorkerConfig,
        ledger: Ledger,
        acks: Acks,
        *,
        worker_id: str,
        queryset: Callable[[type[Model]], Any],
        work_left: Callable[[], bool],
        release: Callable[[list[Any]], int],
        stopping: threading.Event,
        outage: Outage,
        lease_report: LeaseReport | None = None,
    ) -> None:
        super().__init__(name="taskclaim-claimer", daemon=True)
        self.config = config
        self.ledger = ledger
        self.acks = acks
        self.worker_id = worker_id
        self.queryset = queryset
        self.work_left = work_left
        self.release = release
        self.stopping = stopping
        #: The run of failed claims (the worker reports it, and with --burst gives up).
        self.outage = outage
        self.wake = threading.Event()  # a notification: rows may be ready
        self.claims = 0  # claim statements made (for tests and stats)
        self.budget = Budget(config.max_tasks)
        # Set by a claim that returned a row to run alone: claim one row at a time until
        # a claim returns none (more would be given back unstarted).
        self.one_at_a_time = False
        self.crashed = False
        #: Set by a claim a rate limit held back: seconds until its slot frees.
        self.rate_wait: float | None = None
        self.telemetry = instruments()  # None without OpenTelemetry: nothing measured
        #: Under ``--processes``: the lease times this process keeps on its supervisor's
        #: pipe (:mod:`.leasewatch`); each claim counts as held from before it is sent.
        self.lease_report = lease_report
        #: The claims in flight told to the supervisor: whether each returned rows.
        self._reported: dict[int, bool] = {}

    def run(self) -> None:
        try:
            self._loop()
        except BaseException as exc:  # never silently: the process stops on it
            logger.error(
                "claimer crashed worker=%s error=%s", self.worker_id, one_line(exc), exc_info=exc
            )
            self.crashed = True
            self.stopping.set()
        finally:
            connections.close_all()  # this thread's connections only

    def _loop(self) -> None:
        models = list(self.config.models)
        random.shuffle(models)  # processes start on different models
        turn = 0
        poll = self.config.poll
        while not self.stopping.is_set():
            room = self.ledger.wait_for_room(poll)
            if self.stopping.is_set() or self.ledger.closed:
                return
            if not room:
                continue
            want = self.budget.reserve(1 if self.one_at_a_time else room)
            if not want:  # --max-tasks claimed: end once the last one settles
                self._finish()
                return
            # Rows in flight while this claim runs may be made ready again meanwhile (a
            # retry written as an executor settles), and a completion written meanwhile
            # may release rows that waited for it: an empty claim ends a burst only if
            # nothing was in flight or unwritten when it started.
            busy = self.ledger.in_flight()
            if self.config.burst:
                busy += self.ledger.unwritten()
            drop_stale()  # dead since an outage another thread saw: reconnect, not fail
            try:
                # A pause committed a poll interval ago is in what this claim sees.
                keep_fresh(self.config.using, poll)
                rows = self._claim(models, turn, want)
                turn += 1
            except DatabaseError as exc:
                self._claims_done()
                self.budget.unreserve(want)
                self._claim_failed(exc)
                continue
            if self.outage.ok():
                logger.info("database reachable again worker=%s", self.worker_id)
            self.budget.unreserve(want - len(rows))
            if rows:
                rows, alone = self._one_recovered(rows)
                if not self.ledger.add_claimed(rows, alone=alone):  # stopped: give them back
                    self.release(rows)
                self._claims_done()
                continue
            self._claims_done()
            # Nothing to claim: no reason to keep completions waiting. Writing them may
            # have released rows that waited for them (after=): look again first.
            if self.acks.flush():
                continue
            if self.rate_wait is not None:  # held back by a rate limit: wait for its slot
                self.wake.wait(min(poll, self.rate_wait))
                self.wake.clear()
                continue
            if self.config.burst:
                more = self._burst_more(busy, poll)
                if more is None:  # look again
                    continue
                if not more:
                    self._finish()
                    return
            self._idle(poll)

    def _claim_failed(self, exc: DatabaseError) -> None:
        """A claim failed: count it in the outage, drop the connection, wait the backoff
        (cut short by a notification, a stop, or any thread reconnecting)."""
        first = self.outage.failed(exc)
        close(self.config.using)
        delay = self.outage.delay()
        log = logger.warning if first else logger.debug
        log(
            "database error during claim worker=%s error=%s retry_in=%.1fs",
            self.worker_id,
            one_line(exc),
            delay,
        )
        pause(delay, self.wake, self.config.using)

    def _burst_more(self, busy: int, poll: float) -> bool | None:
        """``--burst``, a claim found nothing: whether rows are left to wait for
        (``--until-empty``), or ``None`` to claim again first (rows were in flight, and
        may retry: once they have all settled, one last look; or the look failed)."""
        if busy or self.ledger.in_flight():
            while not self.stopping.is_set() and not self.ledger.wait_until_idle(poll):
                pass
            while not self.stopping.is_set() and not self.ledger.wait_written(poll):
                pass  # an executor's write under way: what it releases is seen next
            return None
        try:
            return self.config.until_empty and self.work_left()
        except DatabaseError as exc:  # as a failed claim: the next one tells
            close(self.config.using)
            logger.warning(
                "database error while looking for work left worker=%s error=%s",
                self.worker_id,
                one_line(exc),
            )
            delay = backoff(self.outage.failures + 1, self.config.using)
            pause(delay, self.wake, self.config.using)
            return None

    def _claim(self, models: list[type[Model]], turn: int, want: int) -> list[Any]:
        """Claim from the first model (in rotation) that has ready rows (and note, in
        :attr:`rate_wait`, how soon a rate limit that held one back lets it claim)."""
        self.rate_wait = None
        for i in range(len(models)):
            model = models[(turn + i) % len(models)]
            lease = self.config.lease_for(model)
            report = self.lease_report
            sent = time.monotonic() if self.telemetry is not None or report is not None else 0.0
            if report is not None:
                key = report.claiming(sent, lease)
                self._reported[key] = False
            rows = self.queryset(model).claim(want, lease=lease, worker=self.worker_id)
            if report is not None and rows:
                self._reported[key] = True
                for row in rows:
                    lease_until(row, sent, lease)
            self.claims += 1
            if get_options(model).rate_limits:
                hint = wait_hint()
                if hint is not None and (self.rate_wait is None or hint < self.rate_wait):
                    self.rate_wait = hint
            if self.telemetry is not None:
                queue = self.config.queue or ""
                self.telemetry.claimed(model._meta.label, queue, rows, time.monotonic() - sent)
            if rows:
                return rows
        return []

    def _claims_done(self) -> None:
        """The claims just made are over: their rows (if any) are in the ledger, each
        with its own lease time, or given back; the supervisor is told the new earliest."""
        if self.lease_report is not None:
            while self._reported:
                key, rows = self._reported.popitem()
                self.lease_report.claimed(key, rows=rows)

    def _finish(self) -> None:
        """Burst drained or budget spent: close the ledger once nothing is in flight."""
        while not self.stopping.is_set() and not self.ledger.wait_until_idle(1.0):
            pass
        self.acks.flush()
        self.ledger.close()

    def _idle(self, poll: float) -> None:
        """Wait for a notification or the (jittered) poll interval, whichever is first."""
        self.wake.wait(poll * random.uniform(0.75, 1.25))
        self.wake.clear()

    def _one_recovered(self, rows: list[Any]) -> tuple[list[Any], Any]:
        """Decide, once per claim, which claimed rows run alone; return the rows to
        queue (those that may share first, then the one to run alone, if any) and that
        one (``None``: none, or one is held already). Other such rows are given back."""
        alone = [r for r in rows if was_recovered(r) and not may_share(r)]
        self.one_at_a_time = bool(alone)
        if not alone:  # the usual: no recovered row, or only rows that may share
            return rows, None
        keep = None if self.ledger.holds_recovered() else alone[0]
        back = alone if keep is None else alone[1:]
        if back:
            self.give_back(back)
        ids = {id(r) for r in alone}
        queue = [r for r in rows if id(r) not in ids]
        return (queue, None) if keep is None else ([*queue, keep], keep)

    def give_back(self, tasks: list[Any]) -> None:
        """Release claimed-but-unstarted recovered rows, keeping their recovered mark and
        uncharging the attempt: one statement per model, each row fenced on its claim
        token (a row this claim no longer holds is left as it is)."""
        by_model: dict[type[Model], list[Any]] = {}
        for task in tasks:
            by_model.setdefault(type(task), []).append(task)
        for model, rows in by_model.items():
            try:
                hit = give_back(model, rows, rows[0]._state.db or self.config.using)
            except DatabaseError as exc:
                close(self.config.using)
                logger.warning(
                    "could not give back tasks=%s model=%s worker=%s error=%s "
                    "(their leases will expire)",
                    len(rows),
                    model._meta.label,
                    self.worker_id,
                    one_line(exc),
                )
                continue
            logger.info(
                "recovered tasks=%s model=%s given back unstarted (attempt not charged): a row "
                "recovered from a dead worker near its last attempt may be what killed it, so "
                "each runs by itself, one at a time, in the next claims worker=%s",
                hit,
                model._meta.label,
                self.worker_id,
            )


class Budget:
    """``--max-tasks``: the rows one process may claim over its life (``None``: no
    limit); counted by its claimer alone."""

    def __init__(self, max_tasks: int | None) -> None:
        self.max_tasks = max_tasks
        self._reserved = 0

    def reserve(self, n: int) -> int:
        """Take up to ``n`` rows from the budget; return how many."""
        if self.max_tasks is None:
            return n
        n = max(0, min(n, self.max_tasks - self._reserved))
        self._reserved += n
        return n

    def unreserve(self, n: int) -> None:
        """Give back ``n`` reserved rows that were not claimed."""
        if self.max_tasks is not None:
            self._reserved -= n


def may_share(task: Any) -> bool:
    """Whether recovered ``task`` (claimed: its attempt is charged) may run beside other
    rows: if its process died now, of its own body or another's, it would still have two
    attempts left, one to run alone and one for an ordinary failure. A task that kills its
    worker every time thus uses its last attempts alone and ends ``failed``, and no other
    task is dead-lettered, nor left without a retry, by its crashes (docs/reaper.md)."""
    return int(task.attempts) <= get_options(task).max_attempts - 2
