"""The shared predicates of ``django_taskclaim/rules.py`` on real rows: which rows each rule
selects, and the boundary each one draws (docs/testing.md, "Mutation testing": these tests
kill the mutants of that module that the lifecycle and reaper tests leave alive).
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.conf import settings
from django.db import connection, models
from django.db.models import F
from django.db.models.functions import Now
from django.test.utils import CaptureQueriesContext, isolate_apps

from django_taskclaim.config.options import get_options
from django_taskclaim.db import DbNow
from django_taskclaim.models import (
    ClaimableMixin,
    ClaimFieldsMixin,
    StatusFieldMixin,
    TimestampFieldsMixin,
    WorkerProcess,
)
from django_taskclaim.rules import (
    heard_from_recently,
    held_many_q,
    held_q,
    lease_ended,
    lease_expired_q,
    lease_running_q,
    live_worker_q,
    ready_since,
    silence_cutoff,
    silent_after,
    silent_worker_q,
)
from tests.support.testapp.models import Document, UUIDTask

pytestmark = pytest.mark.django_db(transaction=True)


def opts():
    return get_options(Document)


def lease_rows() -> dict[str, int]:
    """A row of each kind the lease rules must tell apart, by name → pk."""
    rows = {
        "lapsed": Document.objects.create(title="lapsed"),
        "running": Document.objects.create(title="running"),
        "ready_past": Document.objects.create(title="ready_past"),
        "done_past": Document.objects.create(title="done_past"),
    }
    Document.objects.filter(pk=rows["lapsed"].pk).update(
        status="processing", locked_until=DbNow() - timedelta(seconds=60)
    )
    Document.objects.filter(pk=rows["running"].pk).update(
        status="processing", locked_until=DbNow() + timedelta(seconds=600)
    )
    for name, status in (("ready_past", "ready"), ("done_past", "done")):
        Document.objects.filter(pk=rows[name].pk).update(
            status=status, locked_until=DbNow() - timedelta(seconds=60)
        )
    return {name: row.pk for name, row in rows.items()}


def titles(q) -> set[str]:
    return set(Document.objects.filter(q).values_list("title", flat=True))


def test_lease_expired_selects_only_processing_rows_whose_lease_ended():
    lease_rows()
    assert titles(lease_expired_q(opts())) == {"lapsed"}


def test_lease_running_selects_only_processing_rows_whose_lease_goes_on():
    lease_rows()
    assert titles(lease_running_q(opts())) == {"running"}


def test_lease_ended_is_strictly_after_the_lease_end_read_from_the_row():
    pk = lease_rows()["running"]
    row = Document.objects.annotate(db_now=Now()).get(pk=pk)
    end = row.locked_until
    assert not lease_ended(end, row.db_now)  # 600 s ahead of the database clock
    assert not lease_ended(end, end)  # at its end a lease still runs (the reaper's "<")
    assert lease_ended(end, end + timedelta(microseconds=1))


def workers() -> None:
    WorkerProcess.objects.create(worker_id="live", hostname="h", pid=1)
    WorkerProcess.objects.create(worker_id="silent", hostname="h", pid=2)
    WorkerProcess.objects.create(worker_id="stopped", hostname="h", pid=3)
    WorkerProcess.objects.create(worker_id="stopped-silent", hostname="h", pid=4)
    quiet = DbNow() - timedelta(seconds=silent_after() + 120)
    WorkerProcess.objects.filter(worker_id="silent").update(last_seen=quiet)
    WorkerProcess.objects.filter(worker_id="stopped").update(stopped_at=DbNow())
    WorkerProcess.objects.filter(worker_id="stopped-silent").update(
        last_seen=quiet, stopped_at=DbNow()
    )


def worker_ids(q) -> set[str]:
    return set(WorkerProcess.objects.filter(q).values_list("worker_id", flat=True))


def test_live_workers_are_not_stopped_and_heard_from_within_the_silence_window():
    workers()
    assert worker_ids(live_worker_q()) == {"live"}


def test_silent_workers_are_not_stopped_and_unheard_for_longer_than_the_window():
    workers()
    assert worker_ids(silent_worker_q()) == {"silent"}


def test_the_silence_window_follows_the_setting(settings):
    settings.TASKCLAIM_WORKER_SILENT_AFTER = 1000.0
    assert silent_after() == 1000.0
    workers()  # "silent" was last heard 1,120 s ago
    assert worker_ids(silent_worker_q()) == {"silent"}
    WorkerProcess.objects.filter(worker_id="silent").update(
        last_seen=DbNow() - timedelta(seconds=900)
    )
    assert worker_ids(live_worker_q()) == {"live", "silent"}
    # the cutoff is the database clock minus the window, compared as a value
    cutoff = WorkerProcess.objects.annotate(c=silence_cutoff(), n=Now()).get(worker_id="live")
    assert cutoff.n - cutoff.c == timedelta(seconds=1000)


def test_heard_from_recently_reads_the_values_as_live_worker_q_does():
    workers()
    now = WorkerProcess.objects.annotate(n=Now()).get(worker_id="live").n
    live = WorkerProcess.objects.get(worker_id="live")
    silent = WorkerProcess.objects.get(worker_id="silent")
    assert heard_from_recently(live.last_seen, now)
    assert not heard_from_recently(silent.last_seen, now)
    window = timedelta(seconds=silent_after())
    assert heard_from_recently(now - window, now)  # at the cutoff: still live (">=")
    assert not heard_from_recently(now - window - timedelta(microseconds=1), now)


def test_ready_since_is_the_later_of_creation_and_run_after():
    later = Document.objects.create(title="later")
    earlier = Document.objects.create(title="earlier")
    Document.objects.create(title="unset")
    Document.objects.filter(pk=later.pk).update(run_after=F("created_at") + timedelta(hours=1))
    Document.objects.filter(pk=earlier.pk).update(run_after=F("created_at") - timedelta(hours=1))
    rows = {
        d.title: (d.since, d.created_at, d.run_after)
        for d in Document.objects.annotate(since=ready_since(opts()))
    }
    since, created, run_after = rows["later"]
    assert since == run_after == created + timedelta(hours=1)
    since, created, _ = rows["earlier"]
    assert since == created
    since, created, run_after = rows["unset"]
    assert run_after is None
    assert since == created


@isolate_apps("tests.support.testapp")
def test_ready_since_without_run_after_is_the_creation_time():
    """A model without ``run_after`` (its rows are due when created) ages its ready rows
    from ``created_at`` alone."""

    class Unscheduled(ClaimableMixin, StatusFieldMixin, ClaimFieldsMixin, TimestampFieldsMixin):
        title = models.CharField(max_length=20, default="")

        class Meta:
            app_label = "testapp"
            db_table = "testapp_mutants_unscheduled"

    assert not get_options(Unscheduled).has("run_after")
    with connection.schema_editor() as editor:
        editor.create_model(Unscheduled)
    try:
        Unscheduled.objects.create(title="older")
        Unscheduled.objects.create(title="newer")
        Unscheduled.objects.filter(title="older").update(created_at=DbNow() - timedelta(hours=2))
        rows = {
            u.title: (u.since, u.created_at)
            for u in Unscheduled.objects.annotate(since=ready_since(get_options(Unscheduled)))
        }
        assert rows["older"][0] == rows["older"][1]
        assert rows["newer"][0] == rows["newer"][1]
        assert rows["newer"][0] - rows["older"][0] > timedelta(hours=1)
    finally:
        with connection.schema_editor() as editor:
            editor.delete_model(Unscheduled)


def test_the_fence_of_no_token_selects_no_row():
    Document.objects.create(title="any")
    assert not Document.objects.filter(held_q(opts(), [])).exists()
    assert not Document.objects.filter(held_q(opts(), [], "default")).exists()


def test_the_batch_fence_converts_each_key_as_a_lookup_would():
    """``held_many_q`` passes its keys as raw parameters: a UUID key must be converted for
    the database (a 32-digit hex string where there is no native UUID type)."""
    UUIDTask.objects.bulk_create(UUIDTask() for _ in range(3))
    held, moved_on, _ = UUIDTask.objects.claim(3, worker="w")
    UUIDTask.objects.filter(pk=moved_on.pk).update(version=moved_on.version + 1)
    tokens = {held.pk: held.version, moved_on.pk: moved_on.version}
    q = held_many_q(get_options(UUIDTask), tokens, "default")
    assert list(UUIDTask.objects.filter(q).values_list("pk", flat=True)) == [held.pk]


@pytest.mark.skipif(
    settings.DB_VENDOR != "postgresql", reason="the opaque status re-check is PostgreSQL's"
)
def test_a_writes_fence_rechecks_the_status_as_an_opaque_parameter():
    """On a write (``using`` given) the fence's status condition is the re-check no planner
    takes for a reason to scan a partial index; a read's is the plain condition."""
    row = Document.objects.create(title="held")
    Document.objects.filter(pk=row.pk).update(status="processing", version=1)
    fences = {
        "held_q": held_q(opts(), [(row.pk, 1)], "default"),
        "held_many_q": held_many_q(opts(), {row.pk: 1}, "default"),
    }
    for name, q in fences.items():
        with CaptureQueriesContext(connection) as queries:
            assert Document.objects.filter(q).update(title=name) == 1
        (sql,) = (q["sql"] for q in queries.captured_queries if q["sql"].startswith("UPDATE"))
        assert "(SELECT CAST(" in sql, (name, sql)
    with CaptureQueriesContext(connection) as queries:
        assert Document.objects.filter(held_q(opts(), [(row.pk, 1)])).count() == 1
    assert "(SELECT CAST(" not in queries.captured_queries[-1]["sql"]
