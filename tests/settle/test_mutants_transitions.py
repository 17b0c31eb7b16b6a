"""What the fenced transitions of ``django_taskclaim/settle/transitions.py`` leave on real
rows, at the points the lifecycle and fence tests do not pin (docs/testing.md, "Mutation
testing"): the lease renewal keeps the token, ``fail()``'s own fields and signal, a
``fenced(complete=True)`` block writes exactly the fields it changed, a deferred
completion written on its own.
"""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.db.models.functions import Now

from django_taskclaim import ClaimLost
from django_taskclaim.exceptions import ConfigurationError
from django_taskclaim.settle import transitions
from django_taskclaim.settle.batch import PENDING_ATTR
from django_taskclaim.settle.transitions import RETRY_IN_ATTR, Outcome, complete_pending
from django_taskclaim.signals import task_completed, task_failed
from tests.support.helpers import BusyOnce
from tests.support.testapp.models import Document, Job

pytestmark = pytest.mark.django_db(transaction=True)


def claimed(title: str = "t", **fields) -> Document:
    Document.objects.create(title=title, **fields)
    task = Document.objects.filter(title=title).claim_next(worker="w1")
    assert task is not None
    return task


def row(task: Document) -> Document:
    return Document._base_manager.annotate(db_now=Now()).get(pk=task.pk)


def lease_left(task: Document) -> timedelta:
    r = row(task)
    return r.locked_until - r.db_now


# -- extend_lease ------------------------------------------------------------------


def test_extend_lease_keeps_the_token_so_every_instance_of_the_claim_still_writes():
    task = claimed()
    other = Document.objects.get(pk=task.pk)  # the same claim, held elsewhere in memory
    task.extend_lease(600)
    assert row(task).version == task.version == other.version
    assert timedelta(seconds=590) < lease_left(task) <= timedelta(seconds=600)
    other.complete(result="by the other instance")
    assert (row(task).status, row(task).result) == ("done", "by the other instance")


def test_extend_lease_without_seconds_takes_the_models_lease():
    task = claimed()
    task.extend_lease(600)
    task.extend_lease()  # Document's ClaimMeta.lease = 30
    assert timedelta(seconds=20) < lease_left(task) <= timedelta(seconds=30)


# -- fail ------------------------------------------------------------------------------


def test_fail_records_when_and_a_default_reason_and_refuses_bookkeeping_fields():
    task = claimed()
    with pytest.raises(ValueError):
        task.fail("x", attempts=0)
    assert row(task).status == "processing"
    task.fail()
    r = row(task)
    assert (r.status, r.last_error, r.locked_until) == ("failed", "failed", None)
    assert r.finished_at is not None


def test_fail_sends_task_failed_with_the_task_its_error_and_final():
    seen = []

    def receiver(sender, task, error, final, **kw):
        seen.append((sender, task.pk, error, final))

    task = claimed()
    task_failed.connect(receiver)
    try:
        task.fail("broken")
    finally:
        task_failed.disconnect(receiver)
    assert seen == [(Document, task.pk, "broken", True)]


# -- fenced(complete=True) -------------------------------------------------------------


def test_a_completing_block_writes_the_fields_it_changed_and_only_those():
    task = claimed(payload={"a": {"b": 1}})
    # someone else edits a column the holder loaded but the block never touches
    Document.objects.filter(pk=task.pk).update(title="edited meanwhile")
    with task.fenced(complete=True):
        task.result = "written"
        task.payload["a"]["b"] = 2  # changed in place, deep inside a JSON value
    r = row(task)
    assert (r.status, r.result, r.payload) == ("done", "written", {"a": {"b": 2}})
    assert r.title == "edited meanwhile"


@pytest.mark.parametrize(
    ("field", "value"), [("attempts", 0), ("locked_by", "me"), ("version", 99), ("id", 10**6)]
)
def test_a_completing_block_that_changes_bookkeeping_or_the_key_writes_nothing(field, value):
    task = claimed()
    before = row(task)

    def block() -> None:
        with task.fenced(complete=True):
            task.result = "not written"
            setattr(task, field, value)

    what = "its primary key" if field == "id" else "claim bookkeeping"
    with pytest.raises(ValueError, match=rf"changed '{field}' \({what}\); a completion writes"):
        block()
    after = row(task)
    assert (after.status, after.version, after.result) == ("processing", before.version, "")


def test_a_completing_block_may_renew_the_lease_and_reload_the_row():
    task = claimed()
    with task.fenced(complete=True):
        task.extend_lease(600)
        task.refresh_from_db(fields=["attempts"])
        task.result = "renewed"
    assert (row(task).status, row(task).result) == ("done", "renewed")


# -- complete_pending ------------------------------------------------------------------


