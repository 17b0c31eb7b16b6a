"""The ``django.tasks`` backend at its seams: a task that raises a ``BaseException``
(``SystemExit``, ``KeyboardInterrupt``, ``exit()``) run by a real worker process, the
tracebacks stored in ``TaskResult.errors``, and poison ``priority`` / ``run_after`` values
refused at enqueue with nothing written.

Needs the sub-app installed: run with ``--ds=tests.support.settings_tasks``.
"""

from __future__ import annotations

import json
import subprocess
import traceback
import uuid
from datetime import UTC, datetime, timedelta, timezone

import pytest
from django.apps import apps

if not apps.is_installed("django_taskclaim.contrib.tasks"):
    pytest.skip(
        "the django.tasks backend is not installed; run with --ds=tests.support.settings_tasks",
        allow_module_level=True,
    )

from django.tasks import task
from django.tasks.exceptions import InvalidTask

from django_taskclaim.contrib.tasks.models import QueuedTask
from django_taskclaim.contrib.tasks.outcomes import error_entry
from django_taskclaim.db import DbNow
from tests.support.helpers import PYTHON, ROOT, child_env

pytestmark = pytest.mark.django_db(transaction=True)

MODEL = "taskclaim_tasks.QueuedTask"
HERE = __name__


# -- task functions (imported by the worker subprocess too) ------------------------------
@task(max_attempts=1)
def leaves(how: str) -> None:
    """Raise the ``BaseException`` named by ``how``."""
    if how == "SystemExit":
        raise SystemExit(3)
    if how == "KeyboardInterrupt":
        raise KeyboardInterrupt("pressed")
    if how == "exit()":
        exit()  # the builtin a script calls, on purpose
    raise AssertionError(how)


@task(max_attempts=2)
def leaves_every_time() -> None:
    raise SystemExit("stop")


@task
def raises_value_error(message: str) -> None:
    raise ValueError(message)


@task
def add(a: int, b: int = 0) -> int:
    return a + b


@task(max_attempts=1)
def returns(what: str) -> str:
    """A value no database stores (a lone surrogate, a NUL character) or a good one;
    counts its runs in the ledger of the test app."""
    from tests.support.testapp.models import Ledger

    Ledger.objects.create(task_id=0, token=0, worker=f"ran:{what}")
    return {"surrogate": "x\ud800y", "nul": "a\x00b"}.get(what, what)


# -- helpers ---------------------------------------------------------------------------------
READ_RESULTS = """
import json, sys
import django
django.setup()
from django.tasks import default_task_backend
out = {}
for rid in sys.argv[1:]:
    r = default_task_backend.get_result(rid)
    out[rid] = {
        "status": r.status.value,
        "return_value": r.return_value if r.status == "SUCCESSFUL" else None,
        "attempts": r.attempts,
        "worker_ids": r.worker_ids,
        "errors": [[e.exception_class_path, e.traceback] for e in r.errors],
    }
print(json.dumps(out))
"""


def _env(**extra: str) -> dict[str, str]:
    return child_env(DJANGO_SETTINGS_MODULE="tests.support.settings_tasks", **extra)


