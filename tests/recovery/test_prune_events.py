"""Retention of emitted events (docs/workflows.md, "Waiting for an event"): ``manage.py
taskclaim_prune`` run for every model also deletes the events emitted more than
``--older-than`` ago that no row waits for, and never one a parked row will still read."""

from __future__ import annotations

import logging
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command

from django_taskclaim import emit, run_task
from django_taskclaim.db import DbNow
from django_taskclaim.models import TaskEvent, TaskEventWait
from django_taskclaim.recovery.prune import prune_events
from tests.support.testapp.models import Document

pytestmark = pytest.mark.django_db(transaction=True)


def age(name: str, hours: float) -> None:
    """Make event ``name`` emitted ``hours`` ago (database clock)."""
    TaskEvent.objects.filter(name=name).update(emitted_at=DbNow() - timedelta(hours=hours))


def prune(*args: str) -> str:
    out = StringIO()
    call_command("taskclaim_prune", "--older-than", "1h", *args, stdout=out)
    return out.getvalue()


def waits_for(name: str):
    def body(task):
        return {"result": f"got {task.wait_for_event(name, 3600)}"}

    return body


def test_old_emitted_events_go_and_recent_or_awaited_ones_stay():
    emit("old", 1)
    emit("recent", 2)
    age("old", 2)
    age("recent", 0.5)
    Document.objects.create(title="parked")
    task = Document.objects.claim_next()
    assert run_task(task, waits_for("not-yet")) == "ready"  # an event row, not emitted
    assert set(TaskEvent.objects.values_list("name", flat=True)) == {"old", "recent", "not-yet"}

    assert "events: would delete 1 " in prune("--dry-run")
    assert TaskEvent.objects.count() == 3  # a dry run deletes nothing
    assert "events: deleted 1 emitted more than 1h ago" in prune()
    assert set(TaskEvent.objects.values_list("name", flat=True)) == {"recent", "not-yet"}
    assert prune_events(older_than=timedelta(hours=1), using="default") == 0  # nothing left


def test_an_event_a_parked_row_has_not_read_yet_is_kept_until_it_has():
    doc = Document.objects.create(title="t")
    task = Document.objects.claim_next()
    assert run_task(task, waits_for("approved")) == "ready"  # parked
    assert emit("approved", {"by": "ann"})
    age("approved", 48)  # the workers were away for two days
    assert "events: deleted 0 " in prune()
    assert TaskEvent.objects.filter(name="approved").exists()  # its waiter has not run
    again = Document.objects.claim_next()
    assert run_task(again, waits_for("approved")) == "done"
    assert Document.objects.get(pk=doc.pk).result == "got {'by': 'ann'}"
    assert not TaskEventWait.objects.exists()
    assert "events: deleted 1 " in prune()
    assert not TaskEvent.objects.exists()


def test_a_pruned_event_can_be_emitted_again_and_naming_models_leaves_events_alone(caplog):
    emit("nightly", "monday")
    age("nightly", 30)
    out = prune("testapp.Document")
    assert "events:" not in out  # models named: only their rows
    assert TaskEvent.objects.filter(name="nightly").exists()
    for name in ("a", "b"):
        emit(name)
        age(name, 30)
    with caplog.at_level(logging.INFO, logger="django_taskclaim.recovery.prune"):
        # one event per batch: the count adds up over the batches
        assert prune_events(older_than=timedelta(hours=1), batch_size=1, using="default") == 3
    assert "pruned events=3 older_than=1:00:00" in caplog.text
    assert not TaskEvent.objects.exists()
    assert emit("nightly", "tuesday") is True  # the name is free again: this emit wins
    assert TaskEvent.objects.get(name="nightly").payload == "tuesday"


def test_keyset_batches_walk_past_each_deleted_batch_and_stop_where_told():
    from django_taskclaim.recovery.prune import keyset_batches

    Document.objects.bulk_create(Document(title=str(i)) for i in range(5))
    pks = sorted(Document.objects.values_list("pk", flat=True))
    seen = []
    for batch in keyset_batches(Document.objects.all(), 2):
        seen.append(batch)
        Document.objects.filter(pk__in=batch).delete()  # as prune does
    assert seen == [pks[0:2], pks[2:4], pks[4:5]]
    Document.objects.bulk_create(Document(title=str(i)) for i in range(5))
    assert [len(b) for b in keyset_batches(Document.objects.all(), 2, max_batches=2)] == [2, 2]
    assert list(keyset_batches(Document.objects.none(), 2)) == []
