"""What ``complete_many()`` (``django_taskclaim/settle/batch.py``) leaves on real rows and
on the instances it was given, at the points the lifecycle and fence tests do not pin
(docs/testing.md, "Mutation testing"): each row its own deferred result fields, the rows
that deferred none left as they were, the instances, the callbacks and signals of the won
rows only, the chunks, the refusals before any write.
"""

from __future__ import annotations

import pytest

import django_taskclaim
from django_taskclaim import run_task
from django_taskclaim.settle import batch
from django_taskclaim.settle.batch import PENDING_ATTR, BatchableResult
from django_taskclaim.signals import task_completed
from tests.support.helpers import BusyOnce
from tests.support.testapp.models import ColumnTask, Document, Job

pytestmark = pytest.mark.django_db(transaction=True)


def claim(n: int, model=Document, **create) -> list:
    model.objects.bulk_create([model(**create) for _ in range(n)])
    rows = model.objects.claim(n, worker="w1")
    assert len(rows) == n
    return rows


def deferred(task, fields: dict | None, calls: list | None = None):
    """Run ``task`` with a handler that returns ``fields`` as a BatchableResult (``None``:
    returns nothing), deferring the completion as the worker's ack window does."""
    out: list = []

    def handler(t):
        if fields is None:
            return None
        on_written = (lambda: calls.append(t.pk)) if calls is not None else None
        return BatchableResult(fields, on_written=on_written)

    assert run_task(task, handler, defer=out.append) == "deferred"
    assert out == [task]
    return task


def test_each_row_gets_its_own_fields_and_a_row_without_any_keeps_its_own():
    a, b, c = claim(3, title="kept")
    calls: list = []
    deferred(a, {"result": "ra", "title": "ta"}, calls)
    deferred(b, {"result": "rb"}, calls)
    deferred(c, None)
    completed: list = []

    def receiver(sender, task, **kw):
        completed.append((sender, task.pk))

    task_completed.connect(receiver)
    try:
        assert django_taskclaim.complete_many([a, b, c]) == []
    finally:
        task_completed.disconnect(receiver)
    rows = {r.pk: r for r in Document.objects.all()}
    assert {pk: (r.status, r.result, r.title) for pk, r in rows.items()} == {
        a.pk: ("done", "ra", "ta"),
        b.pk: ("done", "rb", "kept"),
        c.pk: ("done", "", "kept"),
    }
    for task in (a, b, c):
        assert (task.status, task.version, task.locked_until) == (
            "done",
            rows[task.pk].version,
            None,
        )
        assert task.finished_at == rows[task.pk].finished_at is not None
        assert PENDING_ATTR not in task.__dict__
    assert (a.result, a.title, b.result, b.title) == ("ra", "ta", "rb", "kept")
    assert sorted(calls) == sorted([a.pk, b.pk])
    assert sorted(completed) == sorted((Document, t.pk) for t in (a, b, c))


def test_without_result_fields_every_won_row_is_signalled_to_its_models_receivers():
    tasks = claim(2)
    completed: list = []

    def receiver(sender, task, **kw):
        completed.append((sender, task.pk))

    task_completed.connect(receiver, sender=Document)
    try:
        assert django_taskclaim.complete_many(tasks) == []
    finally:
        task_completed.disconnect(receiver, sender=Document)
    assert sorted(completed) == sorted((Document, t.pk) for t in tasks)
    assert all(t.finished_at is not None for t in tasks)


def test_a_lost_row_is_returned_left_alone_and_gets_no_callback_nor_signal():
    won, lost = claim(2)
    calls: list = []
    deferred(won, {"result": "w"}, calls)
    deferred(lost, {"result": "l"}, calls)
    Document.objects.filter(pk=lost.pk).update(version=lost.version + 1)  # taken back
    completed: list = []

    def receiver(sender, task, **kw):
        completed.append(task.pk)

    task_completed.connect(receiver)
    try:
        assert django_taskclaim.complete_many([won, lost]) == [lost]
    finally:
        task_completed.disconnect(receiver)
    assert Document.objects.get(pk=won.pk).result == "w"
    gone = Document.objects.get(pk=lost.pk)
    assert (gone.status, gone.result, gone.version) == ("processing", "", lost.version + 1)
    assert (lost.status, won.status) == ("processing", "done")
    assert calls == [won.pk]
    assert completed == [won.pk]
    assert PENDING_ATTR not in lost.__dict__


