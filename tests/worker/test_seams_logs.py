"""What the worker's log says about a failed attempt that will be retried."""

from __future__ import annotations

import signal

import pytest

from tests.support.helpers import wait_for
from tests.support.testapp.models import Document, Ledger
from tests.support.worker_handlers import ATTEMPT
from tests.support.worker_procs import WorkerProc, run_command, stop_all

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


# -- a lost claim is reported only when it was lost ----------------------------------------

LOST_WHILE_RUNNING = "claim lost while running"


@pytest.mark.slow
def test_a_plain_drain_logs_no_lost_claim():
    """``-p 2 -c 4 --batch 50``, no reaper, no operator, no other worker: every row is
    done at its first attempt and the log never says a claim was lost. A slow
    ``task_completed`` receiver leaves batched completions written on the database a
    while before their instances are updated, and the heartbeat beats every 20 ms, so
    renewals meet rows this worker has just completed: those are not lost claims."""
    n = 3000
    Document.objects.bulk_create([Document(title=str(i)) for i in range(n)])
    w = WorkerProc(
        "testapp.Document",
        "--burst",
        "-p",
        "2",
        "-c",
        "4",
        "--batch",
        "50",
        "--no-reap",
        settings={"TASKCLAIM_HEARTBEAT_INTERVAL": 0.02},
        claim_meta={"handler": "tests.support.slow_receiver.process_quietly"},
    )
    try:
        assert w.wait(300) == 0, w.stderr()[-3000:]
        err = w.stderr()
    finally:
        stop_all([w])
    assert Document.objects.filter(status="done", attempts=1).count() == n
    assert "claim lost" not in err, err[-3000:]


@pytest.mark.slow
def test_a_claim_reaped_by_another_process_is_still_reported_lost():
    """The same worker whose row was really taken: frozen (SIGSTOP) past its lease, the
    row reaped by the ``reaper`` command; woken up, it logs the claim lost while its
    body runs, and that attempt's completion lands nowhere."""
    doc = Document.objects.create(title="taken")
    settings = {"TASKCLAIM_HEARTBEAT_INTERVAL": 0.5, "TASKCLAIM_REAP_INTERVAL": 3600}
    meta = {"handler": "tests.support.worker_handlers.process_until_cancelled"}
    a = WorkerProc("testapp.Document", "--lease", "2", "--worker-id", "a", "--no-reap",
                   settings=settings, claim_meta=meta)  # fmt: skip
    procs = [a]
    try:
        wait_for(
            lambda: Ledger.objects.filter(task_id=doc.pk, worker=ATTEMPT + "a").exists(),
            timeout=60,
            what="worker a to start the body",
        )
        a.signal(signal.SIGSTOP)
        try:
            wait_for(lambda: Document.objects.expired().filter(pk=doc.pk).exists(),
                     timeout=30, what="the frozen worker's lease to end")  # fmt: skip
            reaped = run_command("reaper", "testapp.Document", "--once")
            assert reaped.returncode == 0, reaped.stderr
            assert Document.objects.filter(pk=doc.pk, status="ready").exists()
        finally:
            a.signal(signal.SIGCONT)
        wait_for(lambda: f"{LOST_WHILE_RUNNING} task=testapp.Document:{doc.pk}" in a.stderr(),
                 timeout=30, what="worker a to report its claim lost")  # fmt: skip
        # Its writes for that attempt are fenced out (it may have claimed the row again).
        wait_for(lambda: "its writes did not land" in a.stderr() or "nothing was written"
                 in a.stderr(), timeout=30, what="worker a's fenced write")  # fmt: skip
    finally:
        stop_all(procs)
    row = Document.objects.get(pk=doc.pk)
    assert not (row.status == "done" and row.attempts == 1), "the lost attempt completed"
