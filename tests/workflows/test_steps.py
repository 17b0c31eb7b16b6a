"""Durable steps and durable sleep (docs/workflows.md, "Durable steps"): a step's result
is stored with its database writes in one fenced transaction; a retried attempt skips
the steps that completed; a holder that lost its claim can record nothing; ``Snooze``
parks a row without counting the attempt, its steps kept."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.db.models import F
from django.db.models.functions import Now

from django_taskclaim import ClaimLost, Retry, Snooze, run_task
from django_taskclaim.models import TaskStep
from tests.support.helpers import wait_for
from tests.support.testapp.models import Document, Job, Ledger
from tests.support.worker_handlers import STEP_ONE, STEP_TWO
from tests.support.worker_procs import WorkerProc

pytestmark = pytest.mark.django_db(transaction=True)


def write(task, what: str) -> int:
    return Ledger.objects.create(task_id=task.pk, token=task.version, worker=what).pk


def test_a_retried_attempt_skips_the_completed_steps_and_gets_their_results():
    Document.objects.create(title="t")
    calls: list[str] = []

    def body(task):
        calls.append("a")
        a = task.step("a", lambda: {"ledger": write(task, "a"), "at": Decimal("1.5")})
        if task.attempts == 1:
            raise Retry(0, "broke between the steps")
        calls.append("b")
        task.step("b", lambda: write(task, "b"))
        return {"result": str(a["ledger"])}

    first = Document.objects.claim_next()
    token = first.version
    assert run_task(first, body) == "ready"  # retried
    second = Document.objects.claim_next()
    assert second is not None
    assert second.attempts == 2
    assert run_task(second, body) == "done"
    assert list(Ledger.objects.order_by("pk").values_list("worker", flat=True)) == ["a", "b"]
    row = Document.objects.get()
    steps = row.completed_steps()
    assert list(steps) == ["a", "b"]
    assert steps["a"]["at"] == "1.5"  # stored as JSON: a decimal comes back as text
    assert row.result == str(steps["a"]["ledger"])
    stored = TaskStep.objects.get(name="a")
    assert (stored.token, stored.attempt) == (token, 1)
    assert TaskStep.objects.get(name="b").attempt == 2


def test_a_step_that_raises_commits_nothing_and_runs_again():
    Document.objects.create(title="t")
    task = Document.objects.claim_next()

    def broken():
        write(task, "half")
        raise ValueError("step broke")

    with pytest.raises(ValueError, match="step broke"):
        task.step("s", broken)
    assert not Ledger.objects.exists()
    assert not TaskStep.objects.exists()
    assert task.step("s", lambda: write(task, "whole")) == Ledger.objects.get().pk


def test_a_holder_that_lost_its_claim_records_no_step_and_commits_none_of_its_writes():
    Document.objects.create(title="t")
    stale = Document.objects.claim_next()
    Document.objects.update(locked_until=Now() - timedelta(seconds=1))
    Document.objects.reap()
    fresh = Document.objects.claim_next()
    assert fresh is not None
    assert fresh.version > stale.version
    with pytest.raises(ClaimLost):
        stale.step("s", lambda: write(stale, "stale"))
    assert not Ledger.objects.exists()
    assert not TaskStep.objects.exists()
    assert fresh.step("s", lambda: write(fresh, "fresh")) == Ledger.objects.get(worker="fresh").pk


def test_a_result_that_is_not_json_is_refused_and_rolled_back():
    Document.objects.create(title="t")
    task = Document.objects.claim_next()
    with pytest.raises(TypeError, match=r"step 's' of testapp\.Document .* returned object"):
        task.step("s", lambda: (write(task, "x"), object())[1])
    assert not Ledger.objects.exists()
    assert not TaskStep.objects.exists()


@pytest.mark.parametrize("name", ["", "x" * 101, 7, None])
def test_a_bad_step_name_is_refused(name):
    Document.objects.create(title="t")
    task = Document.objects.claim_next()
    with pytest.raises(ValueError, match="a step name is a non-empty text"):
        task.step(name, lambda: 1)


def test_forget_steps_starts_the_row_over():
    Document.objects.create(title="t")
    task = Document.objects.claim_next()
    task.step("s", lambda: 1)
    assert task.forget_steps() == 1
    assert task.step("s", lambda: 2) == 2


def test_snooze_parks_the_row_without_counting_the_attempt_and_keeps_its_steps():
    Document.objects.create(title="t", last_error="earlier")

    def body(task):
        task.step("first", lambda: "kept")
        raise Snooze(timedelta(minutes=10))

    task = Document.objects.claim_next()
    claimed = task.version
    assert run_task(task, body) == "ready"
    row = Document.objects.annotate(due_in=F("run_after") - Now()).get()
    assert (row.status, row.attempts, row.locked_until) == ("ready", 0, None)
    assert row.last_error == "earlier"  # no error recorded
    assert timedelta(minutes=9) < row.due_in <= timedelta(minutes=10)
    assert Document.objects.claim_next() is None  # not due yet
    assert row.completed_steps() == {"first": "kept"}
    assert row.version == claimed + 1  # fenced: the token moved on


def test_snooze_on_a_model_without_run_after_is_retried_with_a_clear_error():
    Job.objects.create(name="j")
    task = Job.objects.claim_next()

    def body(task):
        raise Snooze(5)

    assert run_task(task, body) == "ready"
    assert "has no run_after field" in Job.objects.get().last_error


@pytest.mark.parametrize("delay", [-1, float("nan"), "soon", 10**9])
def test_a_bad_snooze_delay_is_refused_where_it_is_raised(delay):
    with pytest.raises(ValueError, match="Snooze delay must"):
        Snooze(delay)


def test_a_worker_killed_between_steps_runs_the_next_attempt_from_the_second_step(procs):
    """Real worker processes: each body SIGKILLs its process between its two steps on
    the first attempt; after the reaper takes the rows back, the second attempt skips
    step one (its ledger row written once) and hands step two step one's stored result."""
    rows = Document.objects.bulk_create([Document(title=f"s{i}") for i in range(4)])
    if rows[0].pk is None:
        rows = list(Document.objects.order_by("pk"))
    handler = {"handler": "tests.support.worker_handlers.process_in_steps"}

    def worker() -> WorkerProc:
        w = WorkerProc("testapp.Document", "--lease", "2", "--poll", "0.2",
                       settings={"TASKCLAIM_REAP_INTERVAL": 1.0}, claim_meta=handler)  # fmt: skip
        procs.append(w)
        return w

    def all_done() -> bool:
        if all(not w.alive() for w in procs):
            worker()  # each first attempt kills its worker: start another
        return Document.objects.filter(status="done").count() == len(rows)

    worker()
    wait_for(all_done, timeout=120, interval=0.2, what="every row done after the kills")
    for row in rows:
        ones = list(Ledger.objects.filter(task_id=row.pk, worker__startswith=STEP_ONE))
        twos = list(Ledger.objects.filter(task_id=row.pk, worker__startswith=STEP_TWO))
        assert len(ones) == 1, row.pk  # step one ran once, though its attempt was killed
        assert len(twos) == 1
        assert twos[0].worker.startswith(f"{STEP_TWO}{ones[0].pk}:")  # its stored result
        done = Document.objects.get(pk=row.pk)
        assert done.attempts == 2
        assert set(done.completed_steps()) == {"one", "two"}


def test_the_admin_page_lists_the_completed_steps(admin_client):
    from django.urls import reverse

    plain = Document.objects.create(title="plain")
    Document.objects.create(title="t")
    task = Document.objects.filter(title="t").claim_next()
    task.step("fetch", lambda: {"pages": 3})
    page = admin_client.get(reverse("admin:testapp_document_change", args=[task.pk]))
    text = page.content.decode()
    assert "Completed steps" in text
    assert "fetch" in text
    assert "{&quot;pages&quot;: 3}" in text
    other = admin_client.get(reverse("admin:testapp_document_change", args=[plain.pk]))
    assert "Completed steps" not in other.content.decode()
