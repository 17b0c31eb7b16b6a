"""Many waits and emits of one event name at once (docs/workflows.md, "Waiting for an
event"): none of them fails because the others wait on or emit the same name — on
MySQL / MariaDB, the waits used to deadlock each other on the event row (a share lock
from the insert-if-absent, then ``FOR UPDATE``: InnoDB's error 1213, not retried). The
first emit of a name wins, exactly once however many race, and its payload is the one
stored. A deadlock or busy database that can still happen is retried whole."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta
from functools import partial
from typing import Any

import pytest
from django.db import OperationalError, connection, transaction
from django.db.models.functions import Now

from django_taskclaim import Parked, emit, run_task
from django_taskclaim.models import TaskEvent, TaskEventWait
from tests.support.helpers import BusyOnce, wait_for
from tests.support.testapp.models import Document
from tests.support.worker_handlers import SHARED_EVENT
from tests.support.worker_procs import WorkerProc

pytestmark = pytest.mark.django_db(transaction=True)


def _released_together(calls: list[Callable[[], Any]]) -> list[Any]:
    """Run each of ``calls`` on its own thread (its own connection), all released at
    once; return what each returned, in order. A call that raised fails the test."""
    barrier = threading.Barrier(len(calls))
    out: dict[int, Any] = {}
    errors: list[BaseException] = []

    def run(i: int, call: Callable[[], Any]) -> None:
        try:
            barrier.wait(timeout=60)
            out[i] = call()
        except BaseException as exc:  # reported below, with the others
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i, c)) for i, c in enumerate(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=180)
    assert not errors, f"{len(errors)} of {len(calls)} calls raised: {errors[0]!r}"
    assert len(out) == len(calls), "a thread did not finish"
    return [out[i] for i in range(len(calls))]


def _claimed(n: int, title: str) -> list[Any]:
    for i in range(n):
        Document.objects.create(title=f"{title} {i}")
    rows = Document.objects.filter(title__startswith=f"{title} ")
    return [rows.claim_next() for _ in range(n)]


def _waits_for(name: str) -> Callable[[Any], dict[str, str]]:
    def body(task: Any) -> dict[str, str]:
        return {"result": f"got {task.wait_for_event(name, 600)}"}

    return body


def _waits(tasks: list[Any], name: str) -> list[Callable[[], Any]]:
    """A run of each claimed row of ``tasks`` whose body waits for ``name``."""
    return [partial(run_task, task, _waits_for(name)) for task in tasks]


def _emits(name: str, payloads: Any) -> list[Callable[[], bool]]:
    """An emit of ``name`` with each of ``payloads``."""
    return [partial(emit, name, payload) for payload in payloads]


def _last_line(error: str) -> str:
    """The last line of a recorded error (the exception, after its traceback)."""
    return error.strip().splitlines()[-1]


def _due_now(title: str) -> int:
    """How many of the rows titled ``title …`` are due within a second."""
    rows = Document.objects.filter(title__startswith=f"{title} ", status="ready")
    return rows.filter(run_after__lte=Now() + timedelta(seconds=1)).count()


def test_many_waits_of_one_name_at_once_all_park_and_one_emit_wakes_them_all():
    """12 rows wait for one name on 12 connections released together (the event row
    made by the first of them), three rounds; then three emits race. Every wait parks
    its row (none fails: no error, no attempt counted), exactly one emit wins, and every
    row is due at once."""
    for rnd in range(3):
        name, title = f"many-{rnd}", f"round {rnd}"
        tasks = _claimed(12, title)
        outcomes = _released_together(_waits(tasks, name))
        rows = Document.objects.filter(title__startswith=f"{title} ")
        errors = [e for e in rows.values_list("last_error", flat=True) if e]
        assert not errors, f"round {rnd}: {len(errors)} waits failed: {_last_line(errors[0])}"
        assert set(outcomes) == {"ready"}
        assert list(rows.values_list("attempts", flat=True).distinct()) == [0]
        assert TaskEventWait.objects.filter(name=name).count() == 12
        sent = _released_together(_emits(name, range(3)))
        assert sent.count(True) == 1, f"round {rnd}: emits returned {sent}"
        assert _due_now(title) == 12, f"round {rnd}: a parked row was not woken"


def test_waits_and_emits_of_one_name_released_together_never_fail():
    """Eight waits and three emits of one name, all released at once, three rounds:
    each wait either got the winner's payload or parked a row the emit made due; none
    failed, one emit won."""
    for rnd in range(3):
        name, title = f"mixed-{rnd}", f"mixed {rnd}"
        tasks = _claimed(8, title)
        calls = _waits(tasks, name)
        calls += _emits(name, [f"from {k}" for k in range(3)])
        out = _released_together(calls)
        sent, waited = out[8:], out[:8]
        assert sent.count(True) == 1, f"round {rnd}: emits returned {sent}"
        winner = f"from {sent.index(True)}"
        rows = Document.objects.filter(title__startswith=f"{title} ")
        errors = [e for e in rows.values_list("last_error", flat=True) if e]
        assert not errors, f"round {rnd}: {len(errors)} waits failed: {_last_line(errors[0])}"
        done = rows.filter(status="done")
        assert waited.count("done") == done.count()
        assert set(done.values_list("result", flat=True)) <= {f"got {winner}"}
        assert _due_now(title) == 8 - done.count(), f"round {rnd}: a parked row was not woken"


def _wait_in_transaction(task: Any, name: str) -> Any:
    """``task.wait_for_event(name)`` inside the caller's transaction (which nothing can
    retry from inside): the payload, or ``"parked"`` (the park commits with the block)."""
    with transaction.atomic():
        try:
            return task.wait_for_event(name, 600)
        except Parked:
            return "parked"


def _emit_in_transaction(name: str, payload: Any) -> bool:
    with transaction.atomic():  # a web request's transaction, say
        return emit(name, payload)


def test_waits_and_emits_inside_the_callers_transactions_do_not_deadlock_each_other():
    """As above, each call inside its caller's transaction, where a deadlock could not be
    retried: ten waits of a new name at once (the event row made by one of them), then
    six more waits and three emits at once. None raises; one emit wins; every row got
    the winner's payload or is parked and due at once."""
    for rnd in range(3):
        name, title = f"in-tx-{rnd}", f"in tx {rnd}"
        tasks = _claimed(16, title)
        first = _released_together([partial(_wait_in_transaction, t, name) for t in tasks[:10]])
        assert first == ["parked"] * 10
        calls = [partial(_wait_in_transaction, t, name) for t in tasks[10:]]
        calls += [partial(_emit_in_transaction, name, f"from {k}") for k in range(3)]
        out = _released_together(calls)
        sent, then = out[6:], out[:6]
        assert sent.count(True) == 1, f"round {rnd}: emits returned {sent}"
        winner = f"from {sent.index(True)}"
        assert set(then) <= {"parked", winner}
        assert _due_now(title) == 10 + then.count("parked"), f"round {rnd}: a wake-up was lost"


