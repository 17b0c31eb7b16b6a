"""What the worker's log says about a failed attempt that will be retried."""

from __future__ import annotations

import pytest

from tests.support.testapp.models import Document
from tests.support.worker_procs import WorkerProc, stop_all

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_failed_attempt_that_will_be_retried_says_so():
    """Not ``task ready … attempt=1`` (which reads like success): the attempt, the
    budget, when it runs again and why."""
    doc = Document.objects.create(title="flaky", payload={"raise": "boom"})
    w = WorkerProc(
        "testapp.Document",
        "--burst",
        settings={"TASKCLAIM_RETRY_BACKOFF": 0.05, "TASKCLAIM_MAX_ATTEMPTS": 3},
    )
    try:
        assert w.wait(120) == 0, w.stderr()[-3000:]
        err = w.stderr()
        assert f"task failed, will retry task=testapp.Document:{doc.pk} (attempt 1/3) in " in err
        assert "boom" in err.split("will retry", 1)[1].splitlines()[0]
        assert f"task ready task=testapp.Document:{doc.pk}" not in err
    finally:
        stop_all([w])
