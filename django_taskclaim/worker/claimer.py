"""The claimer: the one thread of a process that claims rows, for all its executors.

One claim statement per round trip, however many executor threads the process runs, so
concurrent claimers grow with processes, not with processes × threads. The size of each
claim follows the executors' demand (:meth:`~.ledger.Ledger.room`): a full ``--batch``
per executor once it fits, else just what idle executors need, never more than
``--concurrency`` × ``--batch`` rows held. Models are claimed from in rotation.

A recovered row (its last holder lost it: :func:`~django_taskclaim.strategies.was_recovered`)
may be the task that killed a worker: the process holds at most one at a time, queued
after the rest of its claim, and claims nothing more until it has settled (it then runs
alone: see :meth:`~.ledger.Ledger.wait_alone`); further recovered rows are given back
unstarted at once (attempt not charged, still marked recovered), each to get its own
turn.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable
from typing import Any

from django.db import DatabaseError, connections
from django.db.models import F, Model

from ..options import get_options
from ..strategies import was_recovered
from .acks import Acks
from .config import WorkerConfig
from .dbconn import backoff, close, drop_stale, one_line, pause
from .ledger import Ledger

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
        self.wake = threading.Event()  # a notification: rows may be ready
        self.claims = 0  # claim statements made (for tests and stats)
        self.crashed = False

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
        failures = 0
        poll = self.config.poll
        while not self.stopping.is_set():
            room = self.ledger.wait_for_room(poll)
            if self.stopping.is_set() or self.ledger.closed:
                return
            if not room:
                continue
            want = self.ledger.reserve(room)
            if not want:  # --max-tasks claimed: end once the last one settles
                self._finish()
                return
            # Rows in flight while this claim runs may be made ready again meanwhile (a
            # retry written as an executor settles): an empty claim ends a burst only if
            # nothing was in flight when it started.
            busy = self.ledger.in_flight()
            drop_stale()  # dead since an outage another thread saw: reconnect, not fail
            try:
                rows = self._claim(models, turn, want)
                turn += 1
            except DatabaseError as exc:
                self.ledger.unreserve(want)
                failures += 1
                close(self.config.using)
                delay = backoff(failures, self.config.using)
                log = logger.warning if failures == 1 else logger.debug
                log(
                    "database error during claim worker=%s error=%s retry_in=%.1fs",
                    self.worker_id,
                    one_line(exc),
                    delay,
                )
                # Cut short by a notification, a stop, or any thread reconnecting.
                pause(delay, self.wake, self.config.using)
                continue
            if failures:
                logger.info("database reachable again worker=%s", self.worker_id)
                failures = 0
            self.ledger.unreserve(want - len(rows))
            if rows:
                rows = self._one_recovered(rows)
                if not self.ledger.add_claimed(rows):  # stopped meanwhile: give them back
                    self.release(rows)
                continue
            self.acks.flush()  # nothing to claim: no reason to keep completions waiting
            if self.config.burst:
                if busy or self.ledger.in_flight():
                    # They may retry: once they have all settled, one last look.
                    while not self.stopping.is_set() and not self.ledger.wait_until_idle(poll):
                        pass
                    continue
                if not (self.config.until_empty and self.work_left()):
                    self._finish()
                    return
            self._idle(poll)

    def _claim(self, models: list[type[Model]], turn: int, want: int) -> list[Any]:
        """Claim from the first model (in rotation) that has ready rows."""
        for i in range(len(models)):
            model = models[(turn + i) % len(models)]
            rows = self.queryset(model).claim(
                want, lease=self.config.lease_for(model), worker=self.worker_id
            )
            self.claims += 1
            if rows:
                return rows
        return []

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

    def _one_recovered(self, rows: list[Any]) -> list[Any]:
        recovered = [r for r in rows if was_recovered(r)]
        if not recovered:
            return rows
        keep = [] if self.ledger.holds_recovered() else recovered[:1]
        extra = [r for r in recovered if r not in keep]
        if extra:
            self.give_back(extra)
        return [r for r in rows if not was_recovered(r)] + keep

    def give_back(self, tasks: list[Any]) -> None:
        """Release claimed-but-unstarted recovered rows, keeping their recovered mark and
        uncharging the attempt (fenced on the claim token)."""
        for task in tasks:
            opts = get_options(task)
            try:
                hit = (
                    type(task)
                    ._base_manager.using(task._state.db or self.config.using)
                    .filter(pk=task.pk, version=task.version)
                    .filter(opts.status_q("processing"))
                    .update(
                        **{
                            opts.status_field: opts.value("ready"),
                            "version": F("version") + 1,
                            "attempts": F("attempts") - 1,
                        }
                    )
                )
            except DatabaseError as exc:
                close(self.config.using)
                hit = 0
                logger.warning(
                    "could not give back task=%s:%s worker=%s error=%s (its lease will expire)",
                    type(task)._meta.label,
                    task.pk,
                    self.worker_id,
                    one_line(exc),
                )
            if hit:
                logger.info(
                    "recovered task=%s:%s given back to run alone worker=%s",
                    type(task)._meta.label,
                    task.pk,
                    self.worker_id,
                )
