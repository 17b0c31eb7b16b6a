"""Async task bodies: ``async def process(self)`` (and async handlers) run on one event
loop per worker process, with the executors' slots, leases, retries and graceful stop.

Real worker subprocesses; invariants are checked over the ``Mark`` ledger the bodies
write (database clock). ``asyncio.sleep`` inside a body stands for its I/O.
"""

from __future__ import annotations

import asyncio
import signal

import pytest
from asgiref.sync import async_to_sync, sync_to_async

from tests.support.asyncapp.models import AsyncDocument, Mark
from tests.support.helpers import wait_for
from tests.support.testapp.models import Document
from tests.support.worker_procs import WorkerProc, stop_all

pytestmark = pytest.mark.django_db(transaction=True)

FAST = {"TASKCLAIM_REAP_INTERVAL": 3600, "TASKCLAIM_HEARTBEAT_INTERVAL": 0.5}


@pytest.fixture
def procs(transactional_db):
    started: list[WorkerProc] = []
    yield started
    stop_all(started)


def start(procs, *args, **kwargs) -> WorkerProc:
    kwargs.setdefault("settings", FAST)
    w = WorkerProc(*args, **kwargs)
    procs.append(w)
    return w


def marks(kind: str) -> list[Mark]:
    return list(Mark.objects.filter(kind=kind).order_by("at", "pk"))


def most_at_once() -> int:
    """The most bodies running at one moment: each body's [start, end] on the database
    clock (an end before a start at the same instant counts first)."""
    events = [(m.at, 1) for m in marks("start")] + [(m.at, -1) for m in marks("end")]
    running = peak = 0
    for _at, step in sorted(events):
        running += step
        peak = max(peak, running)
    return peak


@pytest.mark.slow
def test_an_async_model_is_drained_by_a_worker_with_sync_models_beside_it(procs):
    AsyncDocument.objects.bulk_create(AsyncDocument(payload={"sleep": 0.01}) for _ in range(20))
    Document.objects.bulk_create(Document(title=f"s{i}") for i in range(20))
    w = start(procs, "asyncapp.AsyncDocument", "testapp.Document", "--burst", "-c", "3")
    assert w.wait(90) == 0, w.stderr()
    assert AsyncDocument.objects.done().count() == 20
    assert Document.objects.done().count() == 20
    assert set(AsyncDocument.objects.values_list("result", flat=True)) == {
        f"async {pk}" for pk in AsyncDocument.objects.values_list("pk", flat=True)
    }
    # One loop per process, on its own thread, ran every async body.
    assert {m.thread for m in Mark.objects.all()} == {"taskclaim-async"}
    assert "Traceback" not in w.stderr()


@pytest.mark.slow
def test_async_bodies_overlap_and_never_exceed_the_concurrency(procs):
    AsyncDocument.objects.bulk_create(AsyncDocument(payload={"sleep": 0.5}) for _ in range(16))
    w = start(procs, "asyncapp.AsyncDocument", "--burst", "--concurrency", "4", "--batch", "2")
    assert w.wait(90) == 0, w.stderr()
    assert AsyncDocument.objects.done().count() == 16
    assert len(marks("start")) == len(marks("end")) == 16
    peak = most_at_once()
    print(f"async bodies at once: {peak} (concurrency 4)")
    assert 1 < peak <= 4, peak


def test_an_async_handler_on_a_model_runs_on_the_loop(procs):
    doc = Document.objects.create(title="h", payload={"quick": True})
    handler = "tests.support.worker_handlers.process_async_until_cancelled"
    w = start(procs, "testapp.Document", "--burst", claim_meta={"handler": handler})
    assert w.wait(60) == 0, w.stderr()
    doc.refresh_from_db()
    assert (doc.status, doc.result) == ("done", "async handler")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("payload", "error"),
    [({"raise": "boom"}, "boom"), ({"base": "SystemExit"}, "SystemExit")],
)
def test_an_async_body_that_raises_is_retried(procs, payload, error):
    doc = AsyncDocument.objects.create(payload=payload)
    w = start(procs, "asyncapp.AsyncDocument", "--burst", "--until-empty")
    assert w.wait(60) == 0, w.stderr()
    doc.refresh_from_db()
    assert (doc.status, doc.attempts) == ("done", 2)
    assert error in doc.last_error
    assert [m.attempt for m in marks("start")] == [1, 2]
    assert [m.attempt for m in marks("end")] == [2]