@pytest.mark.parametrize("awaited_before", [False, True], ids=["first-emit", "awaited-before"])
def test_racing_emits_of_one_name_exactly_one_wins_and_its_payload_is_stored(awaited_before):
    """Four emits of one name on four connections released together, 30 rounds: exactly
    one returns ``True`` and the stored payload is its own. With the event row already
    there (a row waited for it), only the emit's lock on that row decides; without it
    the insert of the row does too. (SQLite: one writer at a time decides.)"""
    for rnd in range(30):
        name = f"first-{rnd}"
        if awaited_before:
            (task,) = _claimed(1, f"awaits {rnd}")
            assert run_task(task, _waits_for(name)) == "ready"
            assert TaskEvent.objects.filter(name=name, emitted_at=None).exists()
        sent = _released_together(_emits(name, [{"from": k} for k in range(4)]))
        assert sent.count(True) == 1, f"round {rnd}: emits returned {sent}"
        stored = TaskEvent.objects.get(name=name)
        assert stored.payload == {"from": sent.index(True)}
        assert stored.emitted_at is not None


def test_a_wait_that_finds_the_database_busy_is_retried_whole(caplog):
    """A transient error inside the wait (here at the row's parking, its last statement)
    rolls the whole try back, wait record included, and the wait runs again."""
    (task,) = _claimed(1, "busy wait")
    token = task.version
    busy = BusyOnce("UPDATE")
    with (
        caplog.at_level("DEBUG", logger="django_taskclaim.db"),
        connection.execute_wrapper(busy),
        pytest.raises(Parked),
    ):
        task.wait_for_event("busy", 60)
    assert busy.left == 0
    assert any(
        m.startswith("retrying what=wait for event 'busy' attempt=1 ") for m in caplog.messages
    )
    row = Document.objects.get(pk=task.pk)
    assert (row.status, row.attempts, row.version) == ("ready", 0, token + 1)
    assert TaskEventWait.objects.filter(name="busy").count() == 1


