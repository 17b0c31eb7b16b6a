"""A handler for worker subprocesses whose import connects a slow ``task_completed``
receiver (a metrics call that takes 2 ms per row, say): the rows of a batched completion
are then written on the database well before their instances are all updated in the
worker. Only the worker process that resolves :func:`process_quietly` imports it."""

from __future__ import annotations

from typing import Any

from django_taskclaim.signals import task_completed
from tests.support.helpers import simulate_work

#: Seconds the receiver spends on each completed row.
RECEIVER_COST = 0.002


def _slow_receiver(sender: Any, task: Any, **kwargs: Any) -> None:
    simulate_work(RECEIVER_COST)


task_completed.connect(_slow_receiver, dispatch_uid="tests.support.slow_receiver")


def process_quietly(task: Any) -> None:
    """Return no result fields: the worker may batch the completion."""
    return None
