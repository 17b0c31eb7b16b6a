"""reap(): bounded, conditions re-checked inside the UPDATE, token bumped, explained."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import override_settings

from django_taskclaim import reap
from django_taskclaim.claim.base import was_recovered
from django_taskclaim.db import DbNow
from django_taskclaim.recovery.reap import release_worker
from django_taskclaim.signals import task_reaped
from tests.support.testapp.models import Document, Job

pytestmark = pytest.mark.django_db(transaction=True)


def expire(qs):
    qs.update(locked_until=DbNow() - timedelta(seconds=1))


def test_reap_requeues_expired_and_fails_exhausted():
    Document.objects.bulk_create([Document(title=str(i)) for i in range(5)])
    rows = Document.objects.claim(5, worker="dead-worker")
    Document.objects.filter(pk=rows[0].pk).update(attempts=5)  # exhausted (max 5)
    expire(Document.objects.filter(pk__in=[r.pk for r in rows[:3]]))
    result = reap(Document)
    assert (result.requeued, result.failed) == (2, 1)
    assert result.per_model == {"testapp.Document": {"requeued": 2, "failed": 1}}
    failed = Document.objects.get(pk=rows[0].pk)
    assert failed.status == "failed"
    assert failed.last_error == "lease expired; held by dead-worker"
    assert failed.version == rows[0].version + 1
    back = Document.objects.get(pk=rows[1].pk)
    # A requeued row keeps its old lease end: that marks it recovered for the next claim.
    assert back.status == "ready"
    assert back.locked_until is not None
    assert failed.locked_until is None
    # Unexpired leases are untouched.
    assert Document.objects.processing().count() == 2
    assert reap(Document).total == 0


def test_reap_rechecks_conditions_inside_the_update():
    """A row whose holder extended its lease after the reaper's SELECT is left alone."""
    from django.db import connection

    Document.objects.bulk_create([Document() for _ in range(3)])
    rows = Document.objects.claim(3)
    expire(Document.objects.all())
    state = {"renewed": False}

    def renew_before_first_update(execute, sql, params, many, context):
        if sql.startswith("UPDATE") and not state["renewed"]:
            state["renewed"] = True
            rows[0].extend_lease(60)  # the holder renews between SELECT and UPDATE
        return execute(sql, params, many, context)

    with connection.execute_wrapper(renew_before_first_update):
        result = reap(Document)
    assert state["renewed"]
    assert result.requeued == 2
    assert Document.objects.get(pk=rows[0].pk).status == "processing"
    rows[0].complete()


def test_reap_in_batches_and_dry_run():
    Document.objects.bulk_create([Document() for _ in range(25)])
    Document.objects.claim(25)
    expire(Document.objects.all())
    dry = reap(Document, dry_run=True)
    assert dry.requeued == 25
    assert Document.objects.processing().count() == 25
    assert reap(Document, batch_size=4).requeued == 25
    assert Document.objects.ready().count() == 25


def test_plain_reap_never_takes_a_valid_lease_whatever_the_holder():
    """Silence is not death: reap() looks at the lease only."""
    Document.objects.bulk_create([Document() for _ in range(2)])
    Document.objects.claim(2, worker="host:1")
    assert reap(Document).total == 0
    assert Document.objects.processing().count() == 2


def test_release_worker_takes_back_a_proven_dead_holders_rows():
    Document.objects.bulk_create([Document() for _ in range(4)])
    Document.objects.claim(2, worker="host:1")
    Document.objects.claim(2, worker="host:2")
    assert release_worker("host:1", Document, dry_run=True).requeued == 2
    assert Document.objects.processing().count() == 4
    result = release_worker("host:1", Document)
    assert result.requeued == 2
    assert set(Document.objects.processing().values_list("locked_by", flat=True)) == {"host:2"}
    assert Document.objects.ready().first().last_error == "released from worker host:1"
    again = Document.objects.claim(2, worker="host:3")
    assert len(again) == 2
    assert all(was_recovered(r) for r in again)
    assert all(r.attempts == 2 for r in again)


def test_release_worker_rejects_a_blank_id():
    with pytest.raises(ValueError, match="non-empty string"):
        release_worker("", Document)


def test_reap_mapped_status_table_and_signal():
    Job.objects.bulk_create([Job(name="a"), Job(name="b")])
    Job.objects.claim(2)
    Job.objects.update(locked_until=DbNow() - timedelta(seconds=1))
    seen = []

    def receiver(sender, requeued, failed, **kw):
        seen.append((sender, requeued, failed))

    task_reaped.connect(receiver)
    try:
        with override_settings(TASKCLAIM_MAX_ATTEMPTS=1):
            result = reap(Job)
    finally:
        task_reaped.disconnect(receiver)
    assert (result.requeued, result.failed) == (0, 2)
    assert set(Job.objects.values_list("status", flat=True)) == {Job.FAILED}
    assert seen == [(Job, 0, 2)]


def test_reap_all_models_by_default():
    Document.objects.create()
    Job.objects.create()
    Document.objects.claim()
    Job.objects.claim()
    expire(Document.objects.all())
    Job.objects.update(locked_until=DbNow() - timedelta(seconds=1))
    result = reap()
    assert result.requeued == 2
    assert set(result.per_model) == {"testapp.Document", "testapp.Job"}


def test_bad_batch_size():
    with pytest.raises(ValueError, match="batch_size must be > 0"):
        reap(Document, batch_size=-1)
    with pytest.raises(ValueError, match="batch_size must be a whole number"):
        reap(Document, batch_size=2.5)


def test_queryset_bulk_operations_are_fenced():
    Document.objects.bulk_create([Document(title=str(i)) for i in range(6)])
    held = Document.objects.claim(2)
    assert Document.objects.release() == 2  # holders fenced
    from django_taskclaim import ClaimLost

    with pytest.raises(ClaimLost):
        held[0].complete()
    assert Document.objects.filter(title__in=["0", "1"]).cancel() == 2
    assert Document.objects.cancelled().count() == 2
    row = Document.objects.claim_next()
    row.fail("x")
    assert Document.objects.requeue(batch_size=1) == 3
    assert Document.objects.ready().count() == 6
    assert set(Document.objects.values_list("attempts", flat=True)) == {0}
    stats = Document.objects.stats()
    assert stats["ready"] == 6
    assert stats["expired"] == 0