def test_a_row_done_under_another_claim_is_lost_not_won():
    task, other = claim(2)
    # completed by someone else, and its token moved twice since this claim
    Document.objects.filter(pk=task.pk).update(status="done", version=task.version + 2)
    assert django_taskclaim.complete_many([task, other]) == [task]
    assert task.status == "processing"
    assert Document.objects.get(pk=other.pk).status == "done"


def test_the_same_row_twice_is_refused_before_any_write():
    (task,) = claim(1)
    copy = Document.objects.get(pk=task.pk)
    with pytest.raises(ValueError, match=r"^complete_many\(\) got the same row twice$"):
        django_taskclaim.complete_many([task, copy])
    assert Document.objects.get(pk=task.pk).status == "processing"


def test_a_deferred_bookkeeping_field_is_refused_before_any_write():
    first, second = claim(2)
    second.__dict__[PENDING_ATTR] = ({"attempts": 0}, None)
    with pytest.raises(ValueError):
        django_taskclaim.complete_many([first, second])
    assert set(Document.objects.values_list("status", flat=True)) == {"processing"}


def test_chunks_each_complete_their_rows(monkeypatch):
    monkeypatch.setattr(batch, "COMPLETE_MANY_CHUNK", 2)
    tasks = claim(5)
    for i, task in enumerate(tasks):
        deferred(task, {"result": f"r{i}"})
    assert django_taskclaim.complete_many(tasks) == []
    assert sorted(Document.objects.values_list("status", "result")) == [
        ("done", f"r{i}") for i in range(5)
    ]


def test_rows_of_several_models_and_renamed_columns():
    docs = claim(1)
    jobs = claim(1, model=Job)
    cols = claim(2, model=ColumnTask)
    deferred(cols[0], {"note": "n0"})
    deferred(cols[1], {"note": "n1"})
    assert django_taskclaim.complete_many([*docs, *jobs, *cols]) == []
    assert Document.objects.get().status == "done"
    assert Job.objects.get().status == Job.SUCCESS
    assert sorted(ColumnTask.objects.values_list("status", "note")) == [
        ("done", "n0"),
        ("done", "n1"),
    ]
    assert (cols[0].note, cols[1].note) == ("n0", "n1")


def test_uuid_keyed_rows_are_matched_by_their_stored_key():
    from tests.support.testapp.models import UUIDTask

    won, lost = claim(2, model=UUIDTask)
    deferred(won, {"note": "w"})
    deferred(lost, {"note": "l"})
    UUIDTask.objects.filter(pk=lost.pk).update(version=lost.version + 1)
    assert django_taskclaim.complete_many([won, lost]) == [lost]
    assert UUIDTask.objects.get(pk=won.pk).note == "w"
    assert UUIDTask.objects.get(pk=lost.pk).status == "processing"


def test_a_lost_row_is_logged_and_a_busy_database_retried(caplog):
    from django.db import connection

    won, lost = claim(2)
    deferred(won, {"result": "w"})
    deferred(lost, {"result": "l"})
    Document.objects.filter(pk=lost.pk).update(version=lost.version + 1)
    busy = BusyOnce()

    with (
        caplog.at_level("DEBUG", logger="django_taskclaim"),
        connection.execute_wrapper(busy),
    ):
        assert django_taskclaim.complete_many([won, lost]) == [lost]
    assert Document.objects.get(pk=won.pk).result == "w"
    assert any(
        m.startswith("retrying what=complete 2 testapp.Document attempt=1 ")
        for m in caplog.messages
    )
    assert (
        f"claim lost model=testapp.Document pk={lost.pk} token={lost.version} write=done: "
        "nothing was written"
    ) in caplog.messages
