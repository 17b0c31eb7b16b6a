"""The ``django.tasks`` backend end to end: real worker subprocesses, results read from
another process, SIGKILL recovery, and tasks that can no longer run.

Needs the sub-app installed: run with ``--ds=tests.support.settings_tasks``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from functools import partial

import pytest
from django.apps import apps

if not apps.is_installed("django_taskclaim.contrib.tasks"):
    pytest.skip(
        "the django.tasks backend is not installed; run with --ds=tests.support.settings_tasks",
        allow_module_level=True,
    )

from django.db import transaction
from django.tasks import TaskResultStatus, default_task_backend

from django_taskclaim.contrib.tasks.models import QueuedTask
from tests.support import tasks_examples as ex
from tests.support.helpers import PYTHON, ROOT, child_env, wait_for
from tests.support.testapp.models import Document

pytestmark = pytest.mark.django_db(transaction=True)

MODEL = "taskclaim_tasks.QueuedTask"

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
        "module_path": r.task.module_path,
        "finished": r.is_finished,
    }
print(json.dumps(out))
"""


def _env(**extra):
    return child_env(DJANGO_SETTINGS_MODULE="tests.support.settings_tasks", **extra)


def worker_cmd(*args):
    return [PYTHON, "-m", "django", "taskclaim_worker", MODEL, *args]


