"""Handlers of ``testapp.Document`` for the deadline tests (set with ``ClaimMeta.handler``
through ``tests.support.worker_entry``)."""

from __future__ import annotations


def honour_flag(task, cancel) -> None:
    """Wait for the cancellation flag (at most 60 s), then return as if done."""
    cancel.wait(60)
