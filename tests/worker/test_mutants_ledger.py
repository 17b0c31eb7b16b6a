"""The worker's ledger (``django_taskclaim/worker/ledger.py``) at the points the worker-piece
tests do not look (docs/testing.md, "Mutation testing"): which row runs alone, what a
lost claim drops, which rows a lapsing lease must stop, what stays held while its
completion is written, and the waits — each returns as soon as its condition holds
(woken by the change from another thread, not at its timeout), and False at its timeout
when it does not.

Pure logic, in this process; the rows are plain objects with a ``pk`` and a ``version``.
"""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

from django_taskclaim.worker.ledger import Ledger
from tests.support.helpers import wait_for

LONG = 10.0  # a wait's timeout that a test must never reach


def row(pk: int, version: int = 1) -> SimpleNamespace:
    return SimpleNamespace(pk=pk, version=version)


class Call:
    """``fn(*args)`` in a thread of its own (a daemon: a wait that never ends must fail the
    test, not hang it)."""

    def __init__(self, fn, *args, **kwargs) -> None:
        self.result: object = "not returned"
        self.thread = threading.Thread(target=self._run, args=(fn, args, kwargs), daemon=True)
        self.thread.start()

    def _run(self, fn, args, kwargs) -> None:
        self.result = fn(*args, **kwargs)

    def returned(self, within: float = LONG / 2) -> object:
        """What it returned, which it must have done ``within`` seconds."""
        self.thread.join(within)
        assert not self.thread.is_alive(), "still waiting"
        return self.result


def until(condition, within: float = 2.0) -> bool:
    """Wait (``wait_for``, its deadline ``within``) for ``condition()``: a waiter
    registering itself."""
    return bool(wait_for(condition, timeout=within, interval=0.002, what="the waiter"))


class Counting(threading.Condition):
    """A condition that counts the notifications it is given."""

    def __init__(self, lock) -> None:
        super().__init__(lock)
        self.notified = 0

    def notify(self, n: int = 1) -> None:
        self.notified += 1
        super().notify(n)

    def notify_all(self) -> None:
        self.notified += 1
        super().notify_all()


def no_waiters(ledger: Ledger) -> bool:
    """Every wait has unregistered itself (the next change wakes no one for nothing)."""
    return (ledger._watching, ledger._rows_waiting, ledger._room_waiting) == (0, 0, 0)


def running(ledger: Ledger, *rows: SimpleNamespace) -> list[str]:
    """Queue ``rows`` and start each in its own executor thread name; return the names."""
    ledger.add_claimed(list(rows))
    names = [f"t{r.pk}" for r in rows]
    for name, r in zip(names, rows, strict=True):
        assert ledger.take(name, timeout=0) is r
    return names


# -- which row runs alone ---------------------------------------------------------------
def test_only_the_row_queued_alone_runs_alone():
    ledger = Ledger(capacity=10, claim_size=10)
    plain, recovered = row(1), row(2)
    ledger.add_claimed([plain])
    assert not ledger.runs_alone(plain)  # nothing runs alone at all
    ledger.add_claimed([recovered], alone=recovered)
    assert ledger.runs_alone(recovered)
    assert not ledger.runs_alone(plain)


def test_a_recovered_row_lost_before_it_started_no_longer_holds_claims_back():
    ledger = Ledger(capacity=10, claim_size=2)
    recovered = row(9)
    ledger.add_claimed([row(1), recovered], alone=recovered)
    assert ledger.room() == 0
    assert ledger.holds_recovered()
    assert ledger.mark_lost(recovered, 1) == "claimed"
    assert not ledger.holds_recovered()
    assert not ledger.runs_alone(recovered)
    assert ledger.room() == 2


# -- lost claims ---------------------------------------------------------------------------
def test_a_row_whose_completion_is_being_written_is_not_marked_lost():
    ledger = Ledger(capacity=10, claim_size=10)
    done, other = row(1), row(2)
    ledger.defer_ack(done)
    assert ledger.take_acks() == [done]
    running(ledger, other)
    assert ledger.mark_lost(done, 1) is None  # its own write says whether it landed
    assert not ledger.is_lost(done)
    assert ledger.mark_lost(other, 1) == "running"
    assert ledger.is_lost(other)


def test_a_row_whose_body_returned_is_not_marked_lost_but_its_neighbour_is():
    ledger = Ledger(capacity=10, claim_size=10)
    finished, busy = row(1), row(2)
    first, _ = running(ledger, finished, busy)
    ledger.finishing(first)
    assert ledger.mark_lost(finished, 1) is None
    assert not ledger.is_lost(finished)
    assert ledger.mark_lost(busy, 1) == "running"
    assert ledger.is_lost(busy)
    assert [t.pk for t in ledger.running()] == [1, 2]  # both still run here