def run_burst(*args, timeout=120, **env):
    """Run a worker that drains what is ready and exits; return the completed process."""
    proc = subprocess.run(
        worker_cmd("--burst", *args),
        env=_env(**env),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def results_from_another_process(*ids):
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


def test_djangos_documentation_examples_run_end_to_end():
    # Defining / modifying / enqueueing Tasks, as in Django's Tasks documentation.
    assert ex.email_users.using(priority=10).priority == 10
    assert ex.email_users.priority == 0
    mail = ex.email_users.enqueue(
        emails=["user@example.com"], subject="You have a message", message="Hello there!"
    )
    on_queue = ex.email_users_on_queue.enqueue(
        emails=["user@example.com"], subject="Queued", message="Hello!"
    )
    with_context = ex.email_users_with_context.enqueue(
        emails=["user@example.com"], subject="Context", message="Hello!"
    )
    meaning = ex.calculate_meaning_of_life.using(priority=10).enqueue()
    doubled = ex.double_dictionary.enqueue((1, 2, 3))
    coroutine = ex.async_add.enqueue(20, 22)
    # Transactions: enqueue inside the block (transactional here), or on commit.
    with transaction.atomic():
        Document.objects.create(title="thing 1")
        inside = ex.my_task.enqueue(thing_num=1)
    with transaction.atomic():
        Document.objects.create(title="thing 2")
        transaction.on_commit(partial(ex.my_task.enqueue, thing_num=2))
    assert QueuedTask.objects.count() == 8
    on_commit_id = str(QueuedTask.objects.get(kwargs={"thing_num": 2}).pk)

    run_burst("--worker-id", "docs-worker", "--concurrency", "2")

    ids = [
        mail.id,
        on_queue.id,
        with_context.id,
        meaning.id,
        doubled.id,
        coroutine.id,
        inside.id,
        on_commit_id,
    ]
    seen = results_from_another_process(*ids)
    for rid in (mail.id, on_queue.id, with_context.id):
        assert seen[rid]["status"] == "SUCCESSFUL"
        assert seen[rid]["return_value"] == 1
    assert seen[meaning.id]["return_value"] == 42
    assert seen[coroutine.id]["return_value"] == {"sum": 42, "loop": True}
    thing_pks = dict(Document.objects.values_list("title", "pk"))
    assert seen[inside.id]["return_value"] == thing_pks["thing 1"]
    assert seen[on_commit_id]["return_value"] == thing_pks["thing 2"]
    # The tuple became a list in JSON: the task fails, as the documentation explains.
    assert seen[doubled.id]["status"] == "FAILED"
    assert seen[doubled.id]["attempts"] == 3
    assert seen[doubled.id]["errors"][0][0] == "builtins.TypeError"
    assert "TypeError: unhashable type: 'list'" in seen[doubled.id]["errors"][0][1]
    for rid in ids:
        assert seen[rid]["finished"]
        assert set(seen[rid]["worker_ids"]) == {"docs-worker"}
    # ... and the TaskResult objects held by the enqueuing process refresh to the same.
    meaning.refresh()
    assert meaning.status == TaskResultStatus.SUCCESSFUL
    assert meaning.return_value == 42
    assert ex.email_users.get_result(mail.id).return_value == 1
    assert default_task_backend.get_result(doubled.id).errors[0].exception_class is TypeError


def test_the_worker_logs_djangos_lines_and_sends_signals_to_connected_receivers():
    def lines(result):
        path = "tests.support.tasks_examples.add"
        return [f"Task id={result.id} path={path} state={s}" for s in ("RUNNING", "SUCCESSFUL")]

    # Only Django's own receivers: their log lines, written by the worker.
    quiet = [ex.add.enqueue(i) for i in range(3)]
    proc = run_burst("--concurrency", "2", TASKCLAIM_TEST_TASKS_LOG="1")
    logged = proc.stderr.splitlines()
    for result in quiet:
        assert [line for line in logged if f"id={result.id}" in line] == lines(result)
    assert not Document.objects.exists()
    # Receivers connected in the worker: full TaskResults, task_finished after the write.
    watched = [ex.add.enqueue(10 + i) for i in range(3)]
    proc = run_burst(
        "--concurrency", "2", "--worker-id", "sig-worker",
        TASKCLAIM_TEST_TASKS_LOG="1", TASKCLAIM_TEST_TASK_RECEIVERS="1",
    )  # fmt: skip
    logged = proc.stderr.splitlines()
    for value, result in enumerate(watched, start=10):
        assert [line for line in logged if f"id={result.id}" in line] == lines(result)
        started = Document.objects.get(title=f"started {result.id}")
        assert started.kind == "RUNNING"
        assert started.payload == {"sender": "TaskClaimBackend", "worker_ids": ["sig-worker"]}
        finished = Document.objects.get(title=f"finished {result.id}")
        assert finished.kind == "SUCCESSFUL"
        assert finished.payload == {
            "return_value": value,
            "stored_status": "SUCCESSFUL",
            "stored_return_value": value,
        }
    assert Document.objects.count() == 2 * len(watched)


def test_queue_option_runs_only_that_queue():
    emails = ex.email_users_on_queue.enqueue(emails=["a@example.com"], subject="s", message="m")
    other = ex.add.enqueue(1, 2)
    run_burst("--queue", "emails")
    seen = results_from_another_process(emails.id, other.id)
    assert seen[emails.id]["status"] == "SUCCESSFUL"
    assert seen[other.id]["status"] == "READY"
    run_burst("--queue", "default")
    assert results_from_another_process(other.id)[other.id]["return_value"] == 3


def test_tasks_that_cannot_run_end_failed_and_the_worker_keeps_going():
    before = ex.add.enqueue(1, 1)
    gone = ex.add.enqueue(2)
    bad_args = ex.add.enqueue(3)
    after = ex.add.enqueue(4, 4)
    QueuedTask.objects.filter(pk=gone.id).update(task_path="tests.tasks_examples_gone.add")
    QueuedTask.objects.filter(pk=bad_args.id).update(args={"not": "a list"})
    run_burst("--concurrency", "1")
    seen = results_from_another_process(before.id, gone.id, bad_args.id, after.id)
    assert seen[before.id]["return_value"] == 2
    assert seen[after.id]["return_value"] == 8
    assert seen[gone.id]["status"] == "FAILED"
    assert seen[gone.id]["attempts"] == 1
    assert seen[gone.id]["module_path"] == "tests.tasks_examples_gone.add"
    assert (
        "task 'tests.tasks_examples_gone.add' cannot be imported" in seen[gone.id]["errors"][0][1]
    )
    assert seen[bad_args.id]["status"] == "FAILED"
    assert seen[bad_args.id]["attempts"] == 1
    assert "are not a JSON array" in seen[bad_args.id]["errors"][0][1]


def test_sigkill_mid_task_is_recovered_after_the_lease_and_succeeds_exactly_once(tmp_path):
    marker = "sigkill-once"
    log = tmp_path / "rescuer.log"
    result = ex.slow_first_attempt.enqueue(marker)
    first = subprocess.Popen(
        # one process, no supervisor to give its row back: it waits for its lease
        worker_cmd("--lease", "2", "--no-reap", "--worker-id", "doomed", "--no-supervisor"),
        env=_env(),
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    second = None
    try:
        wait_for(
            lambda: Document.objects.filter(title__startswith=f"{marker} started").exists(),
            timeout=60,
            what="the first attempt to start",
        )
        os.kill(first.pid, signal.SIGKILL)
        assert first.wait(timeout=30) == -signal.SIGKILL
        assert default_task_backend.get_result(result.id).status == TaskResultStatus.RUNNING
        with log.open("w") as out:
            second = subprocess.Popen(
                worker_cmd("--lease", "30", "--worker-id", "rescuer"),
                env=_env(TASKCLAIM_TEST_REAP_INTERVAL="0.5"),
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        wait_for(
            lambda: results_from_another_process(result.id)[result.id]["finished"],
            timeout=90,
            interval=0.5,
            what="the task to be recovered and finished",
        )
        second.send_signal(signal.SIGTERM)
        assert second.wait(timeout=60) == 0, log.read_text()
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
    seen = results_from_another_process(result.id)[result.id]
    assert seen["status"] == "SUCCESSFUL"
    assert seen["return_value"]["attempt"] == 2
    assert seen["worker_ids"] == ["doomed", "rescuer"]
    assert [e[0] for e in seen["errors"]] == [
        "django_taskclaim.contrib.tasks.exceptions.WorkerLost"
    ]
    assert "attempt 1 on worker doomed did not record an outcome" in seen["errors"][0][1]
    assert Document.objects.filter(title=marker).count() == 1  # completed exactly once
