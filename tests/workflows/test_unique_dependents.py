"""A dependent's unique key never fails its prerequisite's settle (DESIGN.md, FEATURES
COMPOSE; docs/unique.md, docs/workflows.md).

A keyed row waiting for a prerequisite does not hold its key; when the prerequisite
settles, another active row may hold it. The dependent is then skipped as a duplicate:
``cancelled`` (fenced, token bumped, ``finished_at`` set) with a reason naming the key
and the row holding it, and its own dependents follow their policy. The prerequisite
ends as its body or operator said, on every path that settles one: ``complete()``, the
batched completion (in process and by a real worker), ``fail()``, ``retry()`` once the
attempts run out, the operator's cancel (one statement or in pages) and the reaper.
Real databases, no mocks."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import pytest
from django.conf import settings
from django.db import connection, transaction

from django_taskclaim.models import TaskDependency
from django_taskclaim.recovery.reap import reap
from django_taskclaim.settle import batch
from django_taskclaim.settle.dependents import fan_in
from tests.support.helpers import wait_for
from tests.support.testapp.models import Step
from tests.support.uniqueapp.models import KeyedStep, KeyedTally
from tests.support.worker_procs import WorkerProc

pytestmark = pytest.mark.django_db(transaction=True)

KEY = "report:42"


def fresh(row: Any) -> Any:
    return type(row)._base_manager.get(pk=row.pk)


def claim() -> Step:
    task = Step.objects.claim_next()
    assert task is not None
    return task


@dataclass
class Flow:
    """``prerequisite`` → ``dependent`` (keyed, ``waiting``) → ``then_cancel`` and
    ``then_run`` (its own dependents, one per policy); ``holder`` holds the key."""

    prerequisite: Step
    dependent: KeyedStep
    holder: KeyedStep
    then_cancel: Step
    then_run: Step


def make_flow(policy: str, key: str = KEY) -> Flow:
    prerequisite = Step.objects.create(name="p")
    dependent = KeyedStep.objects.create(
        name="d", dedupe_key=key, after=[prerequisite], on_failure=policy
    )
    assert fresh(dependent).status == "waiting"  # waiting: the key is not held yet
    holder, created = KeyedStep.objects.enqueue_unique(dedupe_key=key, name="r")
    assert created
    then_cancel = Step.objects.create(name="e-cancel", after=[dependent])
    then_run = Step.objects.create(name="e-run", after=[dependent], on_failure="run")
    return Flow(prerequisite, dependent, fresh(holder), then_cancel, then_run)


def assert_skipped(flow: Flow, key: str = KEY, then_run: str = "ready") -> None:
    """The dependent is cancelled as a duplicate, once, with its reason; the holder is
    untouched; the dependent's dependents followed their policies (the one that runs
    whatever its prerequisite's end is ``then_run``)."""
    row = fresh(flow.dependent)
    assert row.status == "cancelled", row.last_error
    assert row.version == 1  # one state change: waiting -> cancelled
    assert row.finished_at is not None
    assert "duplicate" in row.last_error
    assert f"dedupe_key {key!r}" in row.last_error
    assert f"uniqueapp.KeyedStep #{flow.holder.pk}" in row.last_error
    assert "when its prerequisites finished" in row.last_error
    holder = fresh(flow.holder)
    assert (holder.status, holder.version, holder.last_error) == ("ready", 0, "")
    assert holder.active_dedupe_key == key
    counts = fan_in(row)
    assert counts is not None
    assert counts.open == 0
    assert not counts.released
    cancelled = fresh(flow.then_cancel)
    assert cancelled.status == "cancelled"
    assert f"uniqueapp.KeyedStep #{row.pk} ended cancelled" in cancelled.last_error
    assert "duplicate" in cancelled.last_error
    assert fresh(flow.then_run).status == then_run
    assert not TaskDependency.objects.filter(outcome="").exists()


