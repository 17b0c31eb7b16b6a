"""A large ``after=`` and its prerequisites' settles (docs/workflows.md, "The cost of a
large after="): a member's settle during the enqueue does not wait for the enqueue's
transaction, and its outcome still counts: the dependent is released exactly when its
last prerequisite settled, never early, never missed. The enqueue is held open at a
controllable point (after its rows and edges are written, before its seal) while the
member settles on another connection. SQLite has one writer: a settle waits there for
the whole enqueue transaction, as for any other write, so the race is run on PostgreSQL
and MariaDB only."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.conf import settings
from django.db import connection

from django_taskclaim.models import TaskDependency
from django_taskclaim.settle.dependents import fan_in
from tests.support.helpers import wait_for
from tests.support.testapp.models import Document, Step

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        settings.DB_VENDOR == "sqlite", reason="SQLite has one writer: settles wait for it"
    ),
]

#: More than two of the seal's chunks of 500.
MEMBERS = 1200
#: How long the held enqueue waits for the test to let it go (the fix's absence makes
#: the member's settle wait this long, then the test fails).
HOLD = 60.0


def _hold_after_the_edges(monkeypatch) -> dict[str, Any]:
    """Hold every ``after=`` enqueue open after its rows and edges are written (its
    transaction open), until ``gate["go"]`` is set."""
    from django_taskclaim.model import enqueue

    real = enqueue.write_edges
    gate: dict[str, Any] = {"inside": threading.Event(), "go": threading.Event(), "let_go": None}

    def held(plan, model, objs, using):
        real(plan, model, objs, using)
        gate["inside"].set()
        gate["let_go"] = gate["go"].wait(timeout=HOLD)

    monkeypatch.setattr(enqueue, "write_edges", held)
    return gate


def _enqueue_in_a_thread(how: str, steps: list[Any]) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            if how == "create":
                out["rows"] = [Document.objects.create(title="join", after=steps, on_failure="run")]
            else:
                out["rows"] = Document.objects.enqueue_many(
                    [{"title": f"join {i}"} for i in range(3)], after=steps, on_failure="run"
                )
        except BaseException as exc:  # asserted below
            out["error"] = exc
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, out


@pytest.mark.parametrize("how", ["create", "enqueue_many"])
@pytest.mark.parametrize("ends", ["done", "failed"])
def test_a_members_settle_during_a_large_after_enqueue_finishes_and_still_counts(
    monkeypatch, how, ends
):
    steps = Step.objects.enqueue_many([{"name": f"m{i}"} for i in range(MEMBERS)])
    tasks = []
    while len(tasks) < MEMBERS:
        tasks += Step.objects.claim(100)
    before, during, *rest = tasks
    before.complete()  # settled before the enqueue reads it: its edge starts closed
    gate = _hold_after_the_edges(monkeypatch)
    thread, out = _enqueue_in_a_thread(how, steps)
    wait_for(gate["inside"].is_set, timeout=120, what="the enqueue's rows and edges written")

    # A member settles while the enqueue's transaction is open; its settle cannot see
    # the enqueue's edges. It must not wait for that transaction.
    if ends == "done":
        during.complete()
    else:
        during.fail("boom")
    assert thread.is_alive()
    assert "rows" not in out
    gate["go"].set()
    thread.join(timeout=120)
    assert not thread.is_alive()
    assert "error" not in out, out.get("error")
    assert gate["let_go"] is True, "the member's settle waited for the enqueue's commit"

    rows = out["rows"]
    for row in rows:
        counts = fan_in(row)
        assert counts is not None
        # the settle during the enqueue counted: seen by the enqueue's seal
        assert (counts.total, counts.open, counts.done) == (
            MEMBERS,
            MEMBERS - 2,
            2 if ends == "done" else 1,
        )
        assert counts.failed == (1 if ends == "failed" else 0)
        assert Document.objects.get(pk=row.pk).status == "waiting"
        assert row.status == "waiting"

    *most, last = rest
    Step.objects.complete_many(most)
    for row in rows:
        now = Document.objects.get(pk=row.pk)
        assert now.status == "waiting"  # never early: one member is still open
        assert fan_in(row).open == 1  # type: ignore[union-attr]
    last.complete()
    for row in rows:
        now = Document.objects.get(pk=row.pk)
        # released once, by the last member's settle: waiting -> ready bumped the token once
        assert (now.status, now.version) == ("ready", 1)
        counts = fan_in(row)
        assert counts is not None
        assert counts.open == 0
        assert counts.released
    assert not TaskDependency.objects.filter(outcome="").exists()


def test_every_member_settled_during_the_enqueue_releases_it_in_the_enqueue(monkeypatch):
    """The last prerequisites settle while the enqueue is open: the enqueue's own seal
    releases the row (no settle left to do it), and the instance says so."""
    steps = Step.objects.enqueue_many([{"name": f"m{i}"} for i in range(3)])
    tasks = Step.objects.claim(3)
    gate = _hold_after_the_edges(monkeypatch)
    thread, out = _enqueue_in_a_thread("create", steps)
    wait_for(gate["inside"].is_set, timeout=120, what="the enqueue's rows and edges written")
    for task in tasks:
        task.complete()
    gate["go"].set()
    thread.join(timeout=120)
    assert "error" not in out, out.get("error")
    (row,) = out["rows"]
    now = Document.objects.get(pk=row.pk)
    assert (now.status, now.version) == ("ready", 1)
    assert (row.status, row.version) == ("ready", 1)
    counts = fan_in(row)
    assert counts is not None
    assert (counts.open, counts.done, counts.released) == (0, 3, True)


ROUNDS = 8
RACING = 48


def _race_once(rnd: int) -> None:
    """One round: an enqueue ``after=`` ``RACING`` claimed rows, and two threads
    settling them, all released at once on their own connections."""
    steps = Step.objects.enqueue_many([{"name": f"{rnd}-{i}"} for i in range(RACING)])
    tasks = Step.objects.claim(RACING)
    assert len(tasks) == RACING
    halves = [tasks[rnd % 2 :: 2], tasks[1 - rnd % 2 :: 2]]
    barrier = threading.Barrier(3)
    out: dict[str, Any] = {}

    def settle(part: list[Any], i: int) -> None:
        try:
            barrier.wait(timeout=60)
            for task in part:
                task.complete()
        except BaseException as exc:  # asserted below
            out[f"settle {i}"] = exc
        finally:
            connection.close()

    def enqueue() -> None:
        try:
            barrier.wait(timeout=60)
            out["row"] = Document.objects.create(title=f"join {rnd}", after=steps)
        except BaseException as exc:  # asserted below
            out["enqueue"] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=enqueue)] + [
        threading.Thread(target=settle, args=(part, i)) for i, part in enumerate(halves)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
        assert not t.is_alive(), "a settle or the enqueue hung"
    assert set(out) == {"row"}, out
    made = out["row"]
    row = Document.objects.get(pk=made.pk)
    # released once (token 0 -> 1), unless every settle came before the enqueue's read
    started_ready = (made.status, made.version) == ("ready", 0)
    assert (row.status, row.version) == ("ready", 0 if started_ready else 1), rnd
    counts = fan_in(row)
    assert counts is not None
    assert (counts.open, counts.done, counts.released) == (0, RACING, True), rnd
    assert not TaskDependency.objects.filter(outcome="").exists(), rnd


def test_settles_racing_an_after_enqueue_release_it_once_after_the_last(monkeypatch):
    """No hook: an ``after=`` enqueue and the settles of all its prerequisites run at
    once on separate connections, the seal in chunks of 8 (so a settle may land before
    the enqueue's read, between it and the seal, between two of the seal's chunks, or
    after the commit). Each round the row is released exactly once, after every
    prerequisite settled, and no edge is left open."""
    from django_taskclaim.settle import dependents

    monkeypatch.setattr(dependents, "CHUNK", 8)
    for rnd in range(ROUNDS):
        _race_once(rnd)
        Document.objects.all().delete()
        Step.objects.all().delete()
        TaskDependency.objects.all().delete()


def test_a_keyed_row_the_seal_releases_while_its_key_is_held_is_skipped_as_a_duplicate(
    monkeypatch,
):
    """Features meet in the seal: its only prerequisite settles while the enqueue is open,
    so the enqueue's own seal releases the keyed row, and meanwhile another active row
    took its key. The row is skipped as a duplicate (as a settle's release would skip
    it), and the enqueue succeeds."""
    from tests.support.uniqueapp.models import KeyedStep

    step = Step.objects.create(name="p")
    task = Step.objects.claim_next()
    assert task is not None
    gate = _hold_after_the_edges(monkeypatch)
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["row"] = KeyedStep.objects.create(
                name="d", dedupe_key="k", after=[step], on_failure="run"
            )
        except BaseException as exc:  # asserted below
            out["error"] = exc
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    wait_for(gate["inside"].is_set, timeout=120, what="the enqueue's rows and edges written")
    task.complete()  # settles before the seal: its settle cannot see the new edge
    holder, created = KeyedStep.objects.enqueue_unique(dedupe_key="k", name="r")
    assert created
    gate["go"].set()
    thread.join(timeout=120)
    assert not thread.is_alive()
    assert "error" not in out, out.get("error")
    row = KeyedStep._base_manager.get(pk=out["row"].pk)
    assert row.status == "cancelled"
    assert "skipped as a duplicate" in row.last_error
    assert out["row"].status == "cancelled"  # the instance says what the row now is
    assert KeyedStep._base_manager.get(pk=holder.pk).status == "ready"
    assert Step._base_manager.get(pk=step.pk).status == "done"
