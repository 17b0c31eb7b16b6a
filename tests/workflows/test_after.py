"""Dependencies (docs/workflows.md): ``after=`` at enqueue, the release in the transaction
of the prerequisite's final settle, the three policies, every settle path, the claim and
the reaper leaving waiting rows alone. Real databases, no mocks."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection, transaction

from django_taskclaim.claim import STRATEGIES
from django_taskclaim.exceptions import DependencyError
from django_taskclaim.models import TaskDependency
from django_taskclaim.recovery.reap import reap
from django_taskclaim.settle import batch
from django_taskclaim.settle.dependents import open_prerequisites
from tests.support.testapp.models import Document, Job, OddStep, Step

pytestmark = pytest.mark.django_db(transaction=True)


def status(row) -> str:
    return type(row)._base_manager.get(pk=row.pk).status


def claim(model=Step):
    task = model.objects.claim_next()
    assert task is not None
    return task


def test_a_row_after_an_unfinished_one_waits_and_is_released_by_its_completion():
    first = Step.objects.create(name="ocr")
    second = Document.objects.create(title="index", after=[first])
    assert status(second) == "waiting"
    assert open_prerequisites(second) == [("testapp.Step", str(first.pk))]
    assert Document.objects.claim_next() is None  # waiting: never claimed
    claim().complete()
    assert status(second) == "ready"
    assert open_prerequisites(second) == []
    assert Document.objects.claim_next().pk == second.pk


def test_enqueue_many_after_waits_for_every_prerequisite():
    a, b = Step.objects.create(name="a"), Step.objects.create(name="b")
    rows = Document.objects.enqueue_many([{"title": f"d{i}"} for i in range(3)], after=[a, b])
    assert {status(r) for r in rows} == {"waiting"}
    assert TaskDependency.objects.filter(outcome="").count() == 6
    task = Step.objects.claim_next()
    task.complete()
    assert {status(r) for r in rows} == {"waiting"}  # one prerequisite still open
    claim().complete()
    assert {status(r) for r in rows} == {"ready"}


def test_a_prerequisite_done_already_means_no_wait_and_failed_applies_the_policy_at_once():
    done = Step.objects.create(name="done")
    claim().complete()
    assert status(Document.objects.create(after=[done])) == "ready"
    failed = Step.objects.create(name="failed", payload={"fail": "bad scan"})
    claim().fail("bad scan")
    cancelled = Document.objects.create(after=[failed])
    row = Document.objects.get(pk=cancelled.pk)
    assert row.status == "cancelled"
    assert f"testapp.Step #{failed.pk} ended failed (bad scan)" in row.last_error
    assert row.finished_at is not None
    assert status(Document.objects.create(after=[failed], on_failure="run")) == "ready"
    held = Document.objects.get(pk=Document.objects.create(after=[failed], on_failure="hold").pk)
    assert held.status == "waiting"
    assert "held for an operator" in held.last_error


def test_the_settle_rolled_back_leaves_the_dependent_waiting():
    first = Step.objects.create()
    second = Document.objects.create(after=[first])
    task = claim()
    seen = []

    def settle_then_roll_back() -> None:
        with transaction.atomic():
            task.complete()
            seen.append(status(second))  # released in the settle's own transaction
            raise RuntimeError("rolled back")

    with pytest.raises(RuntimeError):
        settle_then_roll_back()
    assert seen == ["ready"]
    assert status(second) == "waiting"
    assert status(first) == "processing"


@pytest.mark.parametrize("how", ["fail", "retry_exhausted", "operator_cancel", "reap"])
def test_a_failed_prerequisite_cancels_its_dependent_by_default_on_every_path(how):
    first = Step.objects.create(name="p")
    second = Document.objects.create(after=[first])
    third = Document.objects.create(after=[first], on_failure="run")
    fourth = Document.objects.create(after=[first], on_failure="hold")
    if how == "operator_cancel":
        assert Step.objects.filter(pk=first.pk).cancel() == 1
        ended = "cancelled"
    else:
        task = claim()
        ended = "failed"
        if how == "fail":
            task.fail("boom")
        elif how == "retry_exhausted":
            Step.objects.filter(pk=task.pk).update(attempts=99)
            task.attempts = 99
            task.retry(error="boom")
        else:
            Step.objects.filter(pk=task.pk).update(attempts=99, locked_until="2000-01-01T00:00Z")
            assert reap(Step).failed == 1
    assert status(first) == ended
    cancelled = Document.objects.get(pk=second.pk)
    assert cancelled.status == "cancelled"
    assert f"testapp.Step #{first.pk} ended {ended}" in cancelled.last_error
    assert status(third) == "ready"
    assert status(fourth) == "waiting"


def test_a_held_dependent_runs_when_the_operator_requeues_and_the_prerequisite_completes():
    first = Step.objects.create()
    held = Document.objects.create(after=[first], on_failure="hold")
    claim().fail("flaky upstream")
    assert status(held) == "waiting"
    assert Step.objects.filter(pk=first.pk).requeue() == 1
    claim().complete()
    assert status(held) == "ready"


def test_cancel_cascades_to_the_dependents_of_a_cancelled_dependent():
    first = Step.objects.create()
    middle = Step.objects.create(after=[first])
    last = Document.objects.create(after=[middle])
    claim().fail("x")
    assert status(middle) == "cancelled"
    assert status(last) == "cancelled"


def test_operator_cancel_of_a_waiting_row_settles_its_own_dependents():
    first = Step.objects.create()
    middle = Step.objects.create(after=[first])
    last = Document.objects.create(after=[middle], on_failure="run")
    assert Step.objects.filter(pk=middle.pk).cancel() == 1
    assert status(last) == "ready"
    assert status(first) == "ready"


def test_complete_many_releases_the_dependents_of_the_rows_it_completed():
    steps = Step.objects.enqueue_many([{"name": str(i)} for i in range(5)])
    after = Document.objects.create(after=steps)
    tasks = Step.objects.claim(5)
    assert len(tasks) == 5
    assert batch.complete_many(tasks[:4]) == []
    assert status(after) == "waiting"
    assert batch.complete_many(tasks[4:]) == []
    assert status(after) == "ready"


def test_odd_primary_keys_are_told_apart():
    lower = OddStep.objects.create(key="ä/1 x")
    upper = OddStep.objects.create(key="ä/1 x%")
    waits = Document.objects.create(after=[upper])
    task = OddStep.objects.filter(key=lower.key).claim_next()
    assert task.pk == lower.pk
    task.complete()
    assert status(waits) == "waiting"
    OddStep.objects.filter(key=upper.key).claim_next().complete()
    assert status(waits) == "ready"


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_no_strategy_claims_a_waiting_row(strategy):
    if not STRATEGIES[strategy].supported("default"):
        pytest.skip(f"{strategy} is not supported on this database")
    first = Step.objects.create()
    Document.objects.enqueue_many([{"title": str(i)} for i in range(3)], after=[first])

    def claimed() -> int:
        if strategy != "hold":
            return len(Document.objects.claim(10, strategy=strategy))
        with transaction.atomic():  # 'hold' keeps its row locks for a transaction
            return len(Document.objects.claim(10, strategy=strategy))

    assert claimed() == 0
    claim().complete()
    assert claimed() == 3


def test_the_reaper_leaves_waiting_rows_alone():
    first = Step.objects.create()
    second = Document.objects.create(after=[first])
    Document.objects.filter(pk=second.pk).update(locked_until="2000-01-01T00:00Z", attempts=99)
    assert reap(Document).total == 0
    assert status(second) == "waiting"


def test_bad_after_is_refused_with_one_clear_error_and_nothing_written():
    saved = Step.objects.create()
    with pytest.raises(DependencyError, match="unsaved"):
        Document.objects.create(after=[Step(name="never saved")])
    with pytest.raises(DependencyError, match=r"ClaimMeta\.dependents"):
        Document.objects.create(after=[Document.objects.create()])
    row = Document(title="me")
    with pytest.raises(DependencyError, match="itself"):
        Document.objects.enqueue_many([row], after=[row])
    with pytest.raises(DependencyError, match="'waiting'"):
        Job.objects.create(after=[saved])
    with pytest.raises(DependencyError, match="on_failure"):
        Document.objects.create(after=[saved], on_failure="maybe")
    with pytest.raises(DependencyError, match="list"):
        Document.objects.create(after=saved)
    assert Document.objects.count() == 1  # only the one made to be refused as a prerequisite
    assert TaskDependency.objects.count() == 0


def _deadlock_after_the_insert_once(monkeypatch) -> list[list[tuple[Any, bool]]]:
    """Make the edges' write (after the rows' insert) raise a transient error once, and
    record the rows each try plans with, as ``(pk, _state.adding)``."""
    from django.db import OperationalError

    from django_taskclaim import db
    from django_taskclaim.model import enqueue

    real_plan, real_edges, seen = enqueue.plan_after, enqueue.write_edges, []

    def plans(model, after, using, *, on_failure, rows):
        seen.append([(o.pk, o._state.adding) for o in rows])  # as each try finds them
        return real_plan(model, after, using, on_failure=on_failure, rows=rows)

    def deadlocks_once(plan, model, objs, using):
        if len(seen) == 1:
            raise OperationalError("deadlock detected")
        return real_edges(plan, model, objs, using)

    monkeypatch.setattr(enqueue, "plan_after", plans)
    monkeypatch.setattr(enqueue, "write_edges", deadlocks_once)
    monkeypatch.setattr(db, "is_transient", lambda exc, using: "deadlock" in str(exc))
    return seen


def test_create_after_retries_a_transient_error_whole_from_the_row_as_built(monkeypatch):
    """A deadlock with a prerequisite's settle (here: an error the classifier calls
    transient, raised once after the row was inserted) rolls the call back and it runs
    again, from the row as it was built, as every other write of the library."""
    first = Step.objects.create(name="first")
    seen = _deadlock_after_the_insert_once(monkeypatch)
    row = Document.objects.create(title="waits", after=[first])
    assert seen == [[(None, True)], [(None, True)]]  # the retry: no pk of the rolled-back try
    assert Document.objects.get(pk=row.pk).status == "waiting"
    assert Document.objects.filter(title="waits").count() == 1
    assert TaskDependency.objects.filter(dependent_pk=str(row.pk)).count() == 1


def test_enqueue_many_after_retries_a_transient_error_whole_from_the_rows_as_built(monkeypatch):
    """As ``create(after=…)``, for the rows of one ``enqueue_many()``."""
    first = Step.objects.create(name="first")
    seen = _deadlock_after_the_insert_once(monkeypatch)
    rows = Document.objects.enqueue_many(
        [Document(title=f"many {i}") for i in range(3)] + [{"title": "many 3"}], after=[first]
    )
    assert seen == [[(None, True)] * 4] * 2  # the retry: the rows as built
    stored = Document.objects.filter(title__startswith="many")
    assert stored.count() == 4
    assert set(stored.values_list("status", flat=True)) == {"waiting"}
    if connection.features.can_return_rows_from_bulk_insert:
        assert sorted(r.pk for r in rows) == sorted(stored.values_list("pk", flat=True))
    edges = TaskDependency.objects.filter(prerequisite_pk=str(first.pk), outcome="")
    assert edges.count() == 4
    Step.objects.claim_next().complete()  # the one prerequisite settles
    assert set(stored.values_list("status", flat=True)) == {"ready"}


def test_enqueue_many_after_inside_the_callers_transaction_is_not_retried(monkeypatch):
    from django.db import OperationalError

    from django_taskclaim import db
    from django_taskclaim.model import enqueue

    first = Step.objects.create(name="first")

    def deadlocks(*args, **kwargs):
        raise OperationalError("deadlock detected")

    monkeypatch.setattr(enqueue, "write_edges", deadlocks)
    monkeypatch.setattr(db, "is_transient", lambda exc, using: "deadlock" in str(exc))
    with pytest.raises(OperationalError), transaction.atomic():
        Document.objects.enqueue_many([{"title": "in tx"}], after=[first])
    assert not Document.objects.filter(title="in tx").exists()
