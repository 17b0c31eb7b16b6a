"""Giving rows back: claimed-but-unstarted rows released at once (attempt not counted),
running rows requeued when the grace period runs out (attempt counted), and the
notification that wakes other workers for them."""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterable
from typing import Any

from django.db import DatabaseError
from django.db.models import Model

from django_taskclaim.exceptions import ClaimLost
from django_taskclaim.wakeup.notify import notify
from django_taskclaim.worker.dbconn import close
from django_taskclaim.worker.ledger import Ledger
from django_taskclaim.worker.service import one_line

logger = logging.getLogger("django_taskclaim.worker")


class Handback:
    def __init__(self, ledger: Ledger, *, using: str, worker_id: str) -> None:
        self.ledger = ledger
        self.using = using
        self.worker_id = worker_id

    def release(self, tasks: Iterable[Any]) -> int:
        """Give claimed-but-unstarted rows back (attempt not counted); return how many."""
        done = 0
        touched: set[type[Model]] = set()
        for task in tasks:
            try:
                task.release()
                done += 1
                touched.add(type(task))
            except ClaimLost:
                pass
            except DatabaseError as exc:
                logger.warning(
                    "could not release task=%s:%s worker=%s error=%s (its lease will expire)",
                    type(task)._meta.label,
                    task.pk,
                    self.worker_id,
                    one_line(exc),
                )
                close(self.using)
        if done:
            logger.info("released unstarted tasks=%s worker=%s", done, self.worker_id)
            self.notify_ready(touched)
        return done

    def requeue_running(self) -> None:
        """After the grace period: give running rows back (this attempt counts)."""
        running = [copy.copy(t) for t in self.ledger.running()]
        for task in running:
            label = type(task)._meta.label
            logger.warning(
                "grace period over, task still running task=%s:%s attempt=%s worker=%s: requeued",
                label,
                task.pk,
                task.attempts,
                self.worker_id,
            )
            try:
                task.retry(delay=0, error=f"worker {self.worker_id} stopped after its grace period")
            except ClaimLost:
                pass
            except DatabaseError as exc:
                logger.warning(
                    "could not requeue task=%s:%s error=%s", label, task.pk, one_line(exc)
                )
        self.notify_ready({type(t) for t in running})

    def notify_ready(self, touched: Iterable[type[Model]]) -> None:

        for model in touched:
            try:
                notify(model, using=self.using)
            except DatabaseError:
                close(self.using)
