"""Handlers used by the worker tests (selected through ``tests.worker_entry``)."""

from __future__ import annotations

import os
import signal
import time

from tests.testapp.models import Ledger

ATTEMPT = "attempt:"


def process_atomic(task):
    """Log the attempt, act on the payload, then write the ledger row and complete the
    task in ONE fenced transaction: the side effect commits exactly when the task does.

    Attempt rows (``worker`` starting with ``attempt:``) record when each claim started
    running, on the database clock (``Ledger.at``).
    """
    Ledger.objects.create(task_id=task.pk, token=task.version, worker=ATTEMPT + task.locked_by)
    payload = task.payload or {}
    if payload.get("kill"):
        os.kill(os.getpid(), signal.SIGKILL)
    if payload.get("sleep"):
        deadline = time.monotonic() + float(payload["sleep"])
        while time.monotonic() < deadline:
            time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
    with task.fenced():
        Ledger.objects.create(task_id=task.pk, token=task.version, worker=task.locked_by)
        task.complete(result=f"processed {task.pk}")


def process_quietly(task):
    """Do nothing and return no result fields: the worker may batch the completion."""
    return None


def process_logged_quietly(task):
    """Log the attempt, sleep as the payload says, return no result fields."""
    Ledger.objects.create(task_id=task.pk, token=task.version, worker=ATTEMPT + task.locked_by)
    seconds = float((task.payload or {}).get("sleep", 0))
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
    return None
