"""Waiting for an event (docs/workflows.md, "Waiting for an event"): a body parks its row
until ``emit(name, payload)``; an event emitted before the wait is not lost; the first
emit wins; a rolled-back emit never happened; past its deadline the wait raises
``EventTimeout`` in the body; emit and wait racing on real connections never lose the
wake-up."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.conf import settings
from django.db import connection, transaction
from django.db.models import F
from django.db.models.functions import Now

from django_taskclaim import EventTimeout, emit, run_task
from django_taskclaim.models import TaskEvent, TaskEventWait
from tests.support.helpers import wait_for
from tests.support.testapp.models import Document, Job
from tests.support.worker_procs import WorkerProc

pytestmark = pytest.mark.django_db(transaction=True)


def waits_for(name: str, timeout: float = 60):
    def body(task):
        return {"result": f"got {task.wait_for_event(name, timeout)}"}

    return body


def due_in(pk) -> timedelta:
    return (
        Document.objects.annotate(due=F("run_after") - Now())
        .values_list("due", flat=True)
        .get(pk=pk)
    )


def test_a_wait_parks_the_row_and_the_emit_makes_it_due_with_the_payload():
    doc = Document.objects.create(title="t")
    task = Document.objects.claim_next()
    claimed = task.version
    assert run_task(task, waits_for("approved")) == "ready"
    row = Document.objects.get(pk=doc.pk)
    assert (row.status, row.attempts, row.version) == ("ready", 0, claimed + 1)
    assert timedelta(seconds=55) < due_in(doc.pk) <= timedelta(seconds=60)
    assert Document.objects.claim_next() is None  # parked
    assert emit("approved", {"by": "ann"}) is True
    assert due_in(doc.pk) <= timedelta(0)
    again = Document.objects.claim_next()
    assert again is not None
    assert run_task(again, waits_for("approved")) == "done"
    assert Document.objects.get(pk=doc.pk).result == "got {'by': 'ann'}"
    assert not TaskEventWait.objects.exists()  # the wait is over


def test_an_event_emitted_before_the_wait_is_not_lost():
    assert emit("early", [1, 2]) is True
    Document.objects.create(title="t")
    task = Document.objects.claim_next()
    assert run_task(task, waits_for("early")) == "done"  # never parked
    assert Document.objects.get().result == "got [1, 2]"


def test_the_first_emit_wins():
    assert emit("once", "first") is True
    assert emit("once", "second") is False
    assert TaskEvent.objects.get(name="once").payload == "first"


def test_a_rolled_back_emit_never_happened():
    Document.objects.create(title="t")
    run_task(Document.objects.claim_next(), waits_for("maybe"))

    def request() -> None:
        with transaction.atomic():
            emit("maybe", 1)
            raise RuntimeError("the request failed")

    with pytest.raises(RuntimeError):
        request()
    assert TaskEvent.objects.get(name="maybe").emitted_at is None
    assert due_in(Document.objects.get().pk) > timedelta(seconds=50)


def test_past_its_deadline_the_wait_raises_in_the_body_which_may_catch_it():
    Document.objects.create(title="t")
    seen: list[str] = []

    def body(task):
        try:
            task.wait_for_event("never", 60)
        except EventTimeout as exc:
            seen.append(str(exc))
            return {"result": "went on without it"}
        return None

    assert run_task(Document.objects.claim_next(), body) == "ready"
    TaskEventWait.objects.update(deadline=Now() - timedelta(seconds=1))  # time passes
    Document.objects.update(run_after=Now())
    assert run_task(Document.objects.claim_next(), body) == "done"
    assert seen == ["event 'never' was not emitted within 60s"]
    assert not TaskEventWait.objects.exists()


def test_a_model_without_run_after_cannot_wait_and_says_why():
    Job.objects.create(name="j")
    task = Job.objects.claim_next()
    assert run_task(task, waits_for("x")) == "ready"  # retried as an error
    assert "has no run_after field" in Job.objects.get().last_error


@pytest.mark.parametrize("name", ["", "x" * 192, 3])
def test_a_bad_event_name_is_refused(name):
    with pytest.raises(ValueError, match="an event name is a non-empty text"):
        emit(name)


def test_a_payload_that_is_not_json_is_refused():
    with pytest.raises(TypeError, match="the payload is not JSON"):
        emit("x", object())
    assert not TaskEvent.objects.filter(name="x").exclude(emitted_at=None).exists()


@pytest.mark.skipif(settings.DB_VENDOR == "sqlite", reason="SQLite has one writer")
def test_an_emit_racing_a_wait_never_loses_the_wake_up():
    """Emit and wait on two real connections, released together, 30 times: either the
    body got the payload without parking, or its parked row is due at once."""
    for i in range(30):
        doc = Document.objects.create(title=f"r{i}")
        task = Document.objects.filter(pk=doc.pk).claim_next()
        waited = _race(lambda t=task, n=f"race-{i}": run_task(t, waits_for(n)),
                       lambda n=f"race-{i}": emit(n, "go"))  # fmt: skip
        if waited == "done":
            continue
        assert waited == "ready"
        assert due_in(doc.pk) <= timedelta(seconds=1), f"round {i}: the wake-up was lost"


def _lock_waits() -> int:
    """Sessions of this database now waiting for a lock (MariaDB: on the event table)."""
    sql = (
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
        "AND datname = current_database()"
        if connection.vendor == "postgresql"
        # MariaDB: a statement on the event table running for half a second is blocked
        # (INNODB_TRX does not always show the wait of an INSERT IGNORE on a duplicate)
        else "SELECT count(*) FROM information_schema.PROCESSLIST WHERE db = DATABASE() "
        "AND info LIKE '%%taskclaim_taskevent%%' AND time_ms > 500"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql)
        return int(cursor.fetchone()[0])


@pytest.mark.skipif(settings.DB_VENDOR == "sqlite", reason="SQLite has one writer")
@pytest.mark.parametrize("awaited_before", [False, True], ids=["first-wait", "awaited-before"])
def test_an_emit_during_an_uncommitted_wait_waits_for_it_and_wakes_the_row(awaited_before):
    """The interleaving that loses a wake-up, made on purpose: the wait has parked its row
    but not committed when the emit runs. The emit must wait for the wait's lock and then
    wake the row (a design where the emit does not meet the wait at a lock would read no
    waiter, commit, and leave the row parked for its whole timeout)."""
    from django_taskclaim import Parked

    if awaited_before:  # another row waited for it earlier: its event row exists
        TaskEvent.objects.create(name="held")
    doc = Document.objects.create(title="t")
    task = Document.objects.filter(pk=doc.pk).claim_next()
    parked, go = threading.Event(), threading.Event()
    sent: dict[str, object] = {}

    def waiter() -> None:
        try:
            with transaction.atomic():
                with pytest.raises(Parked):
                    task.wait_for_event("held", 60)
                parked.set()
                go.wait(timeout=60)  # commits when the test says so
        finally:
            connection.close()

    def emitter() -> None:
        try:
            sent["ok"] = emit("held", "go")
        finally:
            connection.close()

    first = threading.Thread(target=waiter)
    first.start()
    assert parked.wait(timeout=30)
    second = threading.Thread(target=emitter)
    second.start()
    wait_for(lambda: not second.is_alive() or _lock_waits() > 0, timeout=30,
             what="the emit done, or waiting for the wait's lock")  # fmt: skip
    go.set()
    first.join(timeout=60)
    second.join(timeout=60)
    assert sent == {"ok": True}
    assert due_in(doc.pk) <= timedelta(seconds=1), "the wake-up was lost"


def _race(wait, send) -> object:
    """Run ``wait`` and ``send`` on two threads (two connections), released together;
    return what ``wait`` returned."""
    barrier = threading.Barrier(2)
    out: dict[str, object] = {}

    def run(key, call) -> None:
        try:
            barrier.wait(timeout=30)
            out[key] = call()
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=("wait", wait)),
               threading.Thread(target=run, args=("send", send))]  # fmt: skip
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert set(out) == {"wait", "send"}, "a side of the race failed"
    return out["wait"]


def test_a_worker_runs_parked_rows_once_their_events_are_emitted(procs):
    rows = [Document.objects.create(title=f"e{i}") for i in range(3)]
    w = WorkerProc(
        "testapp.Document", "--poll", "0.2",
        claim_meta={"handler": "tests.support.worker_handlers.process_after_event"},
    )  # fmt: skip
    procs.append(w)
    wait_for(lambda: TaskEventWait.objects.count() == 3, timeout=60, what="three rows parked")
    assert not Document.objects.filter(status="done").exists()
    for row in rows:
        assert emit(f"go:{row.pk}", row.pk) is True
    wait_for(lambda: Document.objects.filter(status="done").count() == 3, timeout=60,
             what="every row done after its event")  # fmt: skip
    assert w.stop() == 0, w.stderr()[-2000:]
    for row in rows:
        done = Document.objects.get(pk=row.pk)
        assert (done.result, done.attempts) == (f"got {row.pk}", 1)


def test_the_admin_page_of_a_parked_row_names_its_event(admin_client):
    from django.urls import reverse

    doc = Document.objects.create(title="t")
    run_task(Document.objects.claim_next(), waits_for("approved:7"))
    page = admin_client.get(reverse("admin:testapp_document_change", args=[doc.pk]))
    text = page.content.decode()
    assert "Waiting for event" in text
    assert "<code>approved:7</code> (until " in text
    emit("approved:7")
    run_task(Document.objects.claim_next(), waits_for("approved:7"))
    done = admin_client.get(reverse("admin:testapp_document_change", args=[doc.pk]))
    assert "Waiting for event" not in done.content.decode()
