"""Workflows through the ``django.tasks`` backend (docs/workflows.md, "Through
django.tasks"): ``task.after(...)`` dependencies and fan-in callbacks, durable steps,
``Snooze`` and event waits in task bodies, run by real worker subprocesses.

Needs the sub-app installed: run with ``--ds=tests.support.settings_tasks``.
"""

from __future__ import annotations

import pytest
from django.apps import apps

if not apps.is_installed("django_taskclaim.contrib.tasks"):
    pytest.skip(
        "the django.tasks backend is not installed; run with --ds=tests.support.settings_tasks",
        allow_module_level=True,
    )

from django.db import transaction
from django.tasks import TaskResultStatus
from django.tasks.exceptions import InvalidTask

from django_taskclaim import emit
from django_taskclaim.contrib.tasks import (
    enqueue_unique,
    fan_in,
    prerequisite_results,
    step,
    wait_for_event,
)
from django_taskclaim.contrib.tasks.exceptions import InvalidTaskDependency, NotInTaskBody
from django_taskclaim.contrib.tasks.models import QueuedTask
from django_taskclaim.exceptions import DependencyError
from django_taskclaim.models import TaskDependency
from tests.contrib.tasks.test_tasks_backend_worker import results_from_another_process, run_burst
from tests.support import tasks_workflows as wf
from tests.support.testapp.models import Document

pytestmark = pytest.mark.django_db(transaction=True)


def _status(result):
    return QueuedTask.objects.get(pk=result.id).status


def _due_now_if_left(result):
    """After a burst: a task left for later (a retry's backoff, a wait's deadline) is
    made due now and run by one more burst."""
    result.refresh()
    if result.status != TaskResultStatus.SUCCESSFUL:
        QueuedTask.objects.filter(pk=result.id).update(run_after=None)
        run_burst()
        result.refresh()


def test_a_fan_in_callback_runs_once_after_its_members_with_their_results():
    with transaction.atomic():
        members = [wf.square.enqueue(n) for n in range(1, 6)]
        callback = wf.total.after(members).enqueue()
    # Django sees a task that has not run; the table says it waits.
    assert callback.status == TaskResultStatus.READY
    assert _status(callback) == "waiting"
    assert TaskDependency.objects.filter(dependent_pk=str(callback.id)).count() == 5

    run_burst("--concurrency", "2")

    seen = results_from_another_process(callback.id, *(m.id for m in members))
    assert seen[callback.id]["status"] == "SUCCESSFUL"
    assert seen[callback.id]["return_value"] == {
        "total": 5,
        "done": 5,
        "failed": 0,
        "sum": 1 + 4 + 9 + 16 + 25,
        "ids": sorted(str(m.id) for m in members),
    }
    assert seen[callback.id]["attempts"] == 1
    # asked from outside a body, of the callback's TaskResult
    assert sorted(r.return_value for r in prerequisite_results(callback)) == [1, 4, 9, 16, 25]
    assert fan_in(callback).done == 5
    assert fan_in(members[0]) is None  # waits for nothing
    callback.refresh()
    for member in members:
        member.refresh()
        assert member.finished_at <= callback.started_at  # database clock, both


def test_a_failed_member_cancels_the_callback_by_default_and_run_lets_it_count():
    members = [wf.square_once.enqueue(n) for n in (2, -1, 3)]
    cancelled = wf.total.after(*members).enqueue()
    counted = wf.total.after(members, on_failure="run").enqueue()

    run_burst()

    cancelled.refresh()
    assert cancelled.status == TaskResultStatus.FAILED
    assert _status(cancelled) == "cancelled"
    row = QueuedTask.objects.get(pk=cancelled.id)
    assert "ended failed" in row.last_error
    assert str(members[1].id) in row.last_error
    counted.refresh()
    assert counted.status == TaskResultStatus.SUCCESSFUL
    assert counted.return_value["done"] == 2
    assert counted.return_value["failed"] == 1
    assert counted.return_value["sum"] == 4 + 9


def test_a_chain_of_tasks_and_rows_of_other_models():
    doc = Document.objects.create(title="a row of a claimable model")
    with pytest.raises(InvalidTaskDependency, match=r"ClaimMeta\.dependents"):
        wf.square.after(doc).enqueue(1)  # testapp.Document does not declare dependents
    first = wf.square.enqueue(2)
    second = wf.square.after(first).enqueue(3)
    third = wf.total.after(second).enqueue()
    assert {_status(second), _status(third)} == {"waiting"}
    run_burst()
    third.refresh()
    assert third.return_value["sum"] == 9  # only its own prerequisite: second
    second.refresh()
    first.refresh()
    assert first.finished_at <= second.started_at <= second.finished_at <= third.started_at


