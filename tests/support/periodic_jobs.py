"""Functions and schedules of the periodic-work tests (``tests/periodic/test_periodic.py``).

Worker processes get :func:`declare`'s schedules through ``tests/support/testapp/periodic.py``,
which the scheduler's discovery imports, only when ``TASKCLAIM_T_PERIODIC`` is set: the
workers of other tests enqueue no periodic work.
"""

from __future__ import annotations

import os

from django_taskclaim.periodic import periodic
from tests.support.helpers import simulate_work
from tests.support.testapp.models import Ledger

#: The 1-second schedule of the end-to-end test.
TICK = "tests.tick"
ATTEMPT = "attempt:"


def tick(run):
    """EXACTLY ONCE per run: log the attempt, work for ``TASKCLAIM_T_PERIODIC_WORK``
    seconds (so a SIGKILL can land mid-run), then write the effect row and complete
    the run in one fenced transaction."""
    Ledger.objects.create(task_id=run.pk, token=run.version, worker=ATTEMPT + run.locked_by)
    simulate_work(float(os.environ.get("TASKCLAIM_T_PERIODIC_WORK", "0.3")))
    with run.fenced(complete=True):
        Ledger.objects.create(task_id=run.pk, token=run.version, worker=run.locked_by)


def nightly():
    """A function taking no argument; what it returns is kept as the run's result."""
    return {"rows": 3}


async def async_job(run):
    """An ``async def`` periodic function taking the run."""
    return f"async {run.schedule}"


def broken():
    """A periodic function that raises."""
    raise RuntimeError("nightly job broke")


def declare() -> None:
    """Register the end-to-end schedule: every second, catching up missed slots."""
    periodic(every=1, name=TICK, missed="catch_up")(tick)