def settle(how: str, prerequisite: Step) -> str:
    """Settle ``prerequisite`` the way ``how`` says; return the state it must end in."""
    if how == "cancel":
        assert Step.objects.filter(pk=prerequisite.pk).cancel() == 1
        return "cancelled"
    if how == "cancel_in_pages":  # the admin's action: the rows in pages
        assert Step.objects.filter(pk=prerequisite.pk).cancel(batch_size=10) == 1
        return "cancelled"
    task = claim()
    assert task.pk == prerequisite.pk
    if how == "complete":
        task.complete()
        return "done"
    if how == "complete_many":
        assert batch.complete_many([task]) == []
        return "done"
    if how == "fail":
        task.fail("boom")
    elif how == "retry_exhausted":
        Step.objects.filter(pk=task.pk).update(attempts=99)
        task.attempts = 99
        task.retry(error="boom")
    else:
        assert how == "reap"
        Step.objects.filter(pk=task.pk).update(attempts=99, locked_until="2000-01-01T00:00Z")
        assert reap(Step).failed == 1
    return "failed"


RELEASING = [
    *[(how, policy) for how in ("complete", "complete_many") for policy in ("cancel", "run")],
    *[(how, "run") for how in ("fail", "retry_exhausted", "cancel", "cancel_in_pages", "reap")],
]


@pytest.mark.parametrize(("how", "policy"), RELEASING)
def test_a_released_dependent_whose_key_is_held_is_skipped_and_the_settle_stands(how, policy):
    flow = make_flow(policy)
    ended = settle(how, flow.prerequisite)
    assert fresh(flow.prerequisite).status == ended
    assert_skipped(flow)


@pytest.mark.parametrize("how", ["fail", "cancel", "reap"])
def test_a_failed_prerequisite_cancels_a_keyed_dependent_by_its_policy_not_as_a_duplicate(how):
    flow = make_flow("cancel")
    ended = settle(how, flow.prerequisite)
    assert fresh(flow.prerequisite).status == ended
    row = fresh(flow.dependent)
    assert row.status == "cancelled"
    assert f"testapp.Step #{flow.prerequisite.pk} ended {ended}" in row.last_error
    assert "duplicate" not in row.last_error
    assert fresh(flow.holder).version == 0


def test_a_dependent_whose_key_is_free_is_released_and_holds_it():
    prerequisite = Step.objects.create(name="p")
    dependent = KeyedStep.objects.create(dedupe_key=KEY, after=[prerequisite])
    earlier, _ = KeyedStep.objects.enqueue_unique(dedupe_key=KEY, name="finished meanwhile")
    assert KeyedStep.objects.filter(pk=earlier.pk).cancel() == 1  # the key is free again
    claim().complete()
    row = fresh(dependent)
    assert (row.status, row.version, row.last_error) == ("ready", 1, "")
    counts = fan_in(row)
    assert counts is not None
    assert counts.released
    found, created = KeyedStep.objects.enqueue_unique(dedupe_key=KEY)
    assert (found.pk, created) == (dependent.pk, False)


def test_a_dependent_without_a_key_is_released_beside_a_keyed_one():
    prerequisite = Step.objects.create(name="p")
    keyless = KeyedStep.objects.create(dedupe_key=None, after=[prerequisite])
    keyed = KeyedStep.objects.create(dedupe_key=KEY, after=[prerequisite])
    holder, _ = KeyedStep.objects.enqueue_unique(dedupe_key=KEY)
    claim().complete()
    assert fresh(keyless).status == "ready"
    assert fresh(keyed).status == "cancelled"
    assert fresh(holder).status == "ready"


def test_a_skipped_dependent_skips_its_own_keyed_dependent_when_that_key_is_held_too():
    flow = make_flow("run")
    last = KeyedStep.objects.create(
        name="last", dedupe_key="other", after=[flow.dependent], on_failure="run"
    )
    other, _ = KeyedStep.objects.enqueue_unique(dedupe_key="other")
    claim().complete()
    assert_skipped(flow)
    row = fresh(last)
    assert row.status == "cancelled"
    assert "dedupe_key 'other'" in row.last_error
    assert f"#{other.pk}" in row.last_error


@pytest.mark.parametrize("policy", ["cancel", "run"])
def test_a_real_worker_completes_the_prerequisite_and_skips_the_dependent(procs, policy):
    """The batched completion of a real worker (the default ack window): the body ran
    once and its row is ``done``, not failed as an outcome it could not store, and not
    run again."""
    flows = [make_flow(policy, key=f"{KEY}:{i}") for i in range(3)]
    free = KeyedStep.objects.create(dedupe_key="free", after=[flows[0].prerequisite])
    worker = WorkerProc(
        "testapp.Step", "--concurrency", "2", "--poll", "0.2", "--worker-id", "keyed"
    )
    procs.append(worker)

    def settled() -> bool:
        return not KeyedStep.objects.filter(status="waiting").exists() and not (
            Step.objects.filter(status__in=["ready", "processing", "waiting"]).exists()
        )

    wait_for(settled, timeout=120, what="every prerequisite settled, every dependent too")
    assert worker.stop() == 0, worker.stderr()[-3000:]
    assert "could not be stored" not in worker.stderr()
    for i, flow in enumerate(flows):
        prerequisite = fresh(flow.prerequisite)
        assert (prerequisite.status, prerequisite.attempts) == ("done", 1)
        assert_skipped(flow, key=f"{KEY}:{i}", then_run="done")  # released, then run
    assert fresh(free).status == "ready"