# -- what a lapsing lease must stop ------------------------------------------------------
def test_startable_rows_are_the_claimed_and_the_running_whose_body_has_not_returned():
    ledger = Ledger(capacity=10, claim_size=10)
    finished, busy, waiting = row(1), row(2), row(3)
    first, _ = running(ledger, finished, busy)
    ledger.add_claimed([waiting])
    ledger.finishing(first)
    assert sorted(t.pk for t in ledger.startable()) == [2, 3]
    assert sorted(t.pk for t in ledger.held()) == [1, 2, 3]  # its lease is still kept


def test_running_lists_the_rows_running_now():
    ledger = Ledger(capacity=10, claim_size=10)
    assert ledger.running() == []
    a, _ = running(ledger, row(1), row(2))
    ledger.settled(a)
    assert [t.pk for t in ledger.running()] == [2]


# -- completions being written ---------------------------------------------------------------
def test_acks_written_forgets_only_what_was_taken_and_tolerates_the_rest():
    ledger = Ledger(capacity=10, claim_size=10)
    one, two = row(1), row(2)
    ledger.defer_ack(one)
    taken = ledger.take_acks()
    ledger.defer_ack(two)  # buffered, not taken by a writer
    ledger.acks_written([two])  # not being written: nothing to forget, no error
    assert sorted(t.pk for t in ledger.held()) == [1, 2]
    ledger.acks_written(taken)
    ledger.acks_written(taken)  # twice: nothing left to forget
    assert [t.pk for t in ledger.held()] == [2]


def test_acks_fall_due_a_window_after_the_first():
    ledger = Ledger(capacity=10, claim_size=10)
    assert ledger.acks_due_at(30) is None
    ledger.defer_ack(row(1))
    first = time.monotonic()
    ledger.defer_ack(row(2))  # not a new deadline
    due = ledger.acks_due_at(30)
    assert due is not None
    assert 29 < due - first <= 30


# -- the waits -----------------------------------------------------------------------------
def test_wait_written_returns_once_the_writer_is_done_and_not_before():
    ledger = Ledger(capacity=10, claim_size=10)
    assert ledger.wait_written(0) is True  # nothing being written
    ledger.defer_ack(row(1))
    taken = ledger.take_acks()
    assert Call(ledger.wait_written, 0.05).returned() is False
    assert no_waiters(ledger)
    waits = [Call(ledger.wait_written, LONG) for _ in range(2)]
    assert until(lambda: ledger._watching == 2)  # both wait, registered
    ledger.acks_written(taken)
    assert [w.returned() for w in waits] == [True, True]  # woken, not timed out
    assert no_waiters(ledger)


def test_a_wait_under_a_second_still_waits_for_its_change():
    ledger = Ledger(capacity=10, claim_size=10)
    (name,) = running(ledger, row(1))
    wait = Call(ledger.wait_until_idle, 0.9)
    assert until(lambda: ledger._watching == 1, within=0.8)
    ledger.settled(name)
    assert wait.returned() is True
    assert no_waiters(ledger)


def test_wait_until_idle_is_woken_by_the_last_settled_row():
    ledger = Ledger(capacity=10, claim_size=10)
    first, second = running(ledger, row(1), row(2))
    assert Call(ledger.wait_until_idle, 0.05).returned() is False
    wait = Call(ledger.wait_until_idle, LONG)
    assert until(lambda: ledger._watching == 1)
    ledger.settled(first)  # one still runs: the wait goes on
    assert until(lambda: ledger._watching == 1)
    ledger.settled(second)
    assert wait.returned() is True
    assert no_waiters(ledger)


def test_wait_alone_returns_true_once_the_neighbour_settled():
    ledger = Ledger(capacity=10, claim_size=10)
    neighbour, me = running(ledger, row(1), row(9))
    assert Call(ledger.wait_alone, me, 0.05).returned() is False
    wait = Call(ledger.wait_alone, me, LONG)
    assert until(lambda: ledger._watching == 1)
    ledger.settled(neighbour)
    assert wait.returned() is True
    assert no_waiters(ledger)


def test_wait_alone_waits_for_every_neighbour():
    ledger = Ledger(capacity=10, claim_size=10)
    first, second, me = running(ledger, row(1), row(2), row(9))
    ledger.settled(first)  # one neighbour left: still not alone
    wait = Call(ledger.wait_alone, me, LONG)
    assert until(lambda: ledger._watching == 1)
    assert wait.thread.is_alive()
    ledger.settled(second)
    assert wait.returned() is True


def test_wait_alone_ends_at_a_stop_saying_not_alone():
    ledger = Ledger(capacity=10, claim_size=10)
    _, me = running(ledger, row(1), row(9))
    wait = Call(ledger.wait_alone, me, LONG)
    assert until(lambda: ledger._watching == 1)
    ledger.stop()
    assert wait.returned() is False  # stopped with a neighbour still running


