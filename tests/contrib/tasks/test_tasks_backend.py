"""The ``django.tasks`` backend in one process: validation, transactions, results, signals,
retries and recovery, driven with ``claim()`` + ``run_task()`` as a worker would.

Needs the sub-app installed: run with ``--ds=tests.support.settings_tasks``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import inspect
import logging
import math
import re
import subprocess
import sys
import threading
from datetime import datetime, timedelta

import pytest
from django.apps import apps

if not apps.is_installed("django_taskclaim.contrib.tasks"):
    pytest.skip(
        "the django.tasks backend is not installed; run with --ds=tests.support.settings_tasks",
        allow_module_level=True,
    )

from asgiref.sync import async_to_sync
from django.core.exceptions import ImproperlyConfigured
from django.db import connection, connections, transaction
from django.tasks import TaskResultStatus, default_task_backend, task_backends
from django.tasks.exceptions import (
    InvalidTask,
    InvalidTaskBackend,
    TaskResultDoesNotExist,
    TaskResultMismatch,
)
from django.tasks.signals import (
    log_task_finished,
    log_task_started,
    task_enqueued,
    task_finished,
    task_started,
)
from django.test import override_settings
from django.utils import timezone

from django_taskclaim.contrib.tasks import announce, runner
from django_taskclaim.contrib.tasks.apps import check_django_version
from django_taskclaim.contrib.tasks.backend import TaskClaimBackend
from django_taskclaim.contrib.tasks.models import QueuedTask
from django_taskclaim.db import DbNow
from django_taskclaim.recovery.reap import reap
from django_taskclaim.settle.outcome import run_task
from tests.support import tasks_examples as ex
from tests.support.helpers import PYTHON, ROOT, child_env

pytestmark = pytest.mark.django_db(transaction=True)

#: The module of the example tasks, as stored task paths name it.
EX = "tests.support.tasks_examples"

BACKEND = "django_taskclaim.contrib.tasks.backend.TaskClaimBackend"


@pytest.fixture
def capture():
    """``capture(signal)`` -> list of (sender, TaskResult) the signal sends."""
    connected = []

    def connect(signal):
        seen = []

        def receiver(sender, task_result, **kwargs):
            seen.append((sender, task_result))

        signal.connect(receiver, weak=False)
        connected.append((signal, receiver))
        return seen

    yield connect
    for signal, receiver in connected:
        signal.disconnect(receiver)


def run_one(**claim_kwargs):
    """Claim one ready task and run it like the worker does; return (row, outcome)."""
    row = QueuedTask.objects.claim_next(worker="w-test", **claim_kwargs)
    assert row is not None, "no claimable task"
    return row, run_task(row)


def drain(limit=20):
    outcomes = []
    for _ in range(limit):
        row = QueuedTask.objects.claim_next(worker="w-test")
        if row is None:
            return outcomes
        outcomes.append(run_task(row))
    raise AssertionError("queue did not drain")


# -- configuration ----------------------------------------------------------------------
def test_backend_features_and_task_class():
    backend = task_backends["default"]
    assert isinstance(backend, TaskClaimBackend)
    assert backend.supports_defer
    assert backend.supports_priority
    assert backend.supports_get_result
    assert backend.supports_async_task
    assert ex.one_shot.max_attempts == 1
    assert ex.add.max_attempts is None


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_attemps": 3}, "unknown key(s) max_attemps"),
        ({"max_attempts": 0}, "between 1 and 1000"),
        ({"retry_backoff": -1}, "retry_backoff must be >= 0"),
        ({"retry_jitter": 2}, "retry_jitter must be between 0 and 1"),
    ],
)
def test_bad_options_are_refused_with_a_clear_message(options, message):
    # Built without raising (Django's check of TASKS builds every backend): the check
    # reports the problem, and every use of the backend raises it.
    backend = TaskClaimBackend("bad", {"BACKEND": BACKEND, "OPTIONS": options})
    [error] = backend.check()
    assert error.id == "taskclaim_tasks.E002"
    assert message in error.msg
    with pytest.raises(InvalidTaskBackend, match=re.escape(message)):
        backend.validate_task(ex.add)
    with pytest.raises(InvalidTaskBackend, match=re.escape(message)):
        backend.enqueue(ex.add, (1,), {})
    with pytest.raises(InvalidTaskBackend, match=re.escape(message)):
        backend.get_result("00000000-0000-0000-0000-000000000000")
    assert not QueuedTask.objects.exists()


def test_older_django_is_refused_with_a_clear_message():
    with pytest.raises(ImproperlyConfigured, match=r"added in Django 6\.0.*runs Django 5\.2"):
        check_django_version((5, 2))
    check_django_version((6, 0))


def test_loading_the_app_on_django_5_2_fails_with_improperly_configured():
    code = (
        "import django\n"
        "django.VERSION = (5, 2, 8, 'final', 0)\n"
        "from django.core.exceptions import ImproperlyConfigured\n"
        "try:\n"
        "    django.setup()\n"
        "except ImproperlyConfigured as exc:\n"
        "    print('refused:', exc)\n"
    )
    proc = subprocess.run(
        [PYTHON, "-c", code],
        env=child_env(DJANGO_SETTINGS_MODULE="tests.support.settings_tasks"),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert "refused: django_taskclaim.contrib.tasks needs Django's Tasks framework" in proc.stdout
    assert "runs Django 5.2" in proc.stdout


def test_system_check_reports_a_backend_without_its_app(monkeypatch):
    backend = task_backends["default"]
    assert backend.check() == []
    monkeypatch.setattr(apps, "is_installed", lambda name: False)
    [error] = backend.check()
    assert error.id == "taskclaim_tasks.E001"
    assert "'django_taskclaim.contrib.tasks' is not in INSTALLED_APPS" in error.msg
    with pytest.raises(InvalidTaskBackend, match=re.escape("add 'django_taskclaim.contrib.tasks'")):
        ex.add.enqueue(1)


# -- enqueue validation: InvalidTask, nothing written ----------------------------------------
@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: ex.process_data.enqueue(datetime.now()), "args\\[0\\].*datetime"),
        (lambda: ex.process_data.enqueue(data={1, 2}), "kwargs\\['data'\\].*set"),
        (lambda: ex.process_data.enqueue([math.nan]), "args\\[0\\].*Out of range float"),
        (lambda: ex.process_data.enqueue({"when": object()}), "object is not JSON"),
        (lambda: ex.add.using(queue_name="nope").enqueue(1), "queue_name 'nope' is not valid"),
        (lambda: ex.add.using(priority=101).enqueue(1), "priority must be a whole number"),
        (lambda: ex.add.using(priority=-101).enqueue(1), "between -100 and 100"),
        (
            lambda: ex.add.using(run_after=datetime(2030, 1, 1)).enqueue(1),
            "run_after must be an aware datetime",
        ),
        (lambda: ex.add.using(run_after=timedelta(seconds=-1)).enqueue(1), "negative"),
        (
            lambda: dataclasses.replace(ex.add, max_attempts=0).enqueue(1),
            "max_attempts of tests.support.tasks_examples.add must be a whole number between 1",
        ),
    ],
)
def test_bad_input_raises_invalid_task_and_writes_nothing(make, message):
    before = QueuedTask.objects.count()
    with pytest.raises(InvalidTask, match=message):
        make()
    assert QueuedTask.objects.count() == before == 0


def test_unserialisable_arguments_are_also_a_type_error_as_djangos_docs_show():
    with pytest.raises(TypeError, match="Object of type datetime is not JSON serializable"):
        ex.process_data.enqueue(datetime.now())
    assert not QueuedTask.objects.exists()


# -- enqueue: stored row, transactions ------------------------------------------------------
def test_enqueue_stores_the_task_and_returns_a_ready_result(capture):
    received = capture(task_enqueued)
    result = ex.email_users_on_queue.using(priority=10).enqueue(
        emails=["user@example.com"], subject="You have a message", message="Hello there!"
    )
    row = QueuedTask.objects.get(pk=result.id)
    assert row.task_path == "tests.support.tasks_examples.email_users_on_queue"
    assert row.queue_name == "emails"
    assert row.priority == 10
    assert row.backend_name == "default"
    assert row.kwargs == {
        "emails": ["user@example.com"],
        "subject": "You have a message",
        "message": "Hello there!",
    }
    assert row.args == []
    assert row.status == "ready"
    assert row.max_attempts == 3
    assert result.status == TaskResultStatus.READY
    assert result.enqueued_at == row.created_at
    assert result.worker_ids == []
    assert [(s, r.id) for s, r in received] == [(TaskClaimBackend, result.id)]


def test_enqueue_in_a_rolled_back_transaction_leaves_nothing():
    seen_inside = []

    def enqueue_then_fail():
        with transaction.atomic():
            ex.add.enqueue(1, 2)
            seen_inside.append(QueuedTask.objects.count())  # the caller's own transaction
            raise RuntimeError("roll back")

    with pytest.raises(RuntimeError, match="roll back"):
        enqueue_then_fail()
    assert seen_inside == [1]
    assert not QueuedTask.objects.exists()


def test_enqueued_task_is_invisible_to_workers_until_the_caller_commits():
    seen = []

    def other_connection_sees(pk):
        try:
            seen.append(QueuedTask.objects.filter(pk=pk).exists())
        finally:
            connections.close_all()

    with transaction.atomic():
        result = ex.add.enqueue(1, 2)
        t = threading.Thread(target=other_connection_sees, args=(result.id,))
        t.start()
        t.join(30)
    t = threading.Thread(target=other_connection_sees, args=(result.id,))
    t.start()
    t.join(30)
    assert seen == [False, True]


def test_run_after_defers_the_task_on_the_database_clock():
    later = ex.add.using(run_after=timedelta(hours=1)).enqueue(1)
    due = ex.add.using(run_after=timezone.now() - timedelta(seconds=1)).enqueue(2)
    row = QueuedTask.objects.annotate(db_now=DbNow()).get(pk=later.id)
    assert timedelta(minutes=59) < row.run_after - row.db_now <= timedelta(hours=1)
    assert list(QueuedTask.objects.claimable().values_list("pk", flat=True)) == [
        QueuedTask.objects.get(pk=due.id).pk
    ]


def test_higher_priority_runs_first():
    low = ex.add.using(priority=-5).enqueue(1)
    high = ex.add.using(priority=50).enqueue(2)
    mid = ex.add.enqueue(3)
    order = [str(QueuedTask.objects.claim_next(worker="w").pk) for _ in range(3)]
    assert order == [high.id, mid.id, low.id]


# -- running: results and signals --------------------------------------------------------
def test_result_goes_ready_running_successful_with_signals():
    events = []

    def on_started(sender, task_result, **kw):
        events.append(("started", sender, task_result.status, list(task_result.worker_ids)))
        # What another process sees while the task runs:
        events.append(("seen", default_task_backend.get_result(task_result.id).status))

    def on_finished(sender, task_result, **kw):
        events.append(("finished", sender, task_result.status, task_result.return_value))

    task_started.connect(on_started)
    task_finished.connect(on_finished)
    try:
        result = ex.calculate_meaning_of_life.enqueue()
        row = QueuedTask.objects.claim_next(worker="w-1")
        assert default_task_backend.get_result(result.id).status == TaskResultStatus.RUNNING
        assert run_task(row) == "done"
    finally:
        task_started.disconnect(on_started)
        task_finished.disconnect(on_finished)
    assert events == [
        ("started", TaskClaimBackend, TaskResultStatus.RUNNING, ["w-1"]),
        ("seen", TaskResultStatus.RUNNING),
        ("finished", TaskClaimBackend, TaskResultStatus.SUCCESSFUL, 42),
    ]
    assert result.status == TaskResultStatus.READY
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 42
    assert result.attempts == 1
    assert result.worker_ids == ["w-1"]
    assert result.errors == []
    assert result.enqueued_at <= result.started_at <= result.finished_at
    assert result.last_attempted_at == result.started_at
    got = ex.calculate_meaning_of_life.get_result(result.id)
    assert got.return_value == 42
    with pytest.raises(TaskResultMismatch):
        ex.add.get_result(result.id)


def test_get_result_of_unknown_or_malformed_ids_raises_does_not_exist():
    with pytest.raises(TaskResultDoesNotExist):
        default_task_backend.get_result("00000000-0000-0000-0000-000000000000")
    with pytest.raises(TaskResultDoesNotExist):
        default_task_backend.get_result("not-a-uuid")
    with pytest.raises(TaskResultDoesNotExist):
        async_to_sync(default_task_backend.aget_result)("not-a-uuid")


def test_async_enqueue_and_get_result_and_async_task_on_an_event_loop():
    result = async_to_sync(ex.async_add.aenqueue)(2, 3)
    assert run_one()[1] == "done"
    got = async_to_sync(ex.async_add.aget_result)(result.id)
    assert got.status == TaskResultStatus.SUCCESSFUL
    assert got.return_value == {"sum": 5, "loop": True}
    async_to_sync(result.arefresh)()
    assert result.return_value == {"sum": 5, "loop": True}


def test_task_context_sees_its_result_id_and_attempt():
    result = ex.flaky.enqueue(succeed_on=1)
    assert run_one()[1] == "done"
    result.refresh()
    assert result.return_value == 1


# -- signals and Django's log lines without a TaskResult ----------------------------------------
@pytest.fixture
def results_built(monkeypatch):
    """The TaskResults the runner builds (for a signal or a task context), as a list:
    every one is built in ``announce``."""
    built = []
    real = announce.to_result

    def counting(row, **kwargs):
        result = real(row, **kwargs)
        built.append(result)
        return result

    monkeypatch.setattr(announce, "to_result", counting)
    return built


def _task_lines(caplog):
    return [r.getMessage() for r in caplog.records if r.name == "django.tasks"]


def test_djangos_log_lines_are_written_without_building_a_result(caplog, results_built):
    result = ex.add.enqueue(2, b=3)
    with caplog.at_level(logging.INFO, logger="django.tasks"):
        assert run_one()[1] == "done"
    path = "tests.support.tasks_examples.add"
    assert _task_lines(caplog) == [
        f"Task id={result.id} path={path} state=RUNNING",
        f"Task id={result.id} path={path} state=SUCCESSFUL",
    ]
    assert results_built == []  # only Django's own receivers: nothing else reads a result
    result.refresh()
    assert result.return_value == 5


def test_receivers_connected_later_get_full_results_until_disconnected(caplog, results_built):
    first, second, third = ex.add.enqueue(1), ex.add.enqueue(2), ex.add.enqueue(3)
    with caplog.at_level(logging.INFO, logger="django.tasks"):
        assert run_one()[1] == "done"
        assert results_built == []
        seen = []

        def on_started(sender, task_result, **kwargs):
            seen.append(("started", sender, task_result.id, task_result.status))

        def on_finished(sender, task_result, **kwargs):
            seen.append(("finished", sender, task_result.id, task_result.return_value))

        task_started.connect(on_started)
        task_finished.connect(on_finished)
        try:
            assert run_one()[1] == "done"
        finally:
            task_started.disconnect(on_started)
            task_finished.disconnect(on_finished)
        assert run_one()[1] == "done"
    assert seen == [
        ("started", TaskClaimBackend, second.id, TaskResultStatus.RUNNING),
        ("finished", TaskClaimBackend, second.id, 2),
    ]
    assert len(results_built) == 2  # one per signal, for the second task only
    states = [(line.split()[1], line.split()[-1]) for line in _task_lines(caplog)]
    assert states == [
        (f"id={r.id}", state)
        for r in (first, second, third)
        for state in ("state=RUNNING", "state=SUCCESSFUL")
    ]


def test_without_any_receiver_nothing_is_logged_or_built(caplog, results_built):
    result = ex.add.enqueue(4)
    assert task_started.disconnect(log_task_started)
    assert task_finished.disconnect(log_task_finished)
    try:
        with caplog.at_level(logging.DEBUG, logger="django.tasks"):
            assert run_one()[1] == "done"
    finally:
        task_started.connect(log_task_started)
        task_finished.connect(log_task_finished)
    assert _task_lines(caplog) == []
    assert results_built == []
    result.refresh()
    assert result.return_value == 4


def test_a_task_that_takes_a_context_gets_the_result_the_signal_carries(capture):
    started = capture(task_started)
    result = ex.flaky.enqueue(succeed_on=1)
    assert run_one()[1] == "done"
    assert [(r.id, r.status, r.attempts) for _s, r in started] == [
        (result.id, TaskResultStatus.RUNNING, 1)
    ]


@contextlib.contextmanager
def records_built():
    """Yield the list of log records made for the ``django.tasks`` logger. Meanwhile the
    ``django`` logger keeps Django's own handlers only: pytest's capturing handlers (on
    it and on the root logger, added for each test phase) would emit every record."""
    django_logger = logging.getLogger("django")
    saved = django_logger.handlers, django_logger.propagate
    built = []
    real = logging.Logger.makeRecord

    def counting(self, name, *args, **kwargs):
        record = real(self, name, *args, **kwargs)
        if name == "django.tasks":
            built.append(record.getMessage())
        return record

    django_logger.handlers = [
        h for h in django_logger.handlers if not type(h).__module__.startswith("_pytest")
    ]
    django_logger.propagate = False
    logging.Logger.makeRecord = counting  # type: ignore[method-assign]
    try:
        yield built
    finally:
        logging.Logger.makeRecord = real  # type: ignore[method-assign]
        django_logger.handlers, django_logger.propagate = saved


def test_djangos_log_line_is_not_even_built_where_no_handler_prints_it():
    # Django's default LOGGING: the django logger's INFO records go to a console handler
    # that drops them unless DEBUG is on.
    tasks_logger = logging.getLogger("django.tasks")
    quiet, loud = ex.add.enqueue(1), ex.add.enqueue(2)
    with records_built() as built:
        with override_settings(DEBUG=False):
            assert not runner.log_would_emit(tasks_logger, logging.INFO)
            assert runner.log_would_emit(tasks_logger, logging.ERROR)  # mailed to the admins
            assert run_one()[1] == "done"
        assert built == []
        with override_settings(DEBUG=True):
            assert runner.log_would_emit(tasks_logger, logging.INFO)
            assert run_one()[1] == "done"
    assert built == [
        f"Task id={loud.id} path=tests.support.tasks_examples.add state=RUNNING",
        f"Task id={loud.id} path=tests.support.tasks_examples.add state=SUCCESSFUL",
    ]
    results = [default_task_backend.get_result(r.id) for r in (quiet, loud)]
    assert [r.return_value for r in results] == [1, 2]


class _Counting(logging.Filter):
    pass


@pytest.mark.parametrize(
    ("handler_level", "filters", "logger_filter", "debug", "emits"),
    [
        (logging.NOTSET, [], False, False, True),
        (logging.WARNING, [], False, False, False),
        (logging.NOTSET, ["debug_true"], False, False, False),
        (logging.NOTSET, ["debug_true"], False, True, True),
        (logging.NOTSET, ["debug_false"], False, False, True),
        (logging.NOTSET, ["debug_false"], False, True, False),
        (logging.NOTSET, ["debug_true", "other"], False, False, True),
        (logging.WARNING, [], True, False, True),
    ],
)
def test_log_would_emit_follows_levels_and_djangos_debug_filters(
    handler_level, filters, logger_filter, debug, emits
):
    from django.utils.log import RequireDebugFalse, RequireDebugTrue

    kinds = {"debug_true": RequireDebugTrue, "debug_false": RequireDebugFalse, "other": _Counting}
    parent = logging.getLogger(f"taskclaim.tests.emit.{handler_level}.{'-'.join(filters)}")
    child = logging.getLogger(f"{parent.name}.child")
    handler = logging.NullHandler(level=handler_level)
    for name in filters:
        handler.addFilter(kinds[name]())
    parent.handlers, parent.propagate, parent.level = [handler], False, logging.DEBUG
    child.filters = [_Counting()] if logger_filter else []
    with override_settings(DEBUG=debug):
        assert runner.log_would_emit(child, logging.INFO) is emits
        child.propagate = False  # the parent's handler is no longer reached
        assert runner.log_would_emit(child, logging.INFO) is (logger_filter or False)
        assert runner.log_would_emit(child, logging.WARNING) is True  # logging's last resort
        child.propagate = True


# -- what a successful attempt writes ----------------------------------------------------------
def test_a_retried_success_keeps_the_first_start_and_the_earlier_errors():
    result = ex.flaky.enqueue(succeed_on=2)
    assert drain() == ["ready", "done"]
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.worker_ids == ["w-test", "w-test"]
    assert [e.exception_class for e in result.errors] == [RuntimeError]
    assert result.enqueued_at <= result.started_at < result.last_attempted_at
    assert result.last_attempted_at <= result.finished_at
    row = QueuedTask.objects.get(pk=result.id)
    assert row.attempt_open is False


def test_a_row_an_older_version_left_open_is_closed_by_its_success():
    result = ex.calculate_meaning_of_life.enqueue()
    # An older version listed the worker and set attempt_open when the attempt began;
    # its worker died and the row was reaped back to ready.
    QueuedTask.objects.filter(pk=result.id).update(
        attempts=1,
        worker_ids=["old-w"],
        attempt_open=True,
        last_error="lease expired; held by old-w",
    )
    assert run_one()[1] == "done"
    row = QueuedTask.objects.get(pk=result.id)
    assert row.attempt_open is False
    assert row.worker_ids == ["old-w", "w-test"]
    assert [e["exception_class_path"] for e in row.errors] == [
        "django_taskclaim.contrib.tasks.exceptions.WorkerLost"
    ]
    assert row.return_value == 42


def test_return_values_are_normalised_like_djangos_or_refused():
    ok = ex.returns_tuple_and_bytes.enqueue()
    nan = ex.returns_nan.enqueue()
    assert sorted(drain()) == ["done", "failed"]
    ok.refresh()
    assert ok.return_value == [1, "two", "three"]
    nan.refresh()
    assert nan.status == TaskResultStatus.FAILED
    assert "cannot be stored as JSON: Out of range float values" in nan.errors[0].traceback


def test_retry_with_a_timedelta_delay():
    result = ex.retry_in_a_timedelta.enqueue(5)
    assert run_one()[1] == "ready"
    row = QueuedTask.objects.annotate(db_now=DbNow()).get(pk=result.id)
    assert timedelta(seconds=290) < row.run_after - row.db_now <= timedelta(seconds=300)


def test_a_task_class_with_its_own_call_is_called_through_it():
    result = ex.traced_add.enqueue(1, b=2)
    assert run_one()[1] == "done"
    result.refresh()
    assert result.return_value == {"called_through": "TracedTask.call", "value": 3}


def test_a_path_that_did_not_import_is_tried_again_and_then_runs(tmp_path, monkeypatch):
    module = f"taskclaim_late_tasks_{tmp_path.name.replace('-', '_')}"
    monkeypatch.syspath_prepend(str(tmp_path))
    early, late = ex.add.enqueue(1), ex.add.enqueue(2)
    QueuedTask.objects.filter(pk__in=[early.id, late.id]).update(task_path=f"{module}.times_ten")
    assert run_one()[1] == "failed"
    (tmp_path / f"{module}.py").write_text(
        "from django.tasks import task\n\n\n@task\ndef times_ten(a):\n    return a * 10\n"
    )
    importlib.invalidate_caches()
    try:
        assert run_one()[1] == "done"
    finally:
        sys.modules.pop(module, None)
    early.refresh()
    assert "cannot be imported" in early.errors[0].traceback
    assert default_task_backend.get_result(late.id).return_value == 20


def _takes(a, b=0, *, c, d=4): ...
def _context_first(context, a, *, k=1): ...
def _varargs(a, *rest, **named): ...
def _positional_only(a, /, b): ...
def _no_params(): ...


@pytest.mark.parametrize(
    ("func", "takes_context"),
    [
        (_takes, False),
        (_context_first, True),
        (_varargs, False),
        (_positional_only, False),
        (_no_params, False),
        (_context_first, False),
    ],
)
def test_the_argument_check_agrees_with_signature_bind(func, takes_context):
    calls = [
        ([], {}),
        ([1], {}),
        ([1, 2], {}),
        ([1, 2, 3], {}),
        ([1], {"c": 3}),
        ([1, 2], {"c": 3, "d": 4}),
        ([], {"a": 1, "c": 3}),
        ([1], {"a": 1, "c": 3}),
        ([1], {"c": 3, "z": 0}),
        ([], {"b": 2, "c": 3}),
        ([1], {"k": 2}),
        ([1], {"context": 2}),
        ([1, 2], {"rest": 3}),
    ]
    check = runner._Binder(func, takes_context).check
    signature = inspect.signature(func)
    for args, kwargs in calls:
        try:
            signature.bind(*([None] if takes_context else []), *args, **kwargs)
            expected = None
        except TypeError as exc:
            expected = str(exc)
        try:
            check(args, kwargs)
            got = None
        except TypeError as exc:
            got = str(exc)
        assert got == expected, (func.__name__, args, kwargs)


# -- failures, retries ------------------------------------------------------------------------
def test_exception_is_retried_until_it_succeeds():
    result = ex.flaky.enqueue(succeed_on=3)
    assert drain() == ["ready", "ready", "done"]
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 3
    assert result.attempts == 3
    assert len(result.errors) == 2
    assert result.errors[0].exception_class is RuntimeError
    assert "RuntimeError: attempt 1 fails" in result.errors[0].traceback


def test_exception_ends_failed_after_max_attempts_with_every_traceback(capture):
    finished = capture(task_finished)
    result = ex.raise_value_error.enqueue("boom")
    assert drain() == ["ready", "ready", "failed"]
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.is_finished
    assert result.attempts == 3
    assert [e.exception_class for e in result.errors] == [ValueError] * 3
    assert all("ValueError: boom" in e.traceback for e in result.errors)
    with pytest.raises(ValueError, match="Task failed"):
        result.return_value  # noqa: B018
    assert [(s, r.status) for s, r in finished] == [(TaskClaimBackend, TaskResultStatus.FAILED)]
    assert "gave up after 3 attempt(s)" in QueuedTask.objects.get(pk=result.id).last_error


def test_per_task_max_attempts_and_fail_are_final_at_once():
    one = ex.one_shot.enqueue("once")
    fail = ex.fail_for_good.enqueue("bad input")
    assert sorted(drain()) == ["failed", "failed"]
    for result, cls in ((one, RuntimeError), (fail, None)):
        result.refresh()
        assert result.status == TaskResultStatus.FAILED
        assert result.attempts == 1
        if cls:
            assert result.errors[0].exception_class is cls
    assert "bad input" in fail.errors[0].traceback


def test_retry_raised_by_the_task_sets_its_own_delay():
    result = ex.retry_later.enqueue(300)
    assert run_one()[1] == "ready"
    row = QueuedTask.objects.annotate(db_now=DbNow()).get(pk=result.id)
    assert timedelta(seconds=290) < row.run_after - row.db_now <= timedelta(seconds=300)
    result.refresh()
    assert result.status == TaskResultStatus.READY
    assert result.errors[0].exception_class_path == "django_taskclaim.exceptions.Retry"
    assert "not yet, retry in 300s" in row.last_error


def test_retry_backoff_comes_from_the_backend_options():
    tasks = {
        "default": {
            "BACKEND": BACKEND,
            "OPTIONS": {"max_attempts": 2, "retry_backoff": 600, "retry_jitter": 0},
        }
    }
    with override_settings(TASKS=tasks):
        result = ex.raise_value_error.enqueue("later")
        assert run_one()[1] == "ready"
        row = QueuedTask.objects.annotate(db_now=DbNow()).get(pk=result.id)
        assert timedelta(seconds=590) < row.run_after - row.db_now <= timedelta(seconds=600)
        assert not QueuedTask.objects.claimable().exists()
        assert row.max_attempts == 2


def test_unimportable_path_and_undecodable_arguments_fail_at_once_with_a_clear_error():
    gone_module = ex.add.enqueue(1)
    gone_attr = ex.add.enqueue(2)
    not_a_task = ex.add.enqueue(3)
    bad_args = ex.add.enqueue(4)
    bad_kwargs = ex.add.enqueue(5)
    wrong_sig = ex.add.enqueue(6)
    good = ex.add.enqueue(7, b=1)
    QueuedTask.objects.filter(pk=gone_module.id).update(task_path="tests.no_such_module.add")
    QueuedTask.objects.filter(pk=gone_attr.id).update(
        task_path="tests.support.tasks_examples.removed"
    )
    QueuedTask.objects.filter(pk=not_a_task.id).update(
        task_path="tests.support.tasks_examples.logger"
    )
    QueuedTask.objects.filter(pk=bad_args.id).update(args={"a": 1})
    QueuedTask.objects.filter(pk=bad_kwargs.id).update(kwargs=[1, 2])
    QueuedTask.objects.filter(pk=wrong_sig.id).update(args=[1, 2, 3])
    assert sorted(drain()) == ["done"] + ["failed"] * 6
    expected = {
        gone_module.id: "task 'tests.no_such_module.add' cannot be imported",
        gone_attr.id: "task 'tests.support.tasks_examples.removed' cannot be imported",
        not_a_task.id: "resolves to a Logger, not a django.tasks Task",
        bad_args.id: f"positional arguments of {EX}.add are not a JSON array",
        bad_kwargs.id: f"keyword arguments of {EX}.add are not a JSON object",
        wrong_sig.id: "stored arguments do not match tests.support.tasks_examples.add(a, b=0)",
    }
    for pk, text in expected.items():
        result = default_task_backend.get_result(pk)
        assert result.status == TaskResultStatus.FAILED, text
        assert result.attempts == 1, text
        assert text in result.errors[0].traceback
        assert text in QueuedTask.objects.get(pk=pk).last_error
    assert default_task_backend.get_result(gone_module.id).task.module_path == (
        "tests.no_such_module.add"
    )
    assert default_task_backend.get_result(good.id).return_value == 8


def test_unserialisable_return_value_fails_the_task():
    result = ex.returns_unserialisable.enqueue()
    assert run_one()[1] == "failed"
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert "cannot be stored as JSON" in result.errors[0].traceback


# -- fencing and recovery ----------------------------------------------------------------
def test_a_worker_that_lost_its_claim_writes_no_result():
    result = ex.calculate_meaning_of_life.enqueue()
    stale = QueuedTask.objects.claim_next(worker="w-old")
    assert QueuedTask.objects.processing().release() == 1  # e.g. the admin took it back
    assert run_task(stale) == "lost"
    result.refresh()
    assert result.status == TaskResultStatus.READY
    assert result.worker_ids == []
    assert run_one()[1] == "done"
    result.refresh()
    assert result.return_value == 42
    # the stale claim counted as an attempt that recorded no outcome
    assert result.worker_ids == ["w-old", "w-test"]
    assert [e.exception_class_path for e in result.errors] == [
        "django_taskclaim.contrib.tasks.exceptions.WorkerLost"
    ]
    assert "released from worker w-old" in result.errors[0].traceback


def _crash_during_attempt(lease=30):
    """A worker claims the task, starts the attempt and dies; the lease then expires."""
    from django_taskclaim.contrib.tasks import runner

    row = QueuedTask.objects.claim_next(worker="w-dead", lease=lease)
    runner._start(row, runner.lost_attempts(row))
    QueuedTask.objects.filter(pk=row.pk).update(locked_until=DbNow() - timedelta(seconds=1))
    assert reap(QueuedTask).requeued == 1


def test_an_attempt_lost_with_its_worker_is_recorded_and_the_task_runs_again():
    result = ex.calculate_meaning_of_life.enqueue()
    _crash_during_attempt()
    assert run_one()[1] == "done"
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 42
    assert result.worker_ids == ["w-dead", "w-test"]
    assert result.attempts == 2
    assert [e.exception_class_path for e in result.errors] == [
        "django_taskclaim.contrib.tasks.exceptions.WorkerLost"
    ]
    assert "attempt 1 on worker w-dead did not record an outcome" in result.errors[0].traceback
    assert "lease expired; held by w-dead" in result.errors[0].traceback


def test_a_task_that_keeps_losing_its_worker_ends_failed_after_max_attempts():
    result = ex.calculate_meaning_of_life.enqueue()
    for _ in range(3):
        _crash_during_attempt()
    row = QueuedTask.objects.claim_next(worker="w-last")
    assert run_task(row) == "failed"
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert len(result.errors) == 3
    assert result.attempts == 3
    assert "exceeds max_attempts=3" in QueuedTask.objects.get(pk=result.id).last_error


# -- admin ----------------------------------------------------------------------------------
def test_admin_lists_tasks_and_retries_failed_ones(admin_client):
    failed = ex.one_shot.enqueue("x")
    drain()
    url = "/admin/taskclaim_tasks/queuedtask/"
    page = admin_client.get(url)
    assert page.status_code == 200
    assert b"tests.support.tasks_examples.one_shot" in page.content
    detail = admin_client.get(f"{url}{failed.id}/change/")
    assert detail.status_code == 200
    assert b"RuntimeError: x" in detail.content
    response = admin_client.post(
        url, {"action": "taskclaim_retry_failed", "_selected_action": [failed.id]}
    )
    assert response.status_code == 302
    failed.refresh()
    assert failed.status == TaskResultStatus.READY


def test_sqlite_connection_is_closed_for_threads():
    # Guard for the thread-based visibility test above: the main connection still works.
    assert connection.vendor in ("postgresql", "mysql", "sqlite")