def test_bad_prerequisites_are_refused_before_anything_is_written():
    before = QueuedTask.objects.count()
    with pytest.raises(InvalidTask, match="after\\(\\) takes TaskResults"):
        wf.square.after("not a task").enqueue(1)
    with pytest.raises(InvalidTask, match="on_failure must be one of"):
        wf.square.after(on_failure="sometimes")
    ghost = wf.square.enqueue(1)
    QueuedTask.objects.filter(pk=ghost.id).delete()
    with pytest.raises(InvalidTaskDependency, match="does not exist") as caught:
        wf.square.after(ghost).enqueue(2)
    assert isinstance(caught.value, DependencyError)  # either except works
    with pytest.raises(InvalidTask, match="cannot be unique"):
        enqueue_unique(wf.square.after(wf.square.enqueue(5)), "key", 1)
    assert QueuedTask.objects.count() == before + 1  # only the last prerequisite
    assert not TaskDependency.objects.exists()


def test_durable_steps_survive_a_failed_attempt():
    result = wf.two_steps.enqueue("steps")
    run_burst()  # attempt 1 fails after step one; the retry is due after its backoff
    _due_now_if_left(result)
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.attempts == 2
    one = Document.objects.get(title="steps one")  # once: the retry used the stored pk
    two = Document.objects.get(title="steps two")
    assert result.return_value == {"one": one.pk, "two": two.pk, "steps": ["one", "two"]}


def test_snooze_parks_a_task_without_counting_the_attempt():
    result = wf.sleepy.enqueue()
    run_burst()  # parked: Snooze(0) waits the floor (1 s), due after the burst looked
    _due_now_if_left(result)
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == "woke"
    assert result.attempts == 1  # the snoozed run is not an attempt
    assert result.errors == []  # and no lost attempt is made of it


def test_a_task_waits_for_an_event_emitted_by_a_request():
    waiting = wf.awaits.enqueue("approved:7", 3600)
    early = wf.awaits.enqueue("approved:8", 3600)
    with transaction.atomic():
        assert emit("approved:8", {"by": "early"})  # before its wait: not lost
    run_burst()
    early.refresh()
    assert early.return_value == {"payload": {"by": "early"}}
    waiting.refresh()
    assert waiting.status == TaskResultStatus.READY  # parked: ready, due at its deadline
    assert waiting.attempts == 0
    with transaction.atomic():
        assert emit("approved:7", {"by": "alice"})
    run_burst()
    waiting.refresh()
    assert waiting.status == TaskResultStatus.SUCCESSFUL
    assert waiting.return_value == {"payload": {"by": "alice"}}
    assert waiting.attempts == 1


def test_an_event_wait_times_out_into_the_body():
    result = wf.awaits.enqueue("never:1", 0.001)
    run_burst()
    _due_now_if_left(result)  # parked until its deadline
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == "timed out"


def test_an_async_body_uses_astep():
    result = wf.async_steps.enqueue("async step")
    run_burst()
    result.refresh()
    pk = Document.objects.get(title="async step").pk
    assert result.return_value == {"pk": pk, "again": pk}


def test_forget_steps_makes_the_next_attempt_run_every_step_again():
    result = wf.forgets.enqueue("forget")
    run_burst()  # attempt 1 stores step one, forgets it, fails; the retry waits its backoff
    _due_now_if_left(result)
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.attempts == 2
    assert Document.objects.filter(title="forget forgot 1").exists()  # one step deleted
    # the retry ran step one again (nothing stored), and stored it anew
    assert result.return_value == {"steps": ["one"], "ones": 2}
    assert Document.objects.filter(title="forget one").count() == 2


def test_an_async_body_waits_for_an_event_with_await_event():
    early = wf.async_awaits.enqueue("shipped:1", 3600)
    waiting = wf.async_awaits.enqueue("shipped:2", 3600)
    with transaction.atomic():
        assert emit("shipped:1", {"box": 1})
    run_burst()
    early.refresh()
    assert early.status == TaskResultStatus.SUCCESSFUL
    assert early.return_value == {"payload": {"box": 1}}
    waiting.refresh()
    assert waiting.status == TaskResultStatus.READY  # parked from the coroutine
    assert waiting.attempts == 0
    assert waiting.errors == []
    with transaction.atomic():
        assert emit("shipped:2", {"box": 2})
    run_burst()
    waiting.refresh()
    assert waiting.status == TaskResultStatus.SUCCESSFUL
    assert waiting.return_value == {"payload": {"box": 2}}
    assert waiting.attempts == 1


def test_workflow_calls_outside_a_task_body_say_so():
    with pytest.raises(NotInTaskBody, match="inside a task body run by a TaskClaimBackend"):
        step("x", lambda: 1)
    with pytest.raises(NotInTaskBody, match="wait_for_event"):
        wait_for_event("x", 1)