def test_a_deferred_completion_written_alone_carries_its_fields_and_calls_back():
    task = claimed()
    calls = []
    task.__dict__[PENDING_ATTR] = ({"result": "deferred"}, lambda: calls.append(task.pk))
    completed = []

    def receiver(sender, task, **kw):
        completed.append(task.pk)

    task_completed.connect(receiver)
    try:
        complete_pending(task)
    finally:
        task_completed.disconnect(receiver)
    assert (row(task).status, row(task).result) == ("done", "deferred")
    assert calls == [task.pk]
    assert completed == [task.pk]
    assert PENDING_ATTR not in task.__dict__


def test_a_deferred_completion_whose_claim_was_lost_writes_nothing_and_forgets_it():
    task = claimed()
    calls = []
    task.__dict__[PENDING_ATTR] = ({"result": "late"}, lambda: calls.append(1))
    Document.objects.filter(pk=task.pk).update(version=task.version + 1)
    with pytest.raises(ClaimLost):
        complete_pending(task)
    assert (row(task).status, row(task).result) == ("processing", "")
    assert calls == []
    assert PENDING_ATTR not in task.__dict__


def test_complete_sends_task_completed_with_the_model_and_the_task():
    seen = []

    def receiver(sender, task, **kw):
        seen.append((sender, task.pk, task.status))

    task = claimed()
    task_completed.connect(receiver)
    try:
        task.complete()
    finally:
        task_completed.disconnect(receiver)
    assert seen == [(Document, task.pk, "done")]


# -- a lost claim: what the holder is told -------------------------------------------


@pytest.mark.parametrize(
    ("write", "what", "logged"),
    [
        (lambda t: t.complete(), "the done write", "write=done"),
        (lambda t: t.extend_lease(60), "the lease write", "write=extend_lease"),
    ],
)
def test_a_lost_write_names_the_row_the_token_and_the_write(write, what, logged, caplog):
    task = claimed()
    token = task.version
    Document.objects.filter(pk=task.pk).update(version=token + 1)
    with (
        caplog.at_level("WARNING", logger="django_taskclaim.settle.outcome"),
        pytest.raises(ClaimLost) as lost,
    ):
        write(task)
    message = str(lost.value)
    assert lost.value.task is task
    assert message.startswith(f"testapp.Document pk={task.pk}: claim token {token} is no longer")
    assert message.endswith(f"{what} affected nothing")
    assert caplog.messages == [
        f"claim lost model=testapp.Document pk={task.pk} token={token} {logged}: "
        "nothing was written"
    ]


def test_a_fenced_block_on_a_lost_claim_does_not_run_and_says_why():
    task = claimed()
    Document.objects.filter(pk=task.pk).update(version=task.version + 1)
    ran = []
    with pytest.raises(ClaimLost) as lost, task.fenced():
        ran.append(1)
    assert ran == []
    assert lost.value.task is task
    assert str(lost.value) == (
        f"testapp.Document pk={task.pk}: claim token {task.version} is no longer current; "
        "the fenced block did not run"
    )


def test_a_fenced_block_leaves_the_lease_and_the_token_as_they_were():
    task = claimed()
    before = row(task)
    with task.fenced():
        Document.objects.filter(pk=task.pk).update(title="effect")
    after = row(task)
    assert (after.locked_until, after.version, after.title) == (
        before.locked_until,
        before.version,
        "effect",
    )
    assert after.locked_until is not None


# -- retry ---------------------------------------------------------------------------


def test_retry_without_an_error_keeps_the_last_error_and_refuses_bad_input():
    task = claimed()
    Document.objects.filter(pk=task.pk).update(last_error="earlier")
    with pytest.raises(ValueError):
        task.retry(attempts=0)
    with pytest.raises(ValueError, match="retry delay"):
        task.retry(delay=-1)
    assert row(task).status == "processing"
    task.retry(delay=5)
    r = row(task)
    assert (r.status, r.last_error) == ("ready", "earlier")


@pytest.mark.parametrize(("delay", "later"), [(0, False), (0.5, True), (7, True)])
def test_retry_sets_run_after_only_for_a_wait(delay, later):
    task = claimed()
    task.retry(delay=delay)
    r = row(task)
    assert (r.run_after is not None) is later
    if later:
        assert r.run_after - r.db_now <= timedelta(seconds=delay)
        assert r.run_after - r.db_now > timedelta(seconds=delay) - timedelta(seconds=5)
    assert task._taskclaim_retry_in == delay


