"""Fixtures of the workflow tests."""

from __future__ import annotations

import pytest

from tests.support.worker_procs import WorkerProc, stop_all


@pytest.fixture
def procs():
    """The worker processes a test starts (append them): stopped at its end, whatever
    happened."""
    started: list[WorkerProc] = []
    yield started
    stop_all(started)