def run_burst(*args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [PYTHON, "-m", "django", "taskclaim_worker", MODEL, "--burst", *args],
        env=_env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def results_from_another_process(*ids: str) -> dict:
    proc = subprocess.run(
        [PYTHON, "-c", READ_RESULTS, *ids],
        env=_env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


# -- BaseException of a task -------------------------------------------------------------------
def test_a_task_that_raises_a_base_exception_ends_failed_with_its_own_error():
    ids = {how: leaves.enqueue(how).id for how in ("SystemExit", "KeyboardInterrupt", "exit()")}
    twice = leaves_every_time.enqueue().id
    after = add.enqueue(20, 22).id

    run_burst("--concurrency", "1", "--worker-id", "w1")

    seen = results_from_another_process(*ids.values(), twice, after)
    expected = {
        "SystemExit": ("builtins.SystemExit", "SystemExit: 3\n"),
        "KeyboardInterrupt": ("builtins.KeyboardInterrupt", "KeyboardInterrupt: pressed\n"),
        "exit()": ("builtins.SystemExit", "SystemExit: None\n"),
    }
    for how, rid in ids.items():
        got = seen[rid]
        assert got["status"] == "FAILED", (how, got)
        assert got["attempts"] == 1, (how, got)
        assert got["worker_ids"] == ["w1"]
        [(path, text)] = got["errors"]  # the task's own error, no WorkerLost
        cls, last_line = expected[how]
        assert path == cls
        # As Django's own backends store it: traceback.format_exception(), joined.
        assert text.startswith("Traceback (most recent call last):\n")
        assert f"in {leaves.func.__name__}" in text
        assert text.endswith(last_line), text[-200:]
    # With attempts to spare, it is retried like any failure, then ends FAILED.
    assert seen[twice]["status"] == "FAILED"
    assert seen[twice]["attempts"] == 2
    assert [e[0] for e in seen[twice]["errors"]] == ["builtins.SystemExit"] * 2
    assert seen[twice]["worker_ids"] == ["w1", "w1"]
    # The worker went on: the task after them ran.
    assert seen[after]["status"] == "SUCCESSFUL"
    assert seen[after]["return_value"] == 42
    row = QueuedTask.objects.get(pk=ids["SystemExit"])
    assert row.status == "failed"
    assert "SystemExit" in row.last_error


def test_stored_tracebacks_end_with_a_newline_as_djangos_do():
    rid = raises_value_error.enqueue("boom").id
    run_burst("--concurrency", "1")
    got = results_from_another_process(rid)[rid]
    assert got["status"] == "FAILED"
    assert (
        len(got["errors"]) == got["attempts"] == 3
    )  # max_attempts of tests.support.settings_tasks
    for path, text in got["errors"]:
        assert path == "builtins.ValueError"
        assert text.startswith("Traceback (most recent call last):\n")
        assert text.endswith("ValueError: boom\n")


@pytest.mark.parametrize("exc", [ValueError("boom"), SystemExit(3), KeyboardInterrupt()])
def test_an_error_entry_is_the_traceback_djangos_backends_store(exc):
    try:
        raise exc
    except BaseException as caught:
        entry = error_entry(caught, Exception)
        django_text = "".join(traceback.format_exception(caught))  # ImmediateBackend's
    assert entry["traceback"] == django_text
    assert entry["exception_class_path"] == f"builtins.{type(exc).__name__}"


def test_result_ids_are_time_ordered_uuids():
    first, second = add.enqueue(1), add.enqueue(2)
    assert uuid.UUID(first.id).version == 7
    assert uuid.UUID(first.id).int >> 80 <= uuid.UUID(second.id).int >> 80


# -- a return value no database stores --------------------------------------------------------
@pytest.mark.parametrize("poison", ["surrogate", "nul"])
def test_an_unstorable_return_value_fails_its_task_alone(poison):
    """Five good tasks and one returning a value the database refuses, in one batch with
    a 1 s ack window: the poison fails once with a clear error, the five succeed, each
    body runs exactly once, the worker exits normally."""
    from django.db import connection

    from tests.support.testapp.models import Ledger

    if poison == "nul" and connection.vendor != "postgresql":
        pytest.skip("only PostgreSQL refuses NUL characters in JSON text")
    good = [returns.enqueue(f"good{i}").id for i in range(5)]
    bad = returns.enqueue(poison).id
    proc = run_burst("--batch", "10", "--ack-window", "1")
    assert "claimer crashed" not in proc.stderr
    seen = results_from_another_process(*good, bad)
    for rid in good:
        assert seen[rid]["status"] == "SUCCESSFUL", seen[rid]
    if connection.vendor == "sqlite" and poison == "surrogate":
        # SQLite keeps the JSON text as written: the escaped surrogate is stored.
        assert seen[bad]["status"] == "SUCCESSFUL", seen[bad]
    else:
        assert seen[bad]["status"] == "FAILED", seen[bad]
        assert "could not be stored" in QueuedTask.objects.get(pk=bad).last_error
    runs = list(Ledger.objects.filter(worker__startswith="ran:").values_list("worker", flat=True))
    assert sorted(runs) == sorted([f"ran:good{i}" for i in range(5)] + [f"ran:{poison}"])


# -- poison values at enqueue -------------------------------------------------------------------
@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda: add.using(priority=float("nan")), r"priority must be a whole number .*got nan"),
        (lambda: add.using(priority=float("inf")), r"priority must be a whole number .*got inf"),
        (lambda: add.using(priority=-float("inf")), r"priority must be .*got -inf"),
        (
            lambda: add.using(run_after=timedelta(days=999_999_999)),
            r"run_after must be at most 36500 days ahead, got "
            r"datetime\.timedelta\(days=999999999\)",
        ),
        (
            lambda: add.using(run_after=timedelta(days=36501)),
            r"run_after must be at most 36500 days ahead",
        ),
        (
            lambda: add.using(run_after=timedelta(seconds=-1)),
            r"run_after must not be a negative timedelta",
        ),
        (
            lambda: add.using(run_after=datetime.max.replace(tzinfo=timezone(-timedelta(hours=5)))),
            r"run_after .* is out of range: it must be between",
        ),
        (
            lambda: add.using(run_after=datetime.min.replace(tzinfo=timezone(timedelta(hours=5)))),
            r"run_after .* is out of range: it must be between",
        ),
    ],
)
def test_poison_priority_and_run_after_are_clear_value_errors_and_nothing_is_written(make, says):
    for call in (make, lambda: make().enqueue(1)):
        with pytest.raises(InvalidTask, match=says) as caught:
            call()
        assert isinstance(caught.value, ValueError)
        assert "\n" not in str(caught.value)
    assert not QueuedTask.objects.exists()


def test_the_furthest_run_after_is_stored_and_waits():
    far = add.using(run_after=timedelta(days=36500)).enqueue(1)
    last = add.using(run_after=datetime(9999, 12, 31, tzinfo=UTC)).enqueue(2)
    rows = {str(r.pk): r for r in QueuedTask.objects.all()}
    assert set(rows) == {far.id, last.id}
    assert rows[last.id].run_after == datetime(9999, 12, 31, tzinfo=UTC)
    assert QueuedTask.objects.filter(
        pk=far.id, run_after__gt=DbNow() + timedelta(days=36499)
    ).exists()
    assert not QueuedTask.objects.claimable().exists()
