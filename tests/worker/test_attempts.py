"""Each attempt's story: real worker processes record every attempt of a row that did not
end done (``TASKCLAIM_ATTEMPT_LOG = "errors"``, the default), or every attempt
(``"all"``), in ``taskclaim.TaskAttempt`` — worker, start by the database clock, runtime,
outcome, error — keep the last ``TASKCLAIM_ATTEMPTS_KEPT`` per row, and the task's admin
page shows them."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db.models import QuerySet
from django.urls import reverse

from django_taskclaim.db import db_now
from django_taskclaim.models import TaskAttempt
from django_taskclaim.worker.attempts import AttemptJournal
from tests.support.testapp.models import Document
from tests.support.worker_procs import WorkerProc, stop_all

pytestmark = pytest.mark.django_db(transaction=True)

#: Retries at once: the story of three attempts in well under a second.
QUICK = {"max_attempts": 3, "retry_backoff": 0.0, "retry_jitter": 0.0}


@pytest.fixture
def procs():
    started: list[WorkerProc] = []
    yield started
    stop_all(started)


def drain(procs, *, settings=None, worker_id="journal") -> WorkerProc:
    w = WorkerProc(
        "testapp.Document",
        "--burst",
        "--worker-id",
        worker_id,
        settings=settings,
        claim_meta=QUICK,
    )
    procs.append(w)
    assert w.wait(90) == 0, w.stderr()[-3000:]
    return w


def story(doc: Document) -> list[TaskAttempt]:
    return list(TaskAttempt.objects.filter(model="testapp.Document", row=str(doc.pk)))


def test_a_flaky_tasks_attempts_are_each_recorded_with_their_error(procs, admin_client):
    before = db_now()
    flaky = Document.objects.create(title="flaky", payload={"raise": "upstream said 503"})
    fine = Document.objects.create(title="fine")
    drain(procs)
    assert Document.objects.get(pk=flaky.pk).status == "failed"
    attempts = sorted(story(flaky), key=lambda a: a.number)
    assert [(a.number, a.outcome) for a in attempts] == [
        (1, "retried"),
        (2, "retried"),
        (3, "failed"),
    ]
    after = db_now()
    for a in attempts:
        assert a.worker == "journal"
        assert "RuntimeError: upstream said 503" in a.error
        assert 0 <= a.runtime < 30
        assert before - timedelta(seconds=2) <= a.started_at <= after + timedelta(seconds=2)
    starts = [a.started_at for a in attempts]
    assert starts == sorted(starts)
    assert story(fine) == []  # "errors": an attempt that ended done is not recorded
    page = admin_client.get(reverse("admin:testapp_document_change", args=[flaky.pk]))
    html = page.content.decode()
    assert html.count('<tr data-outcome="retried">') == 2
    assert html.count('<tr data-outcome="failed">') == 1
    assert "RuntimeError: upstream said 503" in html


@pytest.mark.slow
def test_all_records_successes_too_and_off_records_nothing(procs):
    done = Document.objects.create(title="done")
    drain(procs, settings={"TASKCLAIM_ATTEMPT_LOG": "all"}, worker_id="journal-all")
    (attempt,) = story(done)
    assert (attempt.number, attempt.outcome, attempt.error) == (1, "done", "")
    quiet = Document.objects.create(title="quiet", payload={"raise": "boom"})
    drain(procs, settings={"TASKCLAIM_ATTEMPT_LOG": "off"}, worker_id="journal-off")
    assert Document.objects.get(pk=quiet.pk).status == "failed"
    assert story(quiet) == []


def test_a_batched_completion_its_fence_refused_is_recorded_lost(procs):
    """A completion written in a batch (the body returned no result fields) that the
    fence refuses — the claim was taken back while the body ran — did not end done: it
    is recorded ``lost`` in the default ``"errors"`` mode, so the row's next run is
    explained (it was not recorded at all when its batch landed). The lease is long, so
    that the heartbeat does not find the claim lost before the body returns."""
    doc = Document.objects.create(title="taken back")
    w = WorkerProc(
        "testapp.Document",
        "--burst",
        "--worker-id",
        "journal-lost",
        claim_meta={
            **QUICK,
            "lease": 120,
            "handler": "tests.support.worker_handlers.process_quietly_once_taken_back",
        },
    )
    procs.append(w)
    assert w.wait(90) == 0, w.stderr()[-3000:]
    assert "write=done: nothing was written" in w.stderr()  # refused in its batch
    assert Document.objects.get(pk=doc.pk).status == "done"
    attempts = story(doc)
    assert [(a.number, a.outcome, a.worker) for a in attempts] == [(1, "lost", "journal-lost")]


def test_only_the_last_attempts_of_a_row_are_kept(procs):
    doc = Document.objects.create(title="flaky", payload={"raise": "again"})
    drain(procs, settings={"TASKCLAIM_ATTEMPTS_KEPT": 2})
    assert sorted(a.number for a in story(doc)) == [2, 3]


def test_a_journal_that_cannot_write_keeps_what_it_noted(transactional_db, monkeypatch):
    """A failed flush loses nothing: the next one writes it (the database is away)."""
    doc = Document.objects.create(title="x", attempts=1)
    journal = AttemptJournal("w")
    journal.note(doc, "failed", RuntimeError("no"), started=0.0)

    def refuse(*args, **kwargs):
        from django.db import OperationalError

        raise OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(QuerySet, "bulk_create", refuse)
    assert journal.flush("default") == 0
    assert journal.pending() == 1
    monkeypatch.undo()
    assert journal.flush("default") == 1
    (attempt,) = story(doc)
    assert attempt.outcome == "failed"
