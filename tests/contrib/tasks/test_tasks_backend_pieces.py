"""The pieces of the ``django.tasks`` backend's runner, each on its own: resolving and
calling a Task (``calling``), recording an attempt (``outcomes``) and announcing it
(``announce``); and that the runner uses the core's rules rather than copies of them.

Needs the sub-app installed: run with ``--ds=tests.support.settings_tasks``.
"""

from __future__ import annotations

import math
import re
from datetime import timedelta
from pathlib import Path

import pytest
from django.apps import apps

if not apps.is_installed("django_taskclaim.contrib.tasks"):
    pytest.skip(
        "the django.tasks backend is not installed; run with --ds=tests.support.settings_tasks",
        allow_module_level=True,
    )

from django.tasks import TaskResultStatus
from django.tasks.signals import task_finished, task_started
from django.test import override_settings

from django_taskclaim.contrib.tasks import announce, calling, outcomes, runner
from django_taskclaim.contrib.tasks.backend import TaskClaimBackend
from django_taskclaim.contrib.tasks.exceptions import ArgumentsUndecodable, WorkerLost
from django_taskclaim.contrib.tasks.models import QueuedTask
from django_taskclaim.db import DbNow
from django_taskclaim.settle.outcome import run_task
from django_taskclaim.settle.writes import MAX_ERROR_CHARS, format_error
from tests.support import tasks_examples as ex

BACKEND = "django_taskclaim.contrib.tasks.backend.TaskClaimBackend"
TASKS_DIR = Path(runner.__file__).parent


def _row(**fields):
    """An unsaved row of ``tests.support.tasks_examples.add`` (no query is made)."""
    values = {"task_path": "tests.support.tasks_examples.add", "args": [1], "kwargs": {}} | fields
    return QueuedTask(**values)


# -- one rule, one place ----------------------------------------------------------------
def test_the_runner_modules_hold_no_copy_of_a_core_rule():
    """Backoff, error capping and fenced writes come from the core: the runner's modules
    draw no random numbers, cap no text, format no traceback and write no SQL."""
    copies = re.compile(
        r"\brandom\b|MAX_ERROR_CHARS|traceback\.format_exc|2 \*\*|\.update\(|"
        r"F\(\"version\"\)|RawSQL|connections?\[|\.cursor\(|\bUPDATE\b"
    )
    for name in ("runner", "calling", "outcomes", "announce"):
        source = (TASKS_DIR / f"{name}.py").read_text()
        code = re.sub(r'"""[\s\S]*?"""', "", source)  # docstrings may name the rules
        found = [line for line in code.splitlines() if copies.search(line.split("#")[0])]
        assert found == [], name


def test_the_runner_keeps_the_names_other_code_imports():
    assert QueuedTask.ClaimMeta.handler == "django_taskclaim.contrib.tasks.runner.execute"
    for name in ("execute", "log_would_emit", "lost_attempts", "_Binder", "_start", "backoff"):
        assert callable(getattr(runner, name)), name


# -- backoff: the core's retry_delay with the backend's options ------------------------------
@pytest.mark.parametrize(
    ("attempts", "expected"), [(1, 10.0), (2, 20.0), (3, 40.0), (4, 50.0), (60, 50.0)]
)
def test_backoff_is_the_core_rule_with_the_backend_options(attempts, expected):
    tasks = {
        "default": {
            "BACKEND": BACKEND,
            "OPTIONS": {"retry_backoff": 10, "retry_backoff_max": 50, "retry_jitter": 0},
        }
    }
    with override_settings(TASKS=tasks):
        assert outcomes.backoff("default", attempts) == expected


def test_backoff_jitter_stays_within_its_fraction():
    tasks = {
        "default": {"BACKEND": BACKEND, "OPTIONS": {"retry_backoff": 100, "retry_jitter": 0.5}}
    }
    with override_settings(TASKS=tasks):
        delays = {outcomes.backoff("default", 1) for _ in range(200)}
    assert all(50.0 <= d <= 150.0 for d in delays)
    assert len(delays) > 1  # spread, not one fixed value


def test_backoff_of_an_alias_no_longer_configured_follows_the_taskclaim_settings():
    with override_settings(
        TASKCLAIM_RETRY_BACKOFF=7, TASKCLAIM_RETRY_BACKOFF_MAX=20, TASKCLAIM_RETRY_JITTER=0
    ):
        assert outcomes.backoff("gone", 1) == 7.0
        assert outcomes.backoff("gone", 2) == 14.0
        assert outcomes.backoff("gone", 3) == 20.0


@pytest.mark.django_db(transaction=True)
def test_an_explicit_retry_delay_wins_over_the_backend_backoff():
    tasks = {"default": {"BACKEND": BACKEND, "OPTIONS": {"retry_backoff": 3000, "retry_jitter": 0}}}
    with override_settings(TASKS=tasks):
        result = ex.retry_later.enqueue(5)
        row = QueuedTask.objects.claim_next(worker="w-test")
        assert run_task(row) == "ready"
    row = QueuedTask.objects.annotate(db_now=DbNow()).get(pk=result.id)
    assert timedelta(seconds=0) < row.run_after - row.db_now <= timedelta(seconds=5)


# -- error entries: capped as last_error is ----------------------------------------------
def test_error_entries_are_capped_by_the_core_rule():
    text = "x" * (3 * MAX_ERROR_CHARS)
    entry = outcomes.error_entry(None, WorkerLost, text)
    assert entry["exception_class_path"] == "django_taskclaim.contrib.tasks.exceptions.WorkerLost"
    assert entry["traceback"] == format_error(text)
    assert len(entry["traceback"]) <= MAX_ERROR_CHARS + 3


