"""The edges a newcomer to the ``django.tasks`` backend hits, each refused in one line
without a traceback: a typo in ``TASKS[...]["OPTIONS"]`` (``manage.py check`` and the
worker), the worker of ``QueuedTask`` without the app installed, ``enqueue()`` before
``migrate``, a ``--queue`` no backend lists. Real subprocesses, real databases.

Needs the sub-app installed: run with ``--ds=tests.support.settings_tasks``.
"""

from __future__ import annotations

import os
import subprocess
import textwrap
from pathlib import Path

import pytest
from django.apps import apps

if not apps.is_installed("django_taskclaim.contrib.tasks"):
    pytest.skip(
        "the django.tasks backend is not installed; run with --ds=tests.support.settings_tasks",
        allow_module_level=True,
    )

from django_taskclaim.contrib.tasks.models import QueuedTask
from django_taskclaim.contrib.tasks.preflight import queue_problem, worker_refusal
from tests.support import tasks_examples as ex
from tests.support.helpers import PYTHON, ROOT, child_env
from tests.support.testapp.models import Document

pytestmark = pytest.mark.django_db(transaction=True)

MODEL = "taskclaim_tasks.QueuedTask"
TYPO = "TASKS['default']['OPTIONS'] has unknown key(s) max_attemps"


def settings_module(tmp_path: Path, body: str) -> dict[str, str]:
    """The environment of a subprocess whose settings are the tasks test settings plus
    ``body`` (a module written under ``tmp_path``)."""
    (tmp_path / "edge_settings.py").write_text(
        "from tests.support.settings_tasks import *  # noqa: F403\n" + textwrap.dedent(body)
    )
    return child_env(
        DJANGO_SETTINGS_MODULE="edge_settings",
        PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]),
    )


def run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120
    )


def one_line_error(proc: subprocess.CompletedProcess[str]) -> str:
    """The error a refused command printed: exactly one line, no traceback."""
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    return lines[0]


@pytest.fixture
def typo_env(tmp_path):
    return settings_module(
        tmp_path,
        """
        TASKS = {"default": {**TASKS["default"], "OPTIONS": {"max_attemps": 3}}}
        """,
    )


def test_a_typo_in_options_is_the_checks_message_not_a_traceback(typo_env):
    proc = run(["-m", "django", "check"], typo_env)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr, proc.stderr
    assert f"(taskclaim_tasks.E002) {TYPO}" in proc.stderr
    assert "HINT: Fix TASKS['default'] in your settings" in proc.stderr


@pytest.mark.parametrize("command", ["worker", "taskclaim_worker"])
def test_the_worker_refuses_to_start_with_a_typo_in_options(typo_env, command):
    ex.add.enqueue(1, 2)  # a task it would run: refused before any claim
    for labels in ([MODEL], []):
        line = one_line_error(run(["-m", "django", command, *labels, "--burst"], typo_env))
        assert line.startswith(f"CommandError: {TYPO}"), line
        assert "(taskclaim_tasks.E002)" in line
    assert QueuedTask.objects.get().status == "ready"


def test_a_worker_of_another_model_ignores_the_tasks_settings(typo_env):
    Document.objects.create(title="d")
    proc = run(["-m", "django", "worker", "testapp.Document", "--burst"], typo_env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert Document.objects.get().status == "done"


def test_the_worker_of_queued_task_without_the_app_says_which_app_to_add():
    env = child_env(DJANGO_SETTINGS_MODULE="tests.support.settings")
    line = one_line_error(run(["-m", "django", "worker", MODEL, "--burst"], env))
    assert line == (
        f"CommandError: {MODEL} is the model of 'django_taskclaim.contrib.tasks', which is "
        "not installed: add 'django_taskclaim.contrib.tasks' to INSTALLED_APPS, then run "
        "python manage.py migrate"
    )


def test_a_queue_in_no_backends_queues_is_refused():
    ex.add.enqueue(1, 2)
    env = child_env(DJANGO_SETTINGS_MODULE="tests.support.settings_tasks")
    line = one_line_error(run(["-m", "django", "worker", MODEL, "--burst", "--queue", "nope"], env))
    assert line == (
        "CommandError: --queue 'nope' is in the QUEUES of no TaskClaimBackend of TASKS (they "
        "list 'default', 'emails', 'other'): no task can be enqueued there; choose one of "
        "those or add it to QUEUES"
    )
    proc = run(["-m", "django", "worker", MODEL, "--burst", "--queue", "default"], env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert QueuedTask.objects.get().status == "done"


def test_queue_rules_of_the_preflight(settings):
    assert queue_problem("emails") is None
    assert "'nope'" in (queue_problem("nope") or "")
    assert worker_refusal([Document], "nope") is None  # not the task table: not its rule
    settings.TASKS = {"default": {**settings.TASKS["default"], "QUEUES": []}}
    assert queue_problem("anything") is None  # QUEUES = []: every queue name is accepted


def test_enqueue_before_migrate_says_to_run_migrate(tmp_path):
    env = settings_module(
        tmp_path,
        f"""
        DATABASES = {{"default": {{"ENGINE": "django.db.backends.sqlite3",
                                  "NAME": {str(tmp_path / "fresh.sqlite3")!r}}}}}
        """,
    )
    code = (
        "import django; django.setup()\n"
        "from django.tasks.exceptions import InvalidTaskBackend\n"
        "from tests.support import tasks_examples as ex\n"
        "try:\n"
        "    ex.add.enqueue(1, 2)\n"
        "except InvalidTaskBackend as exc:\n"
        "    print('refused:', exc)\n"
    )
    proc = run(["-c", code], env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == (
        "refused: TASKS['default'] cannot store tasks: the database 'default' lacks the task "
        "table (table taskclaim_tasks_queuedtask is missing): run python manage.py migrate"
    )
