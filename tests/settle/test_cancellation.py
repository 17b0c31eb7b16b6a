"""Cooperative cancellation: a running body learns that its claim was taken back.

Real worker subprocesses; the cancel, the release and every check come from this
process, on its own connection. Delays are measured on the database clock: from just
before the cancel to the ledger row the body writes when it notices.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from django_taskclaim.db import db_now
from django_taskclaim.recovery.reap import release_worker
from tests.support.asyncapp.models import AsyncDocument, Mark
from tests.support.helpers import wait_for
from tests.support.testapp.models import Document, Ledger
from tests.support.worker_handlers import ATTEMPT, NOTICED
from tests.support.worker_procs import WorkerProc, stop_all

pytestmark = pytest.mark.django_db(transaction=True)

BEAT = 0.5  # TASKCLAIM_HEARTBEAT_INTERVAL in these workers
MARGIN = 1.5  # seconds allowed beyond one heartbeat interval (a loaded machine)
SETTINGS = {"TASKCLAIM_HEARTBEAT_INTERVAL": BEAT, "TASKCLAIM_REAP_INTERVAL": 3600}


@pytest.fixture
def procs(transactional_db):
    started: list[WorkerProc] = []
    yield started
    stop_all(started)


def start(procs, *args, handler=None, **kwargs) -> WorkerProc:
    meta = {"handler": handler} if handler else None
    w = WorkerProc(*args, settings=SETTINGS, claim_meta=meta, **kwargs)
    procs.append(w)
    return w


def started(pk, w: WorkerProc) -> Ledger:
    try:
        return wait_for(
            lambda: Ledger.objects.filter(task_id=pk, worker__startswith=ATTEMPT).first(),
            timeout=60,
            what="the body to start",
        )
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{w.stderr()[-3000:]}") from None


def noticed(pk) -> Ledger:
    return wait_for(
        lambda: Ledger.objects.filter(task_id=pk, worker__startswith=NOTICED).first(),
        timeout=30,
        what="the body to notice its cancellation",
    )


def snapshot(model, pk):
    return model.objects.filter(pk=pk).values(
        "status", "version", "attempts", "last_error", "finished_at", "locked_by", "result"
    )[0]


@pytest.mark.slow
@pytest.mark.parametrize(
    "handler",
    [
        "tests.support.worker_handlers.process_until_cancelled",  # polls task.cancel_requested()
        "tests.support.worker_handlers.process_until_cancel_event",  # waits on `cancel`
        "tests.support.worker_handlers.process_async_until_cancelled",  # gets CancelledError
    ],
)
def test_a_cancelled_body_stops_within_a_heartbeat_and_writes_nothing(procs, handler):
    doc = Document.objects.create(title="long")
    w = start(procs, "testapp.Document", handler=handler)
    started(doc.pk, w)
    before = db_now()
    assert Document.objects.filter(pk=doc.pk).cancel() == 1
    after_cancel = snapshot(Document, doc.pk)
    assert after_cancel["status"] == "cancelled"
    seen = noticed(doc.pk)
    delay = (seen.at - before).total_seconds()
    assert delay < BEAT + MARGIN, f"noticed {delay:.2f}s after the cancel"
    # Its outcome is fenced out: reported as lost, the row exactly as the cancel left it.
    wait_for(lambda: "claim lost" in w.stderr(), timeout=30, what="the lost-claim report")
    quick = Document.objects.create(title="next", payload={"quick": True})
    wait_for(lambda: Document.objects.done().filter(pk=quick.pk).exists(), timeout=60,
             what="the worker to go on with the next row")  # fmt: skip
    assert snapshot(Document, doc.pk) == after_cancel
    assert w.alive()
    assert w.stop() == 0, w.stderr()
    assert snapshot(Document, doc.pk) == after_cancel
    assert "Traceback" not in w.stderr()


def test_an_async_body_gets_cancelled_error_when_its_row_is_cancelled(procs):
    doc = AsyncDocument.objects.create(payload={"sleep": 60})
    w = start(procs, "asyncapp.AsyncDocument")
    wait_for(lambda: Mark.objects.filter(task_id=doc.pk, kind="start").exists(), timeout=60,
             what="the async body to start")  # fmt: skip
    before = db_now()
    assert AsyncDocument.objects.filter(pk=doc.pk).cancel() == 1
    after_cancel = snapshot(AsyncDocument, doc.pk)
    seen = wait_for(
        lambda: Mark.objects.filter(task_id=doc.pk, kind="cancelled").first(),
        timeout=30,
        what="CancelledError in the body",
    )
    delay = (seen.at - before).total_seconds()
    assert delay < BEAT + MARGIN, f"cancelled {delay:.2f}s after the cancel"
    wait_for(lambda: "claim lost" in w.stderr(), timeout=30, what="the lost-claim report")
    assert w.stop() == 0, w.stderr()
    assert snapshot(AsyncDocument, doc.pk) == after_cancel
    assert not Mark.objects.filter(task_id=doc.pk, kind="end").exists()


@pytest.mark.slow
def test_a_release_by_an_operator_sets_the_flag_too(procs):
    """Any lost claim sets it: here the operator releases the worker's rows. The row
    goes back to ready (the release's doing), never done, never failed by the body."""
    doc = Document.objects.create(title="long")
    w = start(
        procs,
        "testapp.Document",
        "--max-tasks",
        "1",
        "--worker-id",
        "w-release",
        handler="tests.support.worker_handlers.process_until_cancelled",
    )
    started(doc.pk, w)
    before = db_now()
    assert release_worker("w-release", Document).requeued == 1
    after_release = snapshot(Document, doc.pk)
    assert after_release["status"] == "ready"
    delay = (noticed(doc.pk).at - before).total_seconds()
    assert delay < BEAT + MARGIN, f"noticed {delay:.2f}s after the release"
    assert w.wait(60) == 0, w.stderr()  # --max-tasks 1: it ends once that row settled
    assert snapshot(Document, doc.pk) == after_release


def test_cancel_requested_outside_a_worker_asks_the_database_on_request():
    Document.objects.create(title="x")
    (task,) = Document.objects.claim(1)
    assert task.cancel_requested() is False
    assert task.cancel_requested(check=True) is False  # still held
    Document.objects.filter(pk=task.pk).cancel()
    assert task.cancel_requested() is False  # no heartbeat here: nothing told it
    assert task.cancel_requested(check=True) is True
    assert task.cancel_requested() is True  # and it stays so
    assert before_after_unchanged(task)


def before_after_unchanged(task) -> bool:
    """A fenced write of the cancelled claim lands nowhere."""
    from django_taskclaim.exceptions import ClaimLost

    row = snapshot(Document, task.pk)
    with pytest.raises(ClaimLost):
        task.complete(result="late")
    return snapshot(Document, task.pk) == row


@pytest.mark.slow
def test_cancel_timings_are_reported(procs, record_property):
    """The delay from cancel to the body noticing, five times, on the database clock."""
    w = start(
        procs, "testapp.Document", handler="tests.support.worker_handlers.process_until_cancelled"
    )
    delays = []
    for i in range(5):
        doc = Document.objects.create(title=f"t{i}")
        started(doc.pk, w)
        before = db_now()
        Document.objects.filter(pk=doc.pk).cancel()
        delays.append((noticed(doc.pk).at - before) / timedelta(seconds=1))
    assert w.stop() == 0, w.stderr()
    record_property("cancel_delays", delays)
    print(f"cancel → noticed (heartbeat {BEAT}s): {', '.join(f'{d:.2f}s' for d in delays)}")
    assert max(delays) < BEAT + MARGIN
