"""The worker's pieces, one at a time, in this process (no subprocess): the ledger's
rules, the claimer's statement count, outcome settlement, the ack fallback, the heartbeat
that never dies and the exit code of a worker whose executors keep crashing.

The end-to-end behaviour (real processes, real signals) is in test_worker*.py."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
from django.db import DatabaseError

from django_taskclaim import Fail, Retry
from django_taskclaim.exceptions import ClaimLost
from django_taskclaim.model.queryset import ClaimQuerySet
from django_taskclaim.settle.batch import BatchableResult
from django_taskclaim.settle.outcome import Attempt, TaskAborted, attempt, settle
from django_taskclaim.worker import EXIT_BROKEN, EXIT_OK, Worker, WorkerConfig
from django_taskclaim.worker import acks as acks_module
from django_taskclaim.worker.acks import Acks
from django_taskclaim.worker.claimer import Budget
from django_taskclaim.worker.executors import Executors
from django_taskclaim.worker.exits import MAX_CRASHES
from django_taskclaim.worker.ledger import Ledger
from django_taskclaim.worker.maintenance.heartbeat import Heartbeat
from tests.support.helpers import wait_for
from tests.support.testapp.models import Document


def row(pk: int, version: int = 1) -> SimpleNamespace:
    return SimpleNamespace(pk=pk, version=version)


# -- the ledger (pure logic) ------------------------------------------------------------
def test_ledger_asks_for_a_full_claim_when_it_fits_else_only_for_idle_executors():
    ledger = Ledger(capacity=8, claim_size=4)
    assert ledger.room() == 4
    ledger.add_claimed([row(1), row(2), row(3), row(4), row(5)])
    assert ledger.room() == 0  # 3 free slots, but rows are waiting: no small claim yet
    for me in "abcde":
        ledger.take(me, timeout=0)
    assert ledger.room() == 3  # nothing waiting: top up what the executors can start
    ledger.settled("a")
    assert ledger.room() == 4


def test_a_finishing_row_frees_its_slot_but_stays_held_until_settled():
    ledger = Ledger(capacity=1, claim_size=1)  # --batch 1 --concurrency 1
    ledger.add_claimed([row(1)])
    ledger.take("a", timeout=0)
    assert ledger.room() == 0  # its body runs: nothing is claimed behind it
    ledger.finishing("a")  # the body returned; the outcome is being written
    assert ledger.room() == 1  # the next row may be claimed meanwhile
    assert [t.pk for t in ledger.held()] == [1]  # still held: its lease is kept
    assert ledger.in_flight() == 1
    ledger.add_claimed([row(2)])
    assert ledger.room() == 0
    ledger.settled("a")
    assert ledger.room() == 0  # row 2 waits for the executor: no more claimed
    assert [t.pk for t in ledger.held()] == [2]
    ledger.finishing("b")  # a thread with no running row changes nothing
    assert ledger.room() == 0


def test_ledger_hands_rows_out_in_claim_order_once_each():
    ledger = Ledger(capacity=10, claim_size=10)
    ledger.add_claimed([row(1), row(2), row(3)])
    taken = [ledger.take(str(i), timeout=0) for i in range(4)]
    assert [t.pk if t else None for t in taken] == [1, 2, 3, None]
    assert ledger.in_flight() == 3
    for i in range(3):
        ledger.settled(str(i))
    assert ledger.in_flight() == 0
    assert ledger.processed == 3


def test_a_stopped_ledger_starts_nothing_and_refuses_new_rows():
    ledger = Ledger(capacity=10, claim_size=10)
    ledger.add_claimed([row(1), row(2)])
    ledger.stop()
    assert ledger.take("a", timeout=0) is None
    assert [t.pk for t in ledger.take_unstarted()] == [1, 2]
    assert ledger.add_claimed([row(3)]) is False  # the claimer must release it
    assert ledger.closed
    assert ledger.room() == 0


def test_a_closed_ledger_still_hands_out_what_it_holds():
    ledger = Ledger(capacity=10, claim_size=10)
    ledger.add_claimed([row(1)])
    ledger.close()
    assert ledger.take("a", timeout=0).pk == 1
    assert ledger.take("b", timeout=0) is None


def test_claimer_budget_of_max_tasks():
    budget = Budget(12)
    assert budget.reserve(10) == 10
    assert budget.reserve(10) == 2
    assert budget.reserve(10) == 0  # spent
    budget.unreserve(5)  # five were not found
    assert budget.reserve(10) == 5


def test_ledger_acks_wait_for_the_window_or_the_size():
    ledger = Ledger(capacity=10, claim_size=10)
    assert ledger.defer_ack(row(1)) is True  # a new buffer: a new deadline
    assert ledger.defer_ack(row(2)) is False
    assert ledger.take_acks(window=60, size=3) == []
    ledger.defer_ack(row(3))
    assert [t.pk for t in ledger.take_acks(window=60, size=3)] == [1, 2, 3]
    ledger.defer_ack(row(4))
    assert ledger.acks_due_at(60) is not None
    assert [t.pk for t in ledger.take_acks()] == [4]  # no window: everything now
    assert ledger.acks_due_at(60) is None


def test_a_completion_being_written_keeps_its_lease_until_the_writer_is_done():
    """A writer took the buffer (its UPDATE may wait on a row lock): the rows stay held,
    so the heartbeat keeps renewing them, until the writer says it is done with them."""
    ledger = Ledger(capacity=10, claim_size=10)
    ledger.defer_ack(row(1))
    taken = ledger.take_acks()
    assert [t.pk for t in ledger.held()] == [1]
    assert ledger.startable() == []  # nothing to stop: its body has returned
    ledger.acks_written(taken)
    assert ledger.held() == []


def test_ledger_lost_rows():
    ledger = Ledger(capacity=10, claim_size=10)
    waiting, running, moved_on = row(1), row(2), row(3, version=5)
    ledger.add_claimed([running, waiting, moved_on])
    assert ledger.take("a", timeout=0) is running
    assert ledger.mark_lost(waiting, 1) == "claimed"  # dropped: never started
    assert ledger.mark_lost(running, 1) == "running"
    assert ledger.mark_lost(moved_on, 4) is None  # its token moved on since the snapshot
    assert ledger.is_lost(running)
    assert not ledger.is_lost(moved_on)
    assert [t.pk for t in ledger.take_unstarted()] == [3]


def test_a_recovered_row_stops_claims_and_waits_to_run_alone():
    ledger = Ledger(capacity=10, claim_size=2)
    recovered = row(9)
    ledger.add_claimed([row(1), recovered], alone=recovered)
    assert ledger.room() == 0  # nothing more is claimed while it is held
    assert ledger.holds_recovered()
    ledger.take("a", timeout=0)
    ledger.take("b", timeout=0)
    assert ledger.wait_alone("b", timeout=0) is False  # row 1 still runs beside it
    ledger.settled("a")
    assert ledger.wait_alone("b", timeout=0) is True
    ledger.settled("b")
    assert not ledger.holds_recovered()
    assert ledger.room() == 2


def test_ledger_held_rows_are_claimed_running_and_unacknowledged():
    ledger = Ledger(capacity=10, claim_size=10)
    ledger.add_claimed([row(1), row(2), row(3)])
    ledger.take("a", timeout=0)
    ledger.take("b", timeout=0)
    ledger.defer_ack(row(9))
    assert sorted(t.pk for t in ledger.held()) == [1, 2, 3, 9]
    assert sorted(t.pk for t in ledger.held(skip_running=lambda t: t.pk == 2)) == [1, 3, 9]


# -- configuration ----------------------------------------------------------------------
@pytest.mark.django_db
def test_config_keeps_processes_and_a_heartbeat_under_half_the_lease(settings):
    settings.TASKCLAIM_HEARTBEAT_INTERVAL = None
    config = WorkerConfig.build(["testapp.Document"], processes="3", lease="9")
    assert config.processes == 3
    assert config.lease_for(Document) == 9.0
    assert config.heartbeat_interval == 3.0


# -- settlement (lifecycle.settle) -------------------------------------------------------
pytestmark_db = pytest.mark.django_db(transaction=True)


def claimed(**payload) -> Document:
    Document.objects.create(title="t", payload=payload)
    return Document.objects.claim_next()


@pytestmark_db
def test_settle_records_each_kind_of_outcome():
    assert settle(claimed(), Attempt(result={"result": "ok"})) == "done"
    assert Document.objects.filter(status="done", result="ok").count() == 1
    assert settle(claimed(), Attempt(error=Retry(delay=60))) == "ready"
    assert settle(claimed(), Attempt(error=Fail("no"))) == "failed"
    assert settle(claimed(), Attempt(error=ValueError("x"))) == "ready"
    assert settle(claimed(), Attempt(error=ClaimLost("gone"))) == "lost"
    assert settle(claimed(), Attempt(result={"no_such_field": 1})) == "ready"


@pytestmark_db
def test_settle_defers_plain_results_and_writes_fielded_ones_at_once():
    deferred: list = []
    plain = claimed()
    assert settle(plain, Attempt(result=None), defer=deferred.append) == "deferred"
    assert deferred == [plain]
    assert Document.objects.get(pk=plain.pk).status == "processing"
    batchable = claimed()
    result = BatchableResult({"result": "b"})
    assert settle(batchable, Attempt(result=result), defer=deferred.append) == "deferred"
    fielded = claimed()
    assert settle(fielded, Attempt(result={"result": "f"}), defer=deferred.append) == "done"


@pytestmark_db
def test_settling_twice_writes_once():
    task = claimed()
    done = Attempt(result={"result": "1"})
    assert settle(task, done) == "done"
    stale = Document.objects.get(pk=task.pk)
    stale.version -= 1
    stale.status = "processing"
    assert settle(stale, done) == "lost"  # the repeat after a lost connection: fenced


@pytestmark_db
def test_attempt_turns_a_base_exception_into_the_tasks_failure_in_a_worker():
    task = claimed()

    def body(_row):
        raise SystemExit(3)

    done = attempt(task, body, catch_base_exceptions=True)
    assert isinstance(done.error, TaskAborted)
    assert isinstance(done.error.__cause__, SystemExit)
    assert settle(task, done) == "ready"
    assert "SystemExit" in Document.objects.get(pk=task.pk).last_error
    with pytest.raises(SystemExit):
        attempt(claimed(), body)  # outside a worker it propagates


# -- acks --------------------------------------------------------------------------------
@pytestmark_db
def test_a_batched_ack_that_fails_for_a_non_connection_reason_is_written_one_by_one(
    monkeypatch,
):
    for i in range(3):
        Document.objects.create(title=str(i))
    tasks = Document.objects.claim(3)
    ledger = Ledger(capacity=10, claim_size=10)
    acks = Acks(ledger, window=1, batch=3, using="default", worker_id="w", halt=threading.Event())
    for t in tasks:
        acks.defer(t)

    def broken(_tasks):
        raise DatabaseError("the batched statement does not suit this table")

    monkeypatch.setattr(acks_module, "complete_many", broken)
    acks.flush()
    assert Document.objects.filter(status="done").count() == 3
    assert ledger.take_acks() == []


# -- the heartbeat never dies ------------------------------------------------------------
@pytestmark_db
def test_the_heartbeat_thread_survives_an_unexpected_error():
    ledger = Ledger(capacity=10, claim_size=10)
    halt = threading.Event()
    calls: list[int] = []

    class Flaky:
        db = "default"

        def touch(self):
            calls.append(1)
            if len(calls) == 1:
                raise RuntimeError("a bug in a registry hook")

    beat = Heartbeat(
        ledger, Flaky(), interval=0.05, lease_for=lambda m: 30.0,  # type: ignore[arg-type]
        using="default", worker_id="w", halt=halt,
    )  # fmt: skip
    beat.start()
    try:
        wait_for(lambda: len(calls) >= 3, timeout=10, what="beats after the error")
        assert beat.is_alive()
    finally:
        halt.set()
        beat.join(5)


# -- one claimer per process; executors that keep crashing -------------------------------
@pytestmark_db
def test_one_claimer_feeds_every_executor(settings, monkeypatch):
    settings.TASKCLAIM_REAP_INTERVAL = 3600
    Document.objects.bulk_create(Document(title=str(i)) for i in range(60))
    calls: list[tuple[str, int, int]] = []  # (thread, rows asked, rows got)
    claim = ClaimQuerySet.claim

    def recorded(self, n=1, **kwargs):
        rows = claim(self, n, **kwargs)
        calls.append((threading.current_thread().name, n, len(rows)))
        return rows

    monkeypatch.setattr(ClaimQuerySet, "claim", recorded)
    config = WorkerConfig.build(
        ["testapp.Document"], concurrency=4, batch=5, burst=True, ack_window=0.05, reap=False
    )
    worker = Worker(config)
    assert worker.run() == EXIT_OK
    assert Document.objects.filter(status="done").count() == 60
    # Every claim statement came from the one claimer thread, none larger than
    # max(batch, concurrency) = 5, and a burst ends on at most two empty claims (one
    # while the last rows run, one after they settled); per-thread claiming would make
    # at least one per executor.
    assert {thread for thread, _n, _got in calls} == {"taskclaim-claimer"}
    assert max(n for _t, n, _got in calls) == 5
    assert [got for _t, _n, got in calls].count(0) in (1, 2)
    assert worker.claimer.claims == len(calls)


@pytestmark_db
def test_a_worker_whose_executors_keep_crashing_exits_5_and_gives_its_rows_back(
    monkeypatch, settings
):
    settings.TASKCLAIM_REAP_INTERVAL = 3600
    Document.objects.bulk_create(Document(title=str(i)) for i in range(3))

    def crash(self, me):
        raise RuntimeError("executor bug")

    monkeypatch.setattr(Executors, "_loop", crash)
    worker = Worker(WorkerConfig.build(["testapp.Document"], concurrency=2, reap=False))
    assert worker.run() == EXIT_BROKEN
    assert len(worker.executors._crashes) >= MAX_CRASHES
    states = list(Document.objects.values_list("status", "attempts"))
    assert states == [("ready", 0)] * 3  # none lost, none charged


def test_lease_report_tells_the_supervisor_the_earliest_kill_time_and_none_when_idle():
    """What a ``--processes`` child writes on its supervisor's pipe (``worker.leasewatch``):
    a claim counts as held from before it is sent; its rows keep that time; a claim that
    found nothing, or rows that are gone, leave nothing to watch (``null``); a renewal
    moves the time on."""
    import json
    import os

    from django_taskclaim.worker.leasewatch import LeaseReport, kill_margin, lease_until

    read_end, write_end = os.pipe()
    os.set_blocking(read_end, False)

    def sent() -> list:
        try:
            data = os.read(read_end, 65536)
        except BlockingIOError:
            return []
        return [json.loads(line)["kill_at"] for line in data.decode().splitlines()]

    try:
        ledger = Ledger(capacity=4, claim_size=4)
        report = LeaseReport(write_end, ledger, worker_id="w")
        key = report.claiming(100.0, 10.0)
        assert sent() == [100.0 + 10.0 - kill_margin(10.0)] == [108.0]
        report.claimed(key, rows=False)
        assert sent() == [None]  # nothing held: nothing to watch
        key = report.claiming(200.0, 10.0)
        task = Document(pk=1, version=1)
        lease_until(task, 200.0, 10.0)
        assert ledger.add_claimed([task])
        report.claimed(key, rows=True)
        assert sent() == [208.0]  # the claim's time, kept by its row
        report.refresh()
        assert sent() == []  # unchanged: nothing written
        lease_until(task, 203.0, 10.0)  # a renewal
        report.refresh()
        assert sent() == [211.0]
        assert ledger.take_unstarted() == [task]
        report.refresh()
        assert sent() == [None]
        assert (kill_margin(100.0), kill_margin(4.0)) == (2.0, 1.0)  # a quarter, at most 2 s
    finally:
        os.close(read_end)
        os.close(write_end)
