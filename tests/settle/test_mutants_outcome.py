"""The outcome rules of ``django_taskclaim/settle/outcome.py`` on real rows, at the points the
lifecycle tests do not look (docs/testing.md, "Mutation testing"): what ``attempt()`` keeps
of a body's result or error (a ``BaseException`` made a :class:`TaskAborted` only when
asked), which outcome ``settle()`` returns and what it leaves on the row for each kind of
result and error, the deferred result fields and their callback, the ``ClaimMeta.atomic``
way (a body that finished the row, one past its deadline, an async body), and the
cancellation flag and ``claim_held()`` against the row's token.
"""

from __future__ import annotations

import logging
import threading
from datetime import timedelta

import pytest
from django.db.models import F, Value
from django.db.models.functions import Concat
from django.test.utils import override_settings

from django_taskclaim import ClaimLost, ConfigurationError, Fail, Retry
from django_taskclaim.config import options
from django_taskclaim.db import DbNow
from django_taskclaim.settle.batch import PENDING_ATTR, BatchableResult
from django_taskclaim.settle.deadline import mark_overdue
from django_taskclaim.settle.outcome import (
    CANCEL_ATTR,
    Attempt,
    CancelFlag,
    TaskAborted,
    attempt,
    cancel_flag,
    cancel_requested,
    claim_held,
    run_task,
    settle,
)
from tests.support.testapp.models import Document, Job, Ledger

pytestmark = pytest.mark.django_db(transaction=True)


def claimed(**fields) -> Document:
    made = Document.objects.create(**fields)
    (task,) = Document.objects.filter(pk=made.pk).claim(1, worker="w")
    return task


def row(task) -> Document:
    return Document.objects.get(pk=task.pk)


def take_back(task) -> None:
    """The claim of ``task`` lost: its row released by someone else (a new token)."""
    Document.objects.filter(pk=task.pk).update(
        status="ready", version=F("version") + 1, locked_until=None, locked_by=""
    )


@pytest.fixture
def atomic(monkeypatch):
    """``Document`` with ``ClaimMeta.atomic = True`` for the test."""
    monkeypatch.setattr(Document.ClaimMeta, "atomic", True, raising=False)
    options._cache.pop(Document, None)
    yield
    monkeypatch.undo()
    options._cache.pop(Document, None)


# -- attempt() ------------------------------------------------------------------------------


def test_attempt_keeps_the_result_and_the_error_apart():
    task = claimed()
    done = attempt(task, lambda t: {"result": "r"})
    assert (done.result, done.error) == ({"result": "r"}, None)
    boom = RuntimeError("boom")

    def raises(t):
        raise boom

    done = attempt(task, raises)
    assert (done.result, done.error) == (None, boom)
    assert row(task).status == "processing"  # attempt() writes nothing


def test_attempt_runs_an_async_body_to_its_result():
    task = claimed()

    async def body(t):
        return {"result": f"async {t.pk}"}

    assert attempt(task, body).result == {"result": f"async {task.pk}"}


def test_attempt_with_sync_does_not_inspect_the_handler():
    task = claimed()

    async def body(t):
        return {"result": "never awaited"}

    done = attempt(task, body, sync=True)
    try:
        assert done.error is None
        assert hasattr(done.result, "__await__")  # called as given: a coroutine object
    finally:
        done.result.close()


class Halt(BaseException):
    """A ``BaseException`` that is not an ``Exception``: unlike ``SystemExit``, one that
    escapes a test fails that test instead of ending the test run."""


def test_a_base_exception_propagates_unless_the_caller_catches_them():
    task = claimed()

    def body(t):
        raise SystemExit("bye")

    with pytest.raises(SystemExit):
        attempt(task, body)
    with pytest.raises(SystemExit):
        attempt(task, body, catch_base_exceptions=False)

    def halts(t):
        raise Halt("bye")

    with pytest.raises(Halt):
        attempt(task, halts)
    done = attempt(task, halts, catch_base_exceptions=True)
    assert isinstance(done.error, TaskAborted)
    assert str(done.error) == "the task raised Halt(bye): it is treated as the task's failure"
    assert isinstance(done.error.__cause__, Halt)
    assert done.result is None