def test_an_emit_that_finds_the_database_busy_is_retried_whole(caplog):
    (task,) = _claimed(1, "busy emit")
    assert run_task(task, _waits_for("busy")) == "ready"
    busy = BusyOnce("UPDATE")
    with caplog.at_level("DEBUG", logger="django_taskclaim.db"), connection.execute_wrapper(busy):
        assert emit("busy", 7) is True
    assert busy.left == 0
    assert any(m.startswith("retrying what=emit 'busy' attempt=1 ") for m in caplog.messages)
    assert TaskEvent.objects.get(name="busy").payload == 7
    assert _due_now("busy emit") == 1


def test_an_emit_inside_the_callers_transaction_is_not_retried():
    """The caller's transaction cannot be retried from inside: the error is raised and
    the caller's block rolls back (nothing emitted)."""
    busy = BusyOnce("UPDATE")
    with (
        connection.execute_wrapper(busy),
        pytest.raises(OperationalError),
        transaction.atomic(),
    ):
        emit("in tx", 1)
    assert not TaskEvent.objects.filter(name="in tx").exclude(emitted_at=None).exists()


def test_a_fleet_of_workers_waiting_for_one_event_runs_every_row_once_after_one_emit(procs):
    """60 rows whose bodies wait for the same event on 3 worker processes x 2 threads;
    once every row is parked, four emits race. Every row is then done with the winner's
    payload, in one counted attempt: no wait failed, none was retried as an error."""
    n = 60
    Document.objects.bulk_create([Document(title=f"fleet {i}") for i in range(n)])
    meta = {
        "handler": "tests.support.worker_handlers.process_after_shared_event",
        "retry_backoff": 0.1,  # a failed wait comes back soon: its error is seen, not waited out
        "retry_backoff_max": 0.5,
    }
    for _ in range(3):
        procs.append(WorkerProc("testapp.Document", "--concurrency", "2", "--poll", "0.2",
                                claim_meta=meta))  # fmt: skip
    rows = Document.objects.filter(title__startswith="fleet ")
    wait_for(
        lambda: (
            TaskEventWait.objects.filter(name=SHARED_EVENT).count()
            + rows.filter(status="failed").count()
            == n
        ),
        timeout=240,
        what="every row parked (or failed)",
    )
    counted = list(rows.exclude(attempts=0).values_list("last_error", flat=True))
    assert not counted, f"{len(counted)} of {n} waits failed first: {_last_line(counted[0])}"
    sent = _released_together(_emits(SHARED_EVENT, [f"go {k}" for k in range(4)]))
    assert sent.count(True) == 1, f"emits returned {sent}"
    winner = f"go {sent.index(True)}"
    wait_for(lambda: rows.filter(status__in=["done", "failed"]).count() == n, timeout=240,
             what="every row finished after the emit")  # fmt: skip
    for w in procs:
        assert w.stop() == 0, w.stderr()[-2000:]
    failed = list(rows.exclude(status="done").values_list("last_error", flat=True))
    assert not failed, f"{len(failed)} of {n} rows failed: {_last_line(failed[0])}"
    assert set(rows.values_list("result", flat=True)) == {f"got {winner}"}
    retried = rows.exclude(attempts=1).count()
    assert retried == 0, f"{retried} of {n} rows ran more than one counted attempt"
    assert not TaskEventWait.objects.exists()