def _lock_waits() -> int:
    """Sessions now waiting for a row or key lock. InnoDB refreshes ``INNODB_TRX`` only
    when it was last read over 0.1 s ago: poll it more slowly than that."""
    sql = (
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
        "AND datname = current_database()"
        if connection.vendor == "postgresql"
        else "SELECT count(*) FROM information_schema.INNODB_TRX WHERE trx_state = 'LOCK WAIT'"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql)
        return int(cursor.fetchone()[0])


@pytest.mark.skipif(settings.DB_VENDOR == "sqlite", reason="SQLite has one writer")
@pytest.mark.parametrize("commits", [True, False], ids=["enqueue-commits", "enqueue-rolls-back"])
def test_an_uncommitted_enqueue_of_the_key_decides_the_release_when_it_ends(commits):
    """The race made on purpose: an ``enqueue_unique()`` of the dependent's key has
    inserted its row but not committed when the prerequisite's completion releases the
    dependent. The release waits for it; if it commits, the dependent is skipped as a
    duplicate of that row and the completion still stands; if it rolls back, the
    dependent is released."""
    prerequisite = Step.objects.create(name="p")
    dependent = KeyedStep.objects.create(dedupe_key=KEY, after=[prerequisite])
    task = claim()
    inserted, finish = threading.Event(), threading.Event()
    box: dict[str, Any] = {}

    def enqueue() -> None:
        try:
            with transaction.atomic():
                row, created = KeyedStep.objects.enqueue_unique(dedupe_key=KEY, name="r")
                box["holder"] = row.pk if created else None
                inserted.set()
                assert finish.wait(60)
                if not commits:
                    transaction.set_rollback(True)
        except BaseException as exc:  # asserted below
            box["enqueue"] = exc
            inserted.set()
        finally:
            connection.close()

    def complete() -> None:
        try:
            task.complete()
            box["completed"] = True
        except BaseException as exc:  # asserted below
            box["complete"] = exc
        finally:
            connection.close()

    enqueuer = threading.Thread(target=enqueue)
    enqueuer.start()
    assert inserted.wait(60)
    assert "enqueue" not in box, box
    settler = threading.Thread(target=complete)
    settler.start()
    try:
        wait_for(
            lambda: _lock_waits() >= 1,
            timeout=60,
            interval=0.25,
            what="the release waiting for the key",
        )
    finally:
        finish.set()
        enqueuer.join(60)
        settler.join(60)
    assert not enqueuer.is_alive()
    assert not settler.is_alive()
    assert box.get("completed") is True, box
    assert fresh(prerequisite).status == "done"
    row = fresh(dependent)
    if commits:
        assert row.status == "cancelled"
        assert f"uniqueapp.KeyedStep #{box['holder']}" in row.last_error
        assert fresh(KeyedStep(pk=box["holder"])).status == "ready"
    else:
        assert (row.status, row.version) == ("ready", 1)
        assert KeyedStep.objects.count() == 1


def test_a_dependent_whose_model_maps_no_cancelled_state_is_skipped_as_failed():
    prerequisite = Step.objects.create(name="p")
    tally = KeyedTally.objects.create(dedupe_key=KEY, after=[prerequisite], on_failure="run")
    holder, created = KeyedTally.objects.enqueue_unique(dedupe_key=KEY)
    assert created
    claim().complete()
    assert fresh(prerequisite).status == "done"
    row = fresh(tally)
    assert (row.state, row.version) == ("failed", 1)
    assert f"skipped as a duplicate: its key dedupe_key {KEY!r}" in row.last_error
    assert f"uniqueapp.KeyedTally #{holder.pk}" in row.last_error
    assert fresh(holder).state == "ready"