def test_wait_settled_waits_for_the_given_rows_only():
    ledger = Ledger(capacity=10, claim_size=10)
    mine, other = row(1), row(2)
    first, second = running(ledger, mine, other)
    assert ledger.wait_settled([row(3)], 0) is True  # not running here
    assert Call(ledger.wait_settled, [mine], 0.05).returned() is False
    ledger.settled(second)
    assert ledger.wait_settled([other], 0) is True
    wait = Call(ledger.wait_settled, [mine, other], LONG)
    assert until(lambda: ledger._watching == 1)
    ledger.settled(first)
    assert wait.returned() is True
    assert no_waiters(ledger)


# -- executors waiting for rows ---------------------------------------------------------------
def test_take_times_out_with_nothing_claimed():
    ledger = Ledger(capacity=10, claim_size=10)
    assert Call(ledger.take, "a", 0.05).returned() is None
    assert no_waiters(ledger)


def test_waiting_executors_are_each_woken_by_a_row_to_take():
    ledger = Ledger(capacity=10, claim_size=10)
    first, second = row(1), row(2)
    takes = [Call(ledger.take, name, LONG) for name in ("a", "b")]
    assert until(lambda: ledger._rows_waiting == 2)  # both wait, registered
    ledger.add_claimed([first])
    assert until(lambda: any(t.result is first for t in takes))
    assert until(lambda: ledger._rows_waiting == 1)
    ledger.add_claimed([second])
    assert sorted(t.returned().pk for t in takes) == [1, 2]
    assert no_waiters(ledger)


def test_a_short_take_still_waits_for_its_row():
    ledger = Ledger(capacity=10, claim_size=10)
    take = Call(ledger.take, "a", 0.9)
    assert until(lambda: ledger._rows_waiting == 1, within=0.8)
    ledger.add_claimed([row(1)])
    assert take.returned().pk == 1


@pytest.mark.parametrize("end", ["close", "stop"])
def test_closing_wakes_every_waiting_executor_and_the_claimer(end):
    ledger = Ledger(capacity=1, claim_size=1)
    (held,) = running(ledger, row(1))  # full: the claimer waits for room
    claimer = Call(ledger.wait_for_room, LONG)
    takes = [Call(ledger.take, name, LONG) for name in ("b", "c")]
    assert until(lambda: (ledger._rows_waiting, ledger._room_waiting) == (2, 1))
    getattr(ledger, end)()
    assert [t.returned() for t in takes] == [None, None]
    assert claimer.returned() == 0  # closed: no more claims
    ledger.settled(held)
    assert no_waiters(ledger)


def test_a_recovered_rows_outcome_holds_every_start_back_until_it_is_written():
    ledger = Ledger(capacity=10, claim_size=4)
    recovered = row(9)
    me = "r"
    ledger.add_claimed([recovered], alone=recovered)
    assert ledger.take(me, 0) is recovered
    assert ledger.room() == 0  # its body may run: nothing more is claimed
    ledger.finishing(me)  # the body returned: the next rows may be claimed...
    assert not ledger.holds_recovered()
    assert ledger.room() == 4
    ledger.add_claimed([row(1), row(2)])
    assert ledger.take("a", 0) is None  # ...but none starts before its outcome is written
    takes = [Call(ledger.take, name, LONG) for name in ("a", "b")]
    assert until(lambda: ledger._rows_waiting == 2)
    ledger.settled(me)  # written: every waiting executor may go
    assert sorted(t.returned().pk for t in takes) == [1, 2]
    assert ledger.processed == 1


def test_an_ordinary_row_settled_wakes_no_waiting_executor():
    """Only a change that can concern them wakes executors (the ledger's point): a row
    settled while nothing is queued leaves the executors waiting for rows asleep."""
    ledger = Ledger(capacity=10, claim_size=10)
    ledger._rows_ready = Counting(ledger._lock)
    (name,) = running(ledger, row(1))
    take = Call(ledger.take, "b", LONG)
    assert until(lambda: ledger._rows_waiting == 1)
    ledger.settled(name)
    assert ledger._rows_ready.notified == 0
    ledger.add_claimed([row(2)])
    assert take.returned().pk == 2
    assert ledger._rows_ready.notified == 1


def test_settling_a_thread_that_holds_nothing_changes_nothing():
    ledger = Ledger(capacity=10, claim_size=10)
    (name,) = running(ledger, row(1))
    ledger.settled("nobody")
    assert ledger.processed == 0
    assert [t.pk for t in ledger.running()] == [1]
    ledger.settled(name)
    assert ledger.processed == 1


