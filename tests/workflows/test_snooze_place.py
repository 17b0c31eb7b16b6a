"""A row that comes back later (``Snooze``, ``Retry``, a park of ``wait_for_event()``)
takes its place in line at the time it is due: it never overtakes rows that were due
before it woke, and a ``Snooze(0)`` waits the floor, so it cannot spin a worker
(docs/lifecycle.md, "Coming back later")."""

from __future__ import annotations

import itertools
from datetime import timedelta

import pytest
from django.db.models import F
from django.db.models.functions import Now

from django_taskclaim import Retry, Snooze, emit, run_task
from django_taskclaim.settle.transitions import SNOOZE_FLOOR
from tests.support.helpers import wait_for
from tests.support.testapp.models import Document, Ledger
from tests.support.worker_handlers import SNOOZED
from tests.support.worker_procs import WorkerProc

pytestmark = pytest.mark.django_db(transaction=True)


def snoozes(task):
    raise Snooze(0)


def test_snoozers_on_every_run_never_starve_newer_rows_of_a_one_slot_worker(procs):
    snoozers = [Document.objects.create(title=f"s{i}", payload={"snooze": True}) for i in range(5)]
    newer = [Document.objects.create(title=f"n{i}") for i in range(50)]
    w = WorkerProc(
        "testapp.Document", "--concurrency", "1", "--poll", "0.2",
        claim_meta={"handler": "tests.support.worker_handlers.process_snoozing"},
    )  # fmt: skip
    procs.append(w)
    ids = [d.pk for d in newer]
    wait_for(
        lambda: Document.objects.filter(pk__in=ids, status="done").count() == len(ids),
        timeout=120,
        what="all 50 newer rows done beside five rows that snooze on every run",
    )
    assert w.stop() == 0, w.stderr()[-2000:]
    for s in snoozers:
        row = Document.objects.get(pk=s.pk)
        assert (row.status, row.attempts) == ("ready", 0)  # snoozes are not attempts
        runs = list(
            Ledger.objects.filter(task_id=s.pk, worker=SNOOZED).order_by("at", "pk")
            .values_list("at", flat=True)
        )  # fmt: skip
        assert runs, "a snoozer never ran"
        gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(runs)]
        # Database clock on both sides; 10 ms for SQLite's millisecond clock.
        assert all(g >= SNOOZE_FLOOR - 0.01 for g in gaps), gaps


def place(pk) -> timedelta:
    """How far the row's place in line (``created_at``) is from the database's now."""
    return (
        Document.objects.annotate(d=F("created_at") - Now()).values_list("d", flat=True).get(pk=pk)
    )


def first_claimed() -> int:
    task = Document.objects.claim_next()
    assert task is not None
    pk = task.pk
    task.release()
    return pk


def test_a_snoozed_row_queues_behind_rows_due_before_it_and_zero_waits_the_floor():
    old = Document.objects.create(title="old")
    newer = Document.objects.create(title="newer")
    assert run_task(Document.objects.claim_next(), snoozes) == "ready"
    row = Document.objects.get(pk=old.pk)
    assert (row.status, row.attempts) == ("ready", 0)
    # Snooze(0) waits the floor, and the row is in line from when it is due.
    assert place(old.pk) > timedelta(seconds=SNOOZE_FLOOR / 2)
    assert Document.objects.filter(pk=old.pk).claimable().count() == 0
    Document.objects.filter(pk=old.pk).update(run_after=Now())  # due now, as if woken
    assert first_claimed() == newer.pk  # "newer" was due before it woke


def test_a_retried_row_keeps_its_place_in_line():
    # A retry counts an attempt (max_attempts ends any loop) and is normally delayed by
    # its backoff: once due it runs before newer rows, not behind a whole backlog.
    old = Document.objects.create(title="old")
    Document.objects.create(title="newer")

    def again(task):
        raise Retry(0)

    assert run_task(Document.objects.claim_next(), again) == "ready"
    assert first_claimed() == old.pk
    assert Document.objects.get(pk=old.pk).last_error


def test_a_parked_row_queues_from_its_deadline_and_from_the_emit_that_wakes_it():
    old = Document.objects.create(title="old")
    Document.objects.create(title="newer")

    def waits(task):
        return {"result": f"got {task.wait_for_event('ready:1', 60)}"}

    assert run_task(Document.objects.claim_next(), waits) == "ready"
    assert place(old.pk) > timedelta(seconds=30)  # in line from its deadline
    emit("ready:1", 1)
    assert abs(place(old.pk)) < timedelta(seconds=30)  # in line from the emit
    later = Document.objects.create(title="later")
    task = Document.objects.claim_next()
    assert task.title == "newer"  # due before the emit
    run_task(task, lambda t: None)
    task = Document.objects.claim_next()
    assert task.pk == old.pk  # woken before "later" was enqueued
    run_task(task, waits)
    assert Document.objects.get(pk=old.pk).result == "got 1"
    assert Document.objects.get(pk=later.pk).status == "ready"
