"""Every flow test starts and ends with this process's snapshot of the pauses dropped: a
flushed pause table must not be remembered as paused by the next test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from django_taskclaim.claim.paused import invalidate


@pytest.fixture(autouse=True)
def fresh_pause_snapshot() -> Iterator[None]:
    invalidate()
    yield
    invalidate()