def test_an_error_entry_holds_the_exception_class_and_its_traceback():
    with pytest.raises(ValueError) as caught:
        raise ValueError("boom " + "y" * (2 * MAX_ERROR_CHARS))
    entry = outcomes.error_entry(caught.value, Exception)
    assert entry["traceback"] == format_error(caught.value) + "\n"  # as Django stores it
    assert entry["exception_class_path"] == "builtins.ValueError"
    assert entry["traceback"].startswith("Traceback (most recent call last):")
    assert len(entry["traceback"]) <= MAX_ERROR_CHARS + 4


def test_errors_keep_only_the_most_recent():
    row = _row(errors=[{"n": i} for i in range(outcomes.MAX_ERRORS)])
    kept = outcomes.with_errors(row, {"n": "new"})
    assert len(kept) == outcomes.MAX_ERRORS
    assert kept[0] == {"n": 1}
    assert kept[-1] == {"n": "new"}


def test_lost_attempts_name_the_last_holder_and_number_each_attempt():
    row = _row(attempts=4, worker_ids=["w-a"], last_error="lease expired; held by w-z")
    lost = outcomes.lost_attempts(row)
    assert [e["worker_id"] for e in lost] == ["?", "w-z"]
    assert "attempt 2 on worker ? did not record an outcome" in lost[0]["traceback"]
    assert "attempt 3 on worker w-z did not record an outcome" in lost[1]["traceback"]
    assert outcomes.lost_attempts(_row(attempts=2, worker_ids=["w-a"])) == []


@pytest.mark.parametrize(
    ("last_error", "holder"),
    [
        ("lease expired; held by w-1", "w-1"),
        ("released from worker w-2", "w-2"),
        ("worker w-3 exited (signal SIGKILL); released by its supervisor", "w-3"),
        ("changed by hand", "?"),
    ],
)
def test_lost_attempts_find_the_holder_in_every_recovery_wording(last_error, holder):
    lost = outcomes.lost_attempts(_row(attempts=2, last_error=last_error))
    assert [e["worker_id"] for e in lost] == [holder]
    assert (
        f"attempt 1 on worker {holder} did not record an outcome: {last_error}"
        in (lost[0]["traceback"])
    )


# -- calling: decode, call, store -----------------------------------------------------------
def test_decode_names_what_is_wrong_with_the_stored_arguments():
    plan = calling.plan_for("tests.support.tasks_examples.add")
    assert calling.decode(_row(args=[1], kwargs={"b": 2}), plan) == ([1], {"b": 2})
    for fields, text in (
        ({"args": {"a": 1}}, "are not a JSON array"),
        ({"kwargs": [1]}, "are not a JSON object"),
        ({"args": [1, 2, 3]}, "do not match tests.support.tasks_examples.add(a, b=0)"),
    ):
        with pytest.raises(ArgumentsUndecodable, match=re.escape(text)):
            calling.decode(_row(**fields), plan)


def test_a_plan_is_resolved_once_per_path():
    assert calling.plan_for("tests.support.tasks_examples.add") is calling.plan_for(
        "tests.support.tasks_examples.add"
    )


def test_plan_call_runs_sync_and_async_functions():
    assert (
        calling.plan_for("tests.support.tasks_examples.add").call(_row(), [2], {"b": 3}, None) == 5
    )
    row = _row(task_path="tests.support.tasks_examples.async_add")
    value = calling.plan_for(row.task_path).call(row, [2, 3], {}, None)
    assert value == {"sum": 5, "loop": True}


def test_storable_normalises_as_django_and_refuses_what_json_cannot_hold():
    for plain in (None, 1, "s", True, 1.5):
        assert calling.storable(plain) is plain
    assert calling.storable((1, b"two", {"k": (3,)})) == [1, "two", {"k": [3]}]
    with pytest.raises(ValueError):
        calling.storable(math.nan)
    with pytest.raises(TypeError):
        calling.storable({1, 2})


# -- announce ----------------------------------------------------------------------------
def test_failed_for_good_and_unresolved_starts_send_a_full_result():
    seen = []

    def receiver(sender, task_result, **kwargs):
        seen.append((sender, task_result.status, task_result.id))

    row = _row(status="failed")
    task_started.connect(receiver)
    task_finished.connect(receiver)
    try:
        announce.started_unresolved(_row(status="processing", pk=row.pk))
        announce.failed_for_good(row)
    finally:
        task_started.disconnect(receiver)
        task_finished.disconnect(receiver)
    assert seen == [
        (TaskClaimBackend, TaskResultStatus.RUNNING, str(row.pk)),
        (TaskClaimBackend, TaskResultStatus.FAILED, str(row.pk)),
    ]


def test_the_sender_of_an_alias_no_longer_configured_is_the_backend_class():
    assert announce.sender("gone") is TaskClaimBackend
    assert announce.backend_for("gone") is None


def test_task_ids_are_version_7_uuids_in_enqueue_order():
    import time

    from django_taskclaim.contrib.tasks.models import time_ordered_uuid

    before = time.time_ns() // 1_000_000
    ids = [time_ordered_uuid() for _ in range(2000)]
    after = time.time_ns() // 1_000_000
    assert {i.version for i in ids} == {7}
    assert {i.variant for i in ids} == {"specified in RFC 4122"}
    assert len(set(ids)) == len(ids)
    stamps = [int.from_bytes(i.bytes[:6], "big") for i in ids]
    assert before <= stamps[0] <= stamps[-1] <= after
    assert stamps == sorted(stamps)  # a later millisecond sorts later
    assert QueuedTask._meta.pk.default is time_ordered_uuid
