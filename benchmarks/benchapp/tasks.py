"""The ``django.tasks`` function the backend benchmark enqueues."""

from __future__ import annotations

from django.tasks import task


@task
def noop(n: int) -> int:
    """Does nothing; returns its argument (so a return value is stored)."""
    return n