def test_retry_signals_a_retry_and_a_final_failure_with_the_error():
    seen = []

    def receiver(sender, task, error, final, **kw):
        seen.append((sender, task.pk, error, final))

    again = claimed("again")
    spent = claimed("spent")
    Document.objects.filter(pk=spent.pk).update(attempts=5)
    spent.attempts = 5
    task_failed.connect(receiver)
    try:
        again.retry(error="e1")
        spent.retry(error="e2")
    finally:
        task_failed.disconnect(receiver)
    assert seen == [(Document, again.pk, "e1", False), (Document, spent.pk, "e2", True)]


@pytest.mark.parametrize(("error", "suffix"), [("", ""), ("boom", "\nboom")])
def test_a_retry_past_the_last_attempt_fails_and_says_so(error, suffix):
    task = claimed()
    Document.objects.filter(pk=task.pk).update(attempts=5)
    task.attempts = 5
    assert task.retry(error=error) == "failed"
    r = row(task)
    assert (r.status, r.locked_until) == ("failed", None)
    assert r.finished_at is not None
    assert r.last_error == f"gave up after 5 attempt(s) (max_attempts=5){suffix}"


@pytest.mark.parametrize(
    ("write", "what", "status"),
    [
        (lambda t: t.complete(), "done testapp.Document", "done"),
        (lambda t: t.extend_lease(60), "lease testapp.Document", "processing"),
    ],
)
def test_a_write_that_finds_the_database_busy_is_retried_and_lands(write, what, status, caplog):
    from django.db import connection

    task = claimed()
    busy = BusyOnce()

    with (
        caplog.at_level("DEBUG", logger="django_taskclaim.db"),
        connection.execute_wrapper(busy),
    ):
        write(task)
    assert busy.left == 0
    assert row(task).status == status
    assert any(m.startswith(f"retrying what={what} attempt=1 ") for m in caplog.messages)


# -- snooze ------------------------------------------------------------------------


def due_in(task: Document) -> timedelta:
    r = row(task)
    return r.run_after - r.db_now


def test_snooze_parks_the_row_uncounted_due_after_the_floor_and_in_line_from_then():
    task = claimed()
    claim_token = task.version
    assert transitions.snooze(task) == Outcome.READY  # Snooze(0)
    r = row(task)
    assert (r.status, r.attempts, r.locked_until) == ("ready", 0, None)
    assert r.version == task.version > claim_token  # fenced, the token moved on
    assert task.__dict__[RETRY_IN_ATTR] == transitions.SNOOZE_FLOOR == 1.0
    assert timedelta(seconds=0.5) < due_in(task) <= timedelta(seconds=1)
    assert r.created_at == r.run_after  # its place in line: when it is due


def test_snooze_longer_than_the_floor_waits_its_own_delay_seconds_or_timedelta():
    task = claimed("a")
    transitions.snooze(task, 5)
    assert task.__dict__[RETRY_IN_ATTR] == 5.0
    assert timedelta(seconds=4) < due_in(task) <= timedelta(seconds=5)
    other = claimed("b")
    transitions.snooze(other, timedelta(seconds=3))
    assert other.__dict__[RETRY_IN_ATTR] == 3.0
    assert timedelta(seconds=2) < due_in(other) <= timedelta(seconds=3)


def test_a_park_passes_no_floor_and_is_due_at_once():
    task = claimed()
    transitions.snooze(task, floor=0.0)  # the default delay: none
    assert task.__dict__[RETRY_IN_ATTR] == 0.0
    r = row(task)
    assert (r.status, r.run_after) == ("ready", None)  # due now: no delay
    assert timedelta(seconds=-5) < r.created_at - r.db_now <= timedelta(0)  # in line from now


@pytest.mark.parametrize("delay", [-1, float("inf"), "soon", True])
def test_a_bad_snooze_delay_is_refused_naming_it_and_writes_nothing(delay):
    task = claimed()
    with pytest.raises(ValueError, match=r"^snooze delay"):
        transitions.snooze(task, delay)
    assert (row(task).status, row(task).version) == ("processing", task.version)


def test_snooze_without_run_after_says_why_and_writes_nothing():
    Job.objects.create(name="j")
    task = Job.objects.claim_next(worker="w1")
    assert task is not None
    message = (
        "testapp.Job has no run_after field, so a row cannot be parked until later "
        "(Snooze): add ScheduleFieldsMixin (or a run_after field)"
    )
    with pytest.raises(ConfigurationError, match=f"^{re.escape(message)}$"):
        transitions.snooze(task)
    assert Job.objects.get(pk=task.pk).status == Job.PENDING


def test_snooze_of_a_claim_lost_writes_nothing():
    task = claimed()
    Document.objects.filter(pk=task.pk).update(version=task.version + 1)  # re-claimed
    with pytest.raises(ClaimLost):
        transitions.snooze(task)
    assert row(task).status == "processing"
