"""The worker's OpenTelemetry metrics: a real worker in burst mode over a known set of
rows records into the OpenTelemetry SDK's in-memory reader, and each counter says what
the rows went through; without OpenTelemetry nothing is measured at all."""

from __future__ import annotations

import sys
import threading
from datetime import timedelta

import pytest
from django.db import connections

from django_taskclaim import telemetry
from django_taskclaim.db import DbNow
from django_taskclaim.exceptions import Fail, Retry
from django_taskclaim.worker import Worker, WorkerConfig
from tests.support.helpers import simulate_work, wait_for
from tests.support.testapp.models import Document

sdk = pytest.importorskip("opentelemetry.sdk.metrics", reason="opentelemetry-sdk not installed")
export = pytest.importorskip("opentelemetry.sdk.metrics.export")

pytestmark = pytest.mark.django_db(transaction=True)

DOC = "testapp.Document"


def body(task):
    """Returns nothing (so its completion is batched), or fails, retries, or works a while."""
    payload = task.payload or {}
    if "fail" in payload:
        raise Fail(payload["fail"])
    if "retry" in payload:
        raise Retry(delay=0)
    if payload.get("sleep"):
        simulate_work(payload["sleep"])


@pytest.fixture
def reader():
    found = export.InMemoryMetricReader()
    telemetry.configure(sdk.MeterProvider(metric_readers=[found]))
    yield found
    telemetry.configure(None)


def points(reader) -> dict[str, list]:
    """metric name -> its data points."""
    found: dict[str, list] = {}
    data = reader.get_metrics_data()
    for resource in data.resource_metrics if data else []:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                found.setdefault(metric.name, []).extend(metric.data.data_points)
    return found


def total(found: dict, name: str, **labels: str) -> float:
    """The sum of a counter (or the count of a histogram) over the points with ``labels``."""
    return sum(
        getattr(p, "value", None) if hasattr(p, "value") else p.count
        for p in found.get(name, [])
        if all(p.attributes.get(k) == v for k, v in labels.items())
    )


@pytest.mark.slow
def test_a_burst_worker_counts_what_its_rows_went_through(reader, settings):
    settings.TASKCLAIM_MAX_ATTEMPTS = 2
    settings.TASKCLAIM_HEARTBEAT_INTERVAL = 0.2
    settings.TASKCLAIM_REAP_INTERVAL = 3600
    for i in range(3):
        Document.objects.create(title=f"ok{i}")
    Document.objects.create(title="fail", payload={"fail": "bad input"})
    Document.objects.create(title="retry", payload={"retry": True})
    # a row whose holder died: recovered by the reap before the burst, then done
    dead = Document.objects.create(title="dead")
    Document.objects.filter(pk=dead.pk).update(
        status="processing", attempts=0, locked_until=DbNow() - timedelta(seconds=60)
    )
    Document.objects.create(title="slow", payload={"sleep": 1})  # its lease is renewed
    cancelled = Document.objects.create(title="cancelled", payload={"sleep": 3})

    def cancel_once_running():
        try:
            wait_for(
                lambda: Document.objects.filter(pk=cancelled.pk, status="processing").exists(),
                timeout=60,
                what="the row to cancel to be claimed",
            )
            Document.objects.filter(pk=cancelled.pk).cancel()
        finally:
            connections.close_all()  # this thread's

    canceller = threading.Thread(target=cancel_once_running)
    canceller.start()
    config = WorkerConfig.build([DOC], concurrency=2, burst=True, ack_window=0.05)
    config.handlers[Document] = body
    assert Worker(config).run() == 0
    canceller.join(60)

    states = dict(Document.objects.values_list("title", "status"))
    assert states == {
        "ok0": "done", "ok1": "done", "ok2": "done", "dead": "done", "slow": "done",
        "fail": "failed", "retry": "failed", "cancelled": "cancelled",
    }  # fmt: skip
    found = points(reader)
    where = {"model": DOC, "queue": ""}
    # claims: 5 done + fail + retry twice (max 2 attempts) + the cancelled one
    assert total(found, "taskclaim.tasks.claimed", **where) == 9
    assert total(found, "taskclaim.tasks.completed", **where) == 5
    assert total(found, "taskclaim.tasks.failed", **where) == 2
    assert total(found, "taskclaim.tasks.retried", **where) == 1
    assert total(found, "taskclaim.tasks.cancelled", **where) == 1
    assert total(found, "taskclaim.tasks.timed_out") == 0
    assert total(found, "taskclaim.lease.losses", **where) == 1
    assert total(found, "taskclaim.lease.renewals", model=DOC) >= 1
    assert total(found, "taskclaim.tasks.recovered", model=DOC, to="ready") == 1
    # histograms: one body per claim, one ack per completion, a claim statement at least
    assert total(found, "taskclaim.task.duration", **where) == 9
    # completions batched, but the recovered row's: it runs alone, written at once
    assert total(found, "taskclaim.task.duration", outcome="deferred") == 4
    assert total(found, "taskclaim.task.duration", outcome="done") == 1
    assert total(found, "taskclaim.ack.duration", **where) == 5
    assert total(found, "taskclaim.claim.duration", **where) >= 2
    slow = [p for p in found["taskclaim.task.duration"] if p.attributes["outcome"] == "lost"]
    assert len(slow) == 1
    assert slow[0].sum >= 2.5  # the cancelled body ran (its 3 s) before its write was refused


