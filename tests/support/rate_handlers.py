"""Task bodies of the rate-limit tests (tests/flow/test_rate_limits_ledger.py)."""

from __future__ import annotations

from typing import Any

from tests.support.helpers import simulate_work
from tests.support.keyedapp.models import KeyRun


def record_start(task: Any) -> None:
    """Record this attempt's start at once (committed before the body goes on, so a
    killed attempt stays recorded): its task, claim token, holder and the lease end its
    claim wrote (claim time + lease, database clock). Then 20 ms of work."""
    KeyRun.objects.create(
        model=task._meta.model_name,
        key=None,
        task_id=task.pk,
        token=task.version,
        worker=task.locked_by or "",
        claimed_until=task.locked_until,
    )
    simulate_work(0.02)