def test_a_base_exception_without_text_is_named_alone():
    task = claimed()

    def body(t):
        raise KeyboardInterrupt

    done = attempt(task, body, catch_base_exceptions=True)
    assert str(done.error) == (
        "the task raised KeyboardInterrupt: it is treated as the task's failure"
    )
    assert settle(task, done) == "ready"
    assert "TaskAborted: the task raised KeyboardInterrupt" in row(task).last_error


# -- settle() -------------------------------------------------------------------------------


def test_settle_defers_a_result_of_nothing_only_while_processing():
    task = claimed()
    deferred = []
    assert settle(task, Attempt(), defer=deferred.append) == "deferred"
    assert deferred == [task]
    assert row(task).status == "processing"
    # without defer, nothing returned completes the row at once
    assert settle(task, Attempt()) == "done"
    assert (row(task).status, task.status) == ("done", "done")
    # the body finished the row itself: its state, nothing deferred
    other = claimed()
    other.fail("by the body")
    assert settle(other, Attempt(), defer=deferred.append) == "failed"
    assert deferred == [task]
    assert row(other).last_error == "by the body"


def test_settle_of_a_row_the_body_left_in_another_state_reports_that_state():
    task = claimed()
    task.retry(delay=0)
    assert settle(task, Attempt(result={"result": "late"})) == "ready"
    assert row(task).result == ""  # nothing written over the body's own outcome


def test_a_status_the_model_does_not_map_is_an_unknown_outcome():
    Job.objects.create(name="j")
    (job,) = Job.objects.claim(1, worker="w")
    job.status = 99  # the body left the row in a status of its own
    assert settle(job, Attempt(result={"name": "x"})) == "unknown"
    assert Job.objects.get(pk=job.pk).status == Job.PENDING  # nothing written


def test_settle_of_a_claim_lost_error_writes_nothing():
    task = claimed()
    take_back(task)
    before = row(task)
    assert settle(task, Attempt(error=ClaimLost("gone"))) == "lost"
    after = row(task)
    assert (after.status, after.version, after.last_error) == (
        before.status,
        before.version,
        before.last_error,
    )
    # a ClaimLost error is "lost" even while the row is still held: nothing retried
    held = claimed()
    assert settle(held, Attempt(error=ClaimLost("told")), defer=lambda t: None) == "lost"
    assert (row(held).status, row(held).last_error) == ("processing", "")


def test_settle_completes_with_the_returned_fields():
    task = claimed()
    assert settle(task, Attempt(result={"result": "written"})) == "done"
    got = row(task)
    assert (got.status, got.result) == ("done", "written")


def test_a_result_that_is_no_mapping_completes_without_fields():
    task = claimed(result="kept")
    assert settle(task, Attempt(result=["not", "a", "mapping"])) == "done"
    assert (row(task).status, row(task).result) == ("done", "kept")
    # deferred too, when the caller defers
    other = claimed()
    deferred = []
    assert settle(other, Attempt(result=42), defer=deferred.append) == "deferred"
    assert deferred == [other]
    assert PENDING_ATTR not in other.__dict__


def test_fields_the_model_cannot_store_retry_the_row_with_the_error():
    task = claimed()
    deferred = []
    assert settle(task, Attempt(result={"status": "done"}), defer=deferred.append) == "ready"
    assert deferred == []
    got = row(task)
    assert got.status == "ready"
    assert "'status' is claim bookkeeping" in got.last_error
    other = claimed()
    assert (
        settle(other, Attempt(result=BatchableResult({"nope": 1})), defer=deferred.append)
        == "ready"
    )
    assert deferred == []
    assert "has no field 'nope'" in row(other).last_error


def test_a_batchable_result_is_deferred_with_its_fields_and_callback():
    task = claimed()
    deferred = []
    written = []
    result = BatchableResult({"result": "later"}, on_written=lambda: written.append(1))
    assert settle(task, Attempt(result=result), defer=deferred.append) == "deferred"
    assert deferred == [task]
    fields, callback = task.__dict__[PENDING_ATTR]
    assert fields == {"result": "later"}
    assert callback is result.on_written
    assert written == []  # called only once the fields are written
    assert row(task).status == "processing"
    assert Document.objects.complete_many([task]) == []
    assert (row(task).status, row(task).result) == ("done", "later")
    assert written == [1]