def test_a_change_that_frees_no_room_or_row_wakes_no_one():
    """A body that returned, or a row taken, does not wake executors waiting for rows, nor
    the claimer while there is still no room for a claim."""
    ledger = Ledger(capacity=2, claim_size=2)
    ledger._rows_ready = Counting(ledger._lock)
    ledger._room_ready = Counting(ledger._lock)
    first, queued = row(1), row(2)
    (name,) = running(ledger, first)
    ledger.add_claimed([queued])  # full: one running, one queued
    claimer = Call(ledger.wait_for_room, LONG)
    assert until(lambda: ledger._room_waiting == 1)
    before = ledger._rows_ready.notified
    assert ledger.take("b", 0) is queued  # still full
    assert ledger._room_ready.notified == 0
    take = Call(ledger.take, "c", LONG)
    assert until(lambda: ledger._rows_waiting == 1)
    ledger.finishing(name)  # a slot is free: the claimer may claim, no row to take
    assert ledger._rows_ready.notified == before
    assert claimer.returned() == 1
    ledger.close()
    assert take.returned() is None


def test_the_claimer_waits_for_room_and_is_woken_by_it():
    ledger = Ledger(capacity=2, claim_size=2)
    a, b = running(ledger, row(1), row(2))
    assert Call(ledger.wait_for_room, 0.05).returned() == 0
    assert no_waiters(ledger)
    claimer = Call(ledger.wait_for_room, LONG)
    assert until(lambda: ledger._room_waiting == 1)
    ledger.settled(a)
    assert claimer.returned() == 1  # one free slot, nothing queued: a small claim
    assert no_waiters(ledger)
    ledger.settled(b)
    assert ledger.wait_for_room(LONG) == 2  # room already: no wait


def test_room_is_a_full_claim_when_it_fits_even_with_rows_queued():
    ledger = Ledger(capacity=8, claim_size=4)
    ledger.add_claimed([row(i) for i in range(4)])  # queued, not started
    assert ledger.room() == 4  # exactly a full claim fits
    ledger = Ledger(capacity=2, claim_size=2)
    running(ledger, row(1))
    assert ledger.room() == 1  # one slot, nothing queued: top up


def test_a_buffered_completion_waits_for_its_window_without_a_size():
    ledger = Ledger(capacity=10, claim_size=10)
    ledger.defer_ack(row(1))
    assert ledger.take_acks(window=60) == []
    assert [t.pk for t in ledger.take_acks(window=0)] == [1]


def test_a_buffer_started_anew_meanwhile_is_not_taken_before_its_window():
    """take_acks() decides from a read without the lock, then again under it: a writer that
    found the old buffer due, and got the lock only after another took that buffer and a
    new one began, takes nothing."""
    ledger = Ledger(capacity=10, claim_size=10)
    real = ledger._lock
    entering = threading.Event()

    class Spy:
        def __enter__(self):
            entering.set()
            return real.__enter__()

        def __exit__(self, *exc):
            return real.__exit__(*exc)

    ledger.defer_ack(row(1))
    ledger._acks_since = time.monotonic() - 120  # due long ago
    with real:
        ledger._lock = Spy()
        late = Call(ledger.take_acks, window=60)
        assert entering.wait(LONG)  # it found the buffer due and waits for the lock
        # meanwhile another writer took that buffer and a new one began
        ledger._acks, ledger._acks_since = [row(2)], time.monotonic()
    assert late.returned() == []
    ledger._lock = real
    assert [t.pk for t in ledger.take_acks()] == [2]


def test_rows_given_back_unstarted_no_longer_hold_claims_back():
    ledger = Ledger(capacity=10, claim_size=2)
    recovered = row(9)
    ledger.add_claimed([recovered], alone=recovered)
    assert ledger.holds_recovered()
    assert ledger.take_unstarted() == [recovered]
    assert not ledger.holds_recovered()
    assert ledger.room() == 2


def test_counts_are_the_rows_in_flight_and_those_processed():
    ledger = Ledger(capacity=10, claim_size=10)
    assert ledger.closed is False
    a, _ = running(ledger, row(1), row(2))
    ledger.add_claimed([row(3)])
    ledger.settled(a)
    assert ledger.counts() == (2, 1)
    assert ledger.in_flight() == 2


def test_a_buffer_is_due_the_moment_its_window_ends(monkeypatch):
    clock = SimpleNamespace(now=1000.0)
    monkeypatch.setattr(
        "django_taskclaim.worker.ledger.time", SimpleNamespace(monotonic=lambda: clock.now)
    )
    ledger = Ledger(capacity=10, claim_size=10)
    ledger.defer_ack(row(1))  # the buffer begins at 1000
    clock.now = 1059.999
    assert ledger.take_acks(window=60) == []
    clock.now = 1060.0
    assert [t.pk for t in ledger.take_acks(window=60)] == [1]
