"""The heartbeat never waits behind an outcome write, and an outcome the database refuses
fails its own row only.

Real worker processes on a real database. A web request's ``select_for_update()`` holds
one finished task's row while its outcome write waits: the leases of the process's other
rows must still be renewed (no second start of a running task), and the finished task
settles once the lock goes. A task whose result cannot be stored (a lone surrogate, a NUL
character) fails for good with a clear ``last_error``; its batch-mates complete, each run
exactly once, and the worker keeps running.
"""

from __future__ import annotations

import threading

import pytest
from django.conf import settings
from django.db import connections, transaction

from tests.support.helpers import simulate_work, wait_for
from tests.support.testapp.models import Document, Ledger
from tests.support.worker_handlers import ATTEMPT, NOTICED
from tests.support.worker_procs import WorkerProc, stop_all

pytestmark = pytest.mark.django_db(transaction=True)

HOSTILE = "tests.support.worker_handlers.process_hostile"
FAST = {"TASKCLAIM_REAP_INTERVAL": 0.3, "TASKCLAIM_RETRY_BACKOFF": 0.05}


@pytest.fixture
def procs(transactional_db):
    started: list[WorkerProc] = []
    yield started
    stop_all(started)


def attempts(pk) -> list[Ledger]:
    return list(Ledger.objects.filter(task_id=pk, worker__startswith=ATTEMPT).order_by("at"))


@pytest.mark.slow
@pytest.mark.skipif(
    settings.DB_VENDOR == "sqlite", reason="SQLite has no row locks (it locks the whole file)"
)
@pytest.mark.parametrize("ack_window", ["0", "0.5"])
def test_a_row_locked_by_a_web_request_never_starves_the_other_leases(procs, ack_window):
    """Worker A (2 executors, lease 6 s, heartbeat 2 s) runs X (14 s) and Y (2 s); a web
    request holds Y's row ``FOR UPDATE`` for 12 s while Y's outcome write waits on it.
    Worker B reaps every 0.3 s. X's lease must be renewed all along: X starts once, and
    Y is done once the lock goes."""
    x = Document.objects.create(title="X long", payload={"sleep": 14})
    y = Document.objects.create(title="Y short", payload={"sleep": 2})
    args = ("--concurrency", "2", "--batch", "1", "--lease", "6", "--ack-window", ack_window)
    a = WorkerProc("testapp.Document", *args, settings=FAST, claim_meta={"handler": HOSTILE})
    procs.append(a)
    wait_for(lambda: attempts(y.pk) and attempts(x.pk), timeout=60, what="A to start X and Y")

    locked = threading.Event()
    failure: list[BaseException] = []
    y_state: list[str] = []

    def web_request() -> None:
        """Holds Y's row 12 s (a slow request's work): Y's body ends 2 s after its start
        and its outcome write then waits; two leases of X without a renewal would lapse."""
        try:
            with transaction.atomic():
                list(Document.objects.select_for_update().filter(pk=y.pk))
                locked.set()
                simulate_work(12)
                y_state.append(Document.objects.get(pk=y.pk).status)
        except BaseException as exc:  # pragma: no cover - reported below
            failure.append(exc)
            locked.set()
        finally:
            connections.close_all()

    holder = threading.Thread(target=web_request)
    holder.start()
    assert locked.wait(30)
    b = WorkerProc("testapp.Document", "--lease", "6", settings=FAST)
    procs.append(b)
    holder.join(60)
    assert not failure, failure
    assert y_state == ["processing"]  # Y's outcome write was waiting on the lock
    wait_for(
        lambda: Document.objects.get(pk=y.pk).status == "done",
        timeout=30,
        what="Y's waiting outcome write to land once the lock went",
    )
    wait_for(lambda: Document.objects.get(pk=x.pk).status == "done", timeout=60, what="X to end")
    logs = f"A:\n{a.stderr()[-3000:]}\nB:\n{b.stderr()[-3000:]}"
    assert len(attempts(x.pk)) == 1, f"X was started again while A was still running it\n{logs}"
    assert len(attempts(y.pk)) == 1, logs
    assert a.alive()
    assert b.alive()


@pytest.mark.parametrize("plain", [False, True], ids=["batched", "plain"])
@pytest.mark.parametrize(
    "poison",
    [
        pytest.param("surrogate", id="lone-surrogate"),
        pytest.param("nul", id="nul"),
    ],
)
def test_an_unstorable_result_fails_its_row_alone(procs, poison, plain):
    """Five good tasks and one whose result field cannot be stored, in one batch with a
    1 s ack window (batched completion, or the plain fenced completion of a returned
    mapping): the poison row fails for good with a clear error, the five complete, every
    body runs exactly once, and the worker stays up."""
    if settings.DB_VENDOR != "postgresql" and poison == "nul":
        pytest.skip("only PostgreSQL refuses NUL characters in text")
    good = [Document.objects.create(title=f"good {i}", payload={"plain": plain}) for i in range(5)]
    bad = Document.objects.create(title="poison", payload={"poison": poison, "plain": plain})
    w = WorkerProc(
        "testapp.Document",
        "--batch",
        "10",
        "--ack-window",
        "1",
        "--lease",
        "5",
        settings=FAST,
        claim_meta={"handler": "tests.support.worker_handlers.process_with_result"},
    )
    procs.append(w)
    wait_for(
        lambda: Document.objects.get(pk=bad.pk).status == "failed",
        timeout=60,
        what=f"the poison row to fail\n{w.stderr()[-3000:]}",
    )
    wait_for(
        lambda: Document.objects.filter(pk__in=[d.pk for d in good], status="done").count() == 5,
        timeout=60,
        what=f"the five good rows to complete\n{w.stderr()[-3000:]}",
    )
    row = Document.objects.get(pk=bad.pk)
    assert "could not be stored" in row.last_error
    assert w.alive(), w.stderr()[-3000:]
    assert "claimer crashed" not in w.stderr()
    assert Document.objects.filter(pk__in=[d.pk for d in good], result="fine").count() == 5
    w.stop()
    for doc in [*good, bad]:
        assert len(attempts(doc.pk)) == 1, doc.title


@pytest.mark.slow
@pytest.mark.skipif(
    settings.DB_VENDOR == "sqlite", reason="SQLite has no row locks (it locks the whole file)"
)
def test_a_lease_that_cannot_be_renewed_stops_its_body_before_it_lapses(procs):
    """A web request holds a running task's row locked longer than its lease: the
    heartbeat cannot renew it, so the body is told to stop (cancellation flag) before
    the lease it holds can lapse, on the database clock."""
    task = Document.objects.create(title="long")
    w = WorkerProc(
        "testapp.Document",
        "--lease",
        "6",
        settings=FAST,
        claim_meta={"handler": "tests.support.worker_handlers.process_until_cancelled"},
    )
    procs.append(w)
    wait_for(lambda: attempts(task.pk), timeout=60, what="the task to start")
    with transaction.atomic():  # read committed: each read sees the body's new rows
        list(Document.objects.select_for_update().filter(pk=task.pk))
        # No renewal can land from now on: the lease ends where it stands.
        seen = wait_for(
            lambda: list(Ledger.objects.filter(task_id=task.pk, worker__startswith=NOTICED)),
            timeout=30,
            what=f"the body to see its cancellation flag\n{w.stderr()[-3000:]}",
        )
        lease_end = Document.objects.get(pk=task.pk).locked_until
    assert seen[0].at < lease_end, (seen[0].at, lease_end)
    assert "lease not renewed" in w.stderr()