def test_a_plain_mapping_with_fields_is_written_at_once_even_with_defer():
    task = claimed()
    deferred = []
    assert settle(task, Attempt(result={"result": "now"}), defer=deferred.append) == "done"
    assert deferred == []
    assert PENDING_ATTR not in task.__dict__
    assert row(task).result == "now"


def test_a_batchable_result_holding_an_expression_is_written_at_once():
    task = claimed(title="t")
    deferred = []
    written = []
    result = BatchableResult(
        {"result": Concat(F("title"), Value("!"))}, on_written=lambda: written.append(1)
    )
    assert settle(task, Attempt(result=result), defer=deferred.append) == "done"
    assert deferred == []
    assert row(task).result == "t!"
    assert written == [1]  # its callback, once written


def test_a_batchable_result_without_defer_is_written_and_calls_back():
    task = claimed()
    written = []
    result = BatchableResult({"result": "direct"}, on_written=lambda: written.append(1))
    assert settle(task, Attempt(result=result)) == "done"
    assert row(task).result == "direct"
    assert written == [1]
    other = claimed()
    assert settle(other, Attempt(result=BatchableResult({"result": "no callback"}))) == "done"
    assert row(other).result == "no callback"


def test_a_completion_that_finds_the_claim_lost_is_lost_and_calls_nothing():
    task = claimed()
    take_back(task)
    written = []
    result = BatchableResult({"result": "x"}, on_written=lambda: written.append(1))
    assert settle(task, Attempt(result=result)) == "lost"
    assert written == []
    assert (row(task).status, row(task).result) == ("ready", "")


def test_fail_retry_and_other_errors_leave_their_marks(caplog):
    task = claimed()
    assert settle(task, Attempt(error=Fail("bad input"))) == "failed"
    got = row(task)
    assert (got.status, got.last_error, got.locked_until) == ("failed", "bad input", None)

    task = claimed()
    assert settle(task, Attempt(error=Retry(delay=60, reason="later"))) == "ready"
    got = Document.objects.annotate(now=DbNow()).get(pk=task.pk)
    assert (got.status, got.last_error) == ("ready", "later")
    assert got.run_after - got.now > timedelta(seconds=50)

    task = claimed()
    assert settle(task, Attempt(error=Retry(delay=0))) == "ready"
    assert row(task).last_error == "retry requested"

    task = claimed()
    with caplog.at_level(logging.INFO, logger="django_taskclaim.settle.outcome"):
        assert settle(task, Attempt(error=RuntimeError("oops"))) == "ready"
    assert "RuntimeError: oops" in row(task).last_error
    (record,) = [r for r in caplog.records if r.name == "django_taskclaim.settle.outcome"]
    assert record.getMessage() == (
        f"task raised model=testapp.Document pk={task.pk} attempt=1 error=RuntimeError('oops')"
    )


@pytest.mark.parametrize(
    "error", [Fail("f"), Retry(delay=0, reason="r"), RuntimeError("e")], ids=type
)
def test_an_error_of_a_claim_lost_meanwhile_is_lost(error):
    task = claimed()
    take_back(task)
    assert settle(task, Attempt(error=error)) == "lost"
    got = row(task)
    assert (got.status, got.last_error) == ("ready", "")


# -- ClaimMeta.atomic -----------------------------------------------------------------------


def test_atomic_body_and_completion_commit_together(atomic):
    task = claimed()

    def body(t):
        Ledger.objects.create(task_id=t.pk, token=t.version, worker="w")
        return {"result": "together"}

    assert run_task(task, body) == "done"
    assert (row(task).status, row(task).result) == ("done", "together")
    assert Ledger.objects.filter(task_id=task.pk).count() == 1


def test_atomic_body_returning_no_mapping_completes_without_fields(atomic):
    task = claimed(result="kept")
    assert run_task(task, lambda t: "text") == "done"
    assert (row(task).status, row(task).result) == ("done", "kept")


def test_atomic_body_that_finished_the_row_is_not_completed_over(atomic):
    task = claimed()

    def body(t):
        t.retry(delay=0)
        return {"result": "ignored"}

    assert run_task(task, body) == "ready"
    assert (row(task).status, row(task).result) == ("ready", "")


