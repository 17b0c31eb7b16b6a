"""Queue depth samples (``taskclaim.QueueDepth``): a sample holds the model's ``ready``
and ``processing`` rows under the database's current minute, written in one statement by
the one process that won the model's sample lock; the others take none until it lapses;
one sample per model and minute whoever writes; old samples pruned; no sample when the
setting is ``None``; and a real worker takes them from its heartbeat thread."""

from __future__ import annotations

import re
from datetime import UTC, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_taskclaim.db import DbNow, db_now
from django_taskclaim.models import Lease, QueueDepth
from django_taskclaim.worker.maintenance.depth import (
    KEEP_HOURS,
    LOCK_PREFIX,
    DepthSampler,
    depth_sampler,
)
from tests.support.helpers import wait_for
from tests.support.testapp.models import Document, Job
from tests.support.worker_procs import WorkerProc, stop_all

pytestmark = pytest.mark.django_db(transaction=True)
LABEL = "testapp.Document"


def minute_now():
    return db_now().astimezone(UTC).replace(second=0, microsecond=0)


def put(state: str, n: int) -> None:
    rows = Document.objects.bulk_create([Document(title=f"{state}{i}") for i in range(n)])
    Document.objects.filter(pk__in=[r.pk for r in rows]).update(status=state)


def sampler(worker_id: str = "w1") -> DepthSampler:
    found = depth_sampler([Document], using="default", worker_id=worker_id)
    assert found is not None
    return found


def lapse_lock() -> None:
    Lease.objects.filter(key=LOCK_PREFIX + LABEL).update(
        locked_until=DbNow() - timedelta(seconds=1)
    )


def test_a_sample_counts_ready_and_processing_under_the_database_minute():
    put("ready", 3)
    put("processing", 2)
    put("done", 4)
    put("failed", 1)
    before = minute_now()
    with CaptureQueriesContext(connection) as q:
        assert sampler().tick() == 1
    after = minute_now()
    (row,) = QueueDepth.objects.filter(model=LABEL)
    assert (row.ready, row.processing) == (3, 2)
    assert before <= row.minute.astimezone(UTC) <= after
    inserts = [
        s["sql"]
        for s in q.captured_queries
        if re.search(r"INSERT INTO \W?taskclaim_queuedepth", s["sql"])
    ]
    assert len(inserts) == 1  # the count and the write: one statement


def test_an_empty_model_is_sampled_as_zero():
    assert sampler().tick() == 1
    (row,) = QueueDepth.objects.filter(model=LABEL)
    assert (row.ready, row.processing) == (0, 0)


def test_one_process_per_interval_takes_it_and_a_minute_holds_one_sample():
    put("ready", 1)
    first, second = sampler("w1"), sampler("w2")
    assert first.tick() == 1
    assert second.tick() == 0  # the lock is held: no sample, no count
    assert first.tick() == 0  # and the winner's own next try waits for its interval
    assert QueueDepth.objects.count() == 1
    lapse_lock()
    assert sampler("w3").tick() == 1  # the lock lapsed: someone samples again
    minutes = list(QueueDepth.objects.values_list("minute", flat=True))
    assert len(minutes) == len(set(minutes))  # never two samples of one minute
    assert 1 <= len(minutes) <= 2


def test_samples_older_than_the_kept_hours_are_pruned():
    now = minute_now()
    QueueDepth.objects.create(model=LABEL, minute=now - timedelta(hours=KEEP_HOURS + 1))
    QueueDepth.objects.create(model=LABEL, minute=now - timedelta(hours=KEEP_HOURS - 1))
    QueueDepth.objects.create(model="testapp.Job", minute=now - timedelta(hours=KEEP_HOURS + 1))
    assert sampler().tick() == 1
    kept = sorted(
        (m, (now - mi.astimezone(UTC)).total_seconds() // 3600)
        for m, mi in QueueDepth.objects.values_list("model", "minute")
    )
    assert kept == [(LABEL, 0), (LABEL, KEEP_HOURS - 1), ("testapp.Job", KEEP_HOURS + 1)]


def test_no_sample_when_the_setting_is_none(settings):
    settings.TASKCLAIM_DEPTH_SAMPLE_INTERVAL = None
    assert sampler().tick() == 0
    assert not QueueDepth.objects.exists()
    assert not Lease.objects.filter(key__startswith=LOCK_PREFIX).exists()


def test_a_model_with_its_own_status_values_is_counted_by_them():
    Job.objects.bulk_create([Job(name=f"j{i}") for i in range(2)])
    found = depth_sampler([Job], using="default", worker_id="w1")
    assert found is not None
    assert found.tick() == 1
    (row,) = QueueDepth.objects.filter(model="testapp.Job")
    assert (row.ready, row.processing) == (2, 0)


@pytest.mark.slow
def test_a_worker_samples_from_its_heartbeat():
    later = Document.objects.bulk_create([Document(title=f"later{i}") for i in range(2)])
    # ready, but not due while the test looks: the worker leaves them ready
    Document.objects.filter(pk__in=[d.pk for d in later]).update(
        run_after=DbNow() + timedelta(hours=1)
    )
    started: list[WorkerProc] = []
    try:
        started.append(
            WorkerProc(LABEL, "--concurrency", "1", settings={"TASKCLAIM_HEARTBEAT_INTERVAL": 0.2})
        )
        row = wait_for(
            lambda: QueueDepth.objects.filter(model=LABEL).first(),
            timeout=60,
            what="a depth sample",
        )
        assert (row.ready, row.processing) == (2, 0)
        assert Lease.objects.get(key=LOCK_PREFIX + LABEL).owner
    finally:
        stop_all(started)