def test_timed_out_counts_an_attempt_stopped_by_its_deadline(reader):
    task = Document.objects.create(title="slow")
    telemetry.timed_out(task)
    telemetry.timed_out(task)
    assert total(points(reader), "taskclaim.tasks.timed_out", model=DOC, queue="") == 2


def test_without_opentelemetry_nothing_is_measured(monkeypatch):
    """With ``opentelemetry`` not importable the worker's threads hold ``None`` and skip
    every measurement (no clock read, no label built); the worker runs as before."""
    monkeypatch.setitem(sys.modules, "opentelemetry", None)  # import fails
    try:
        assert telemetry.configure() is None
        assert telemetry.instruments() is None
        telemetry.timed_out(Document(title="x"))  # a no-op, not an error
        for i in range(3):
            Document.objects.create(title=f"n{i}")
        worker = Worker(WorkerConfig.build([DOC], burst=True, reap=False))
        assert worker.claimer.telemetry is None
        assert worker.executors.telemetry is None
        assert worker.acks.telemetry is None
        assert worker.run() == 0
        assert Document.objects.filter(status="done").count() == 3
    finally:
        monkeypatch.undo()
        telemetry.configure(None)


def p50(point) -> float:
    """The median a dashboard reads from a histogram point: the bucket where half the
    count is reached, interpolated linearly inside it (as Prometheus's
    ``histogram_quantile`` and Grafana do)."""
    bounds = [0.0, *point.explicit_bounds]
    half = point.count / 2
    seen = 0
    for i, count in enumerate(point.bucket_counts[: len(bounds) - 1]):
        if seen + count >= half:
            low, high = bounds[i], bounds[i + 1]
            return low + (high - low) * (half - seen) / count
        seen += count
    return float("inf")  # in the open last bucket


def test_duration_histograms_have_buckets_for_seconds(reader, settings):
    """Sub-second bodies (40 ms each) give a median read from the buckets near 40 ms, not
    somewhere in a first bucket 5 s wide (the SDK's default boundaries are for ms)."""
    settings.TASKCLAIM_REAP_INTERVAL = 3600
    Document.objects.bulk_create(
        Document(title=f"t{i}", payload={"sleep": 0.04}) for i in range(12)
    )
    config = WorkerConfig.build([DOC], concurrency=2, burst=True, reap=False)
    config.handlers[Document] = body
    assert Worker(config).run() == 0
    assert Document.objects.filter(status="done").count() == 12

    found = points(reader)
    (bodies,) = [p for p in found["taskclaim.task.duration"] if p.count == 12]
    median = p50(bodies)
    # each body took 40 ms (more on a loaded machine): the median lands in (25 ms, 100 ms]
    # or a little above, never the 2.5 s the default first bucket (0, 5] would give
    assert 0.025 <= median <= 0.25, median
    assert bodies.sum / bodies.count < 0.25  # the bodies were as quick as that
    for name in ("taskclaim.task.duration", "taskclaim.claim.duration", "taskclaim.ack.duration"):
        assert found[name], name
        for point in found[name]:
            assert tuple(point.explicit_bounds) == telemetry.DURATION_BUCKETS, name


def test_the_queue_attribute_has_at_most_the_cap_plus_one_values(settings):
    """5,000 queue names: the first ``TASKCLAIM_METRICS_MAX_QUEUES`` a process sees are
    their own ``queue`` value, every later one is ``"(other)"``."""
    from tests.support.flowapp.models import Errand

    settings.TASKCLAIM_METRICS_MAX_QUEUES = 50
    found = export.InMemoryMetricReader()
    telemetry.configure(sdk.MeterProvider(metric_readers=[found]))
    try:
        for i in range(5000):
            telemetry.timed_out(Errand(queue_name=f"tenant-{i:04d}"))
        telemetry.timed_out(Errand(queue_name="tenant-0007"))  # seen: keeps its value
        got = points(found)["taskclaim.tasks.timed_out"]
    finally:
        telemetry.configure(None)
    values = {p.attributes["queue"]: p.value for p in got}
    assert len(values) == 51
    assert values["(other)"] == 4950
    assert values["tenant-0007"] == 2
    assert sum(values.values()) == 5001