def test_atomic_body_past_its_deadline_rolls_back_and_is_retried(atomic):
    task = claimed()

    def body(t):
        Ledger.objects.create(task_id=t.pk, token=t.version, worker="w")
        mark_overdue(t, 2.5)  # as the worker does at the deadline
        return {"result": "too late"}

    assert run_task(task, body) == "ready"
    assert not Ledger.objects.exists()
    got = row(task)
    assert (got.status, got.result) == ("ready", "")
    assert "TimeoutError: ran past its 2.5s deadline" in got.last_error


def test_atomic_async_body_runs_to_its_result(atomic):
    task = claimed()

    async def body(t):
        return {"result": f"async {t.pk}"}

    assert run_task(task, body) == "done"
    assert row(task).result == f"async {task.pk}"


def test_atomic_body_error_rolls_back_its_writes(atomic):
    task = claimed()

    def body(t):
        Ledger.objects.create(task_id=t.pk, token=t.version, worker="w")
        raise RuntimeError("no")

    assert run_task(task, body) == "ready"
    assert not Ledger.objects.exists()


# -- run_task() -----------------------------------------------------------------------------


def test_run_task_without_handler_uses_the_models_and_refuses_none(monkeypatch):
    task = claimed()
    assert run_task(task) == "done"
    assert row(task).result == f"processed {task.pk}"
    other = claimed()
    monkeypatch.setattr(type(options.get_options(Document)), "handler", lambda self: None)
    with pytest.raises(ConfigurationError) as info:
        run_task(other)
    assert str(info.value) == (
        "testapp.Document has no processing entry point: define a process(self) "
        "method or set ClaimMeta.handler"
    )
    assert row(other).status == "processing"


def test_run_task_passes_defer_on():
    task = claimed()
    deferred = []
    assert run_task(task, lambda t: None, defer=deferred.append) == "deferred"
    assert deferred == [task]


# -- cancellation ---------------------------------------------------------------------------


def test_claim_held_follows_the_rows_token():
    task = claimed()
    assert claim_held(task) is True
    take_back(task)
    assert claim_held(task) is False
    # a token one behind is not held either
    other = claimed()
    other.version -= 1
    assert claim_held(other) is False


class ElsewhereRouter:
    """Sends ``Document``'s reads and writes to an alias that does not exist."""

    def db_for_read(self, model, **hints):
        return "elsewhere" if model is Document else None

    def db_for_write(self, model, **hints):
        return "elsewhere" if model is Document else None


def test_claim_held_asks_the_database_the_row_came_from():
    task = claimed()
    with override_settings(DATABASE_ROUTERS=[f"{__name__}.ElsewhereRouter"]):
        assert claim_held(task) is True


def test_cancel_requested_asks_the_database_only_when_told():
    task = claimed()
    assert cancel_requested(task) is False
    assert cancel_requested(task, check=True) is False
    assert not cancel_flag(task).is_set()
    take_back(task)
    assert cancel_requested(task) is False  # no query: the flag alone
    assert not cancel_flag(task).is_set()
    assert cancel_requested(task, check=True) is True
    assert cancel_flag(task).is_set()
    assert cancel_requested(task) is True  # sticky


def test_a_set_flag_answers_without_asking():
    task = claimed()
    cancel_flag(task).set()
    assert cancel_requested(task, check=True) is True  # held in the database, flag wins


def test_cancel_flag_is_one_object_per_instance():
    task = claimed()
    flag = cancel_flag(task)
    assert isinstance(flag, CancelFlag)
    assert cancel_flag(task) is flag
    assert not flag.is_set()
    assert task.__dict__[CANCEL_ATTR] is flag  # kept where the instance documents it
    other = Document.objects.get(pk=task.pk)
    assert cancel_flag(other) is not flag


def test_cancel_flag_waits_and_wakes_like_an_event():
    flag = CancelFlag()
    assert flag.is_set() is False
    assert flag.wait(0) is False
    got = []
    ready = threading.Event()

    def waiter():
        ready.set()
        got.append(flag.wait(30))

    thread = threading.Thread(target=waiter)
    thread.start()
    ready.wait(5)
    flag.set()
    thread.join(30)
    assert got == [True]
    assert flag.is_set()
    flag.clear()
    assert not flag.is_set()
    assert flag._cond is flag._cond  # one condition, made once