@pytest.mark.slow
def test_sigterm_lets_running_async_bodies_finish_and_releases_the_rest(procs):
    AsyncDocument.objects.bulk_create(AsyncDocument(payload={"sleep": 2}) for _ in range(6))
    w = start(procs, "asyncapp.AsyncDocument", "-c", "3", "--batch", "2", "--grace", "30")
    wait_for(lambda: len(marks("start")) == 3, timeout=60, what="three bodies running")
    w.signal(signal.SIGTERM)
    assert w.wait(60) == 0, w.stderr()
    ran = {m.task_id for m in marks("start")}
    assert len(ran) == 3
    assert {m.task_id for m in marks("end")} == ran  # finished, not cancelled
    assert not marks("cancelled")
    assert set(AsyncDocument.objects.filter(pk__in=ran).values_list("status", flat=True)) == {
        "done"
    }
    rest = AsyncDocument.objects.exclude(pk__in=ran)
    assert list(rest.values_list("status", "attempts")) == [("ready", 0)] * 3  # released


@pytest.mark.slow
def test_after_the_grace_period_async_bodies_are_cancelled_and_requeued(procs):
    """Grace over: ``CancelledError`` in each body; one that ends is requeued by its
    executor, one that ignores it is requeued as a sync body would be; exit 3."""
    stops = AsyncDocument.objects.create(payload={"sleep": 60})
    ignores = AsyncDocument.objects.create(payload={"sleep": 60, "ignore_cancel": 60})
    w = start(procs, "asyncapp.AsyncDocument", "-c", "2", "--grace", "1")
    wait_for(lambda: len(marks("start")) == 2, timeout=60, what="both bodies running")
    w.signal(signal.SIGTERM)
    assert w.wait(60) == 3, w.stderr()
    assert {m.task_id for m in marks("cancelled")} == {stops.pk, ignores.pk}
    assert not marks("end")
    for doc in (stops, ignores):
        doc.refresh_from_db()
        assert (doc.status, doc.attempts) == ("ready", 1)
        assert "grace period" in doc.last_error


# -- the async claim API, as docs/async.md shows it ---------------------------------------
async def drain(queryset) -> int:
    """Claim and process rows one at a time until none is left; return how many."""
    processed = 0
    while (task := await queryset.aclaim_next(lease=60)) is not None:
        try:
            await asyncio.sleep(0)  # the task's I/O
        except Exception as exc:
            await sync_to_async(task.retry)(error=exc)
        else:
            await sync_to_async(task.complete)(result=f"drained {task.pk}")
        processed += 1
    return processed


def test_the_documented_aclaim_example_runs():
    AsyncDocument.objects.bulk_create(AsyncDocument() for _ in range(5))
    assert async_to_sync(drain)(AsyncDocument.objects.all()) == 5
    assert sorted(AsyncDocument.objects.values_list("result", flat=True)) == sorted(
        f"drained {pk}" for pk in AsyncDocument.objects.values_list("pk", flat=True)
    )
    assert AsyncDocument.objects.done().count() == 5


# -- how a handler is called (pure logic) -------------------------------------------------
def test_the_worker_reads_async_and_cancel_from_the_handler_signature():
    import functools

    from django_taskclaim.worker.bodies import Body

    def plain(task): ...
    def listening(task, cancel): ...
    def keyword_only(task, *, cancel=None): ...
    def catch_all(task, *args, **kwargs): ...
    async def coroutine(task): ...

    class Callable:
        async def __call__(self, task): ...

    assert Body.of(plain) == Body(plain, is_async=False, wants_cancel=False)
    assert Body.of(listening).wants_cancel
    assert Body.of(keyword_only).wants_cancel
    assert not Body.of(catch_all).wants_cancel  # only a parameter named `cancel` asks
    assert Body.of(coroutine).is_async
    assert Body.of(functools.partial(coroutine)).is_async
    assert Body.of(Callable()).is_async
    assert Body.of(AsyncDocument.process).is_async
    assert not Body.of(Document.process).is_async
    assert Body.of(listening).kwargs("flag") == {"cancel": "flag"}
    assert Body.of(plain).kwargs("flag") == {}
