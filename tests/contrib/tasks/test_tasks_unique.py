"""Unique enqueue through Django's Tasks API (``enqueue_unique(task, key, *args)``).

Needs the sub-app installed: run with ``--ds=tests.support.settings_tasks``.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import pytest
from django.apps import apps

if not apps.is_installed("django_taskclaim.contrib.tasks"):
    pytest.skip(
        "the django.tasks backend is not installed; run with --ds=tests.support.settings_tasks",
        allow_module_level=True,
    )

from asgiref.sync import async_to_sync
from django.db import IntegrityError, connection, transaction
from django.tasks import TaskResultStatus, default_task_backend
from django.tasks.exceptions import InvalidTask, InvalidTaskBackend
from django.tasks.signals import task_enqueued
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

from django_taskclaim.checks.unique import check_unique_keys
from django_taskclaim.contrib.tasks import aenqueue_unique, enqueue_unique, unique_key_for
from django_taskclaim.contrib.tasks.models import QueuedTask
from django_taskclaim.settle.outcome import run_task
from tests.support import tasks_examples as ex

pytestmark = pytest.mark.django_db(transaction=True)

THREADS = 8


def _active(key: str) -> list[str]:
    return [
        str(pk)
        for pk in QueuedTask.objects.filter(
            unique_key=key, status__in=["ready", "processing"]
        ).values_list("pk", flat=True)
    ]


def run_one() -> tuple[QueuedTask, str]:
    row = QueuedTask.objects.claim_next(worker="w-unique")
    assert row is not None, "no claimable task"
    return row, run_task(row)


def test_race_of_connections_enqueues_one_task_and_all_get_its_result() -> None:
    barrier = threading.Barrier(THREADS)
    ledger: list[Any] = [None] * THREADS
    sent: list[str] = []

    def on_enqueued(sender: Any, task_result: Any, **kwargs: Any) -> None:
        sent.append(task_result.id)

    def enqueue(i: int) -> None:
        try:
            barrier.wait(timeout=30)
            result = enqueue_unique(ex.process_data, "report:42", {"n": i})
            ledger[i] = result.id
        except BaseException as exc:  # asserted below
            ledger[i] = exc
        finally:
            connection.close()

    task_enqueued.connect(on_enqueued)
    try:
        threads = [threading.Thread(target=enqueue, args=(i,)) for i in range(THREADS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
            assert not t.is_alive()
    finally:
        task_enqueued.disconnect(on_enqueued)
    assert not [r for r in ledger if isinstance(r, BaseException)], ledger
    assert set(ledger) == set(_active("report:42"))
    assert len(set(ledger)) == 1
    assert sent == [ledger[0]]  # task_enqueued once, for the created task
    assert QueuedTask.objects.count() == 1


def test_duplicate_returns_the_existing_result() -> None:
    first = enqueue_unique(ex.process_data, "k", {"v": 1})
    again = enqueue_unique(ex.process_data, "k", {"v": 2})
    assert again.id == first.id
    assert again.status == TaskResultStatus.READY
    assert again.args == [{"v": 1}]  # the existing task's, not the refused call's
    backend = default_task_backend
    result, created = backend.enqueue_unique(ex.process_data, "k", [{"v": 3}], {})
    assert (result.id, created) == (first.id, False)
    assert QueuedTask.objects.get().unique_key == "k"


def test_after_success_or_failure_a_new_task_is_enqueued() -> None:
    done = enqueue_unique(ex.calculate_meaning_of_life, "once")
    assert run_one()[1] == "done"
    second = enqueue_unique(ex.calculate_meaning_of_life, "once")
    assert second.id != done.id
    assert second.status == TaskResultStatus.READY
    QueuedTask.objects.filter(pk=second.id).update(status="processing")
    assert enqueue_unique(ex.calculate_meaning_of_life, "once").id == second.id
    QueuedTask.objects.all().delete()

    failed = enqueue_unique(ex.fail_for_good, "bad", "no")
    assert run_one()[1] == "failed"
    assert QueuedTask.objects.get(pk=failed.id).status == "failed"
    assert enqueue_unique(ex.fail_for_good, "bad", "no").id != failed.id


def test_a_task_waiting_for_its_retry_still_blocks_duplicates() -> None:
    first = enqueue_unique(ex.raise_value_error, "retrying", "boom")
    assert run_one()[1] == "ready"
    assert QueuedTask.objects.get(pk=first.id).status == "ready"
    assert enqueue_unique(ex.raise_value_error, "retrying", "boom").id == first.id
    assert QueuedTask.objects.count() == 1


def test_key_none_is_derived_from_the_call() -> None:
    a = enqueue_unique(ex.process_data, None, {"x": 1, "y": 2})
    same = enqueue_unique(ex.process_data, None, data={"y": 2, "x": 1})
    other_args = enqueue_unique(ex.process_data, None, {"x": 2})
    other_queue = enqueue_unique(ex.process_data.using(queue_name="emails"), None, {"x": 1, "y": 2})
    assert a.id != other_args.id
    assert a.id != other_queue.id
    # Positional and keyword arguments are different calls.
    assert same.id != a.id
    assert enqueue_unique(ex.process_data, None, {"y": 2, "x": 1}).id == a.id
    key = unique_key_for(ex.process_data, [{"x": 1, "y": 2}], {})
    assert QueuedTask.objects.get(pk=a.id).unique_key == key
    assert key.startswith("tests.support.tasks_examples.process_data:")


@pytest.mark.parametrize("key", ["", "x" * 256, 7])
def test_an_invalid_key_is_refused_before_writing(key: Any) -> None:
    with pytest.raises(InvalidTask, match="unique key must be"):
        enqueue_unique(ex.process_data, key, {})
    assert not QueuedTask.objects.exists()


class Abort(Exception):
    pass


def _enqueue_then_abort(key: str) -> None:
    with transaction.atomic():
        enqueue_unique(ex.process_data, key, {})
        assert QueuedTask.objects.count() == 1
        raise Abort


def test_inside_atomic_a_rollback_leaves_nothing() -> None:
    with pytest.raises(Abort):
        _enqueue_then_abort("tx")
    assert not QueuedTask.objects.exists()
    with transaction.atomic():
        first = enqueue_unique(ex.process_data, "tx", {})
        assert enqueue_unique(ex.process_data, "tx", {}).id == first.id
        ex.process_data.enqueue({})  # the block goes on after a duplicate
    assert QueuedTask.objects.count() == 2


def test_plain_enqueue_is_one_insert_and_never_unique() -> None:
    with CaptureQueriesContext(connection) as queries:
        one = ex.process_data.enqueue({})
    table = [q["sql"] for q in queries if QueuedTask._meta.db_table in q["sql"]]
    assert len(table) == 1, table
    assert table[0].lstrip().upper().startswith("INSERT"), table
    assert len(queries) <= 2  # and PostgreSQL's wake-up NOTIFY, once it commits
    two = ex.process_data.enqueue({})
    assert one.id != two.id
    assert list(QueuedTask.objects.values_list("unique_key", "active_unique_key")) == [
        (None, None),
        (None, None),
    ]


def test_the_database_refuses_a_second_active_key_whoever_writes() -> None:
    enqueue_unique(ex.process_data, "raw", {})
    row = QueuedTask(task_path="tests.support.tasks_examples.process_data", unique_key="raw")
    with pytest.raises(IntegrityError), transaction.atomic():
        row.save(force_insert=True)


def test_a_backend_other_than_taskclaim_is_refused() -> None:
    tasks = {
        "default": {"BACKEND": "django_taskclaim.contrib.tasks.backend.TaskClaimBackend"},
        "dummy": {"BACKEND": "django.tasks.backends.dummy.DummyBackend"},
    }
    with override_settings(TASKS=tasks), pytest.raises(InvalidTaskBackend, match="DummyBackend"):
        enqueue_unique(ex.process_data.using(backend="dummy"), "k", {})


def test_async_twin() -> None:
    async def both() -> tuple[Any, Any]:
        return (
            await aenqueue_unique(ex.process_data, "async", {}),
            await aenqueue_unique(ex.process_data, "async", {}),
        )

    first, second = async_to_sync(both)()
    assert first.id == second.id
    assert _active("async") == [first.id]


def test_check_passes_with_the_tasks_app() -> None:
    assert check_unique_keys() == []


def test_counts_by_state_ignore_the_new_columns() -> None:
    enqueue_unique(ex.process_data, "a", {})
    enqueue_unique(ex.process_data, "b", {})
    enqueue_unique(ex.process_data, "a", {})
    assert Counter(QueuedTask.objects.values_list("status", flat=True)) == {"ready": 2}


def _index_sql(name: str) -> str:
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT indexdef FROM pg_indexes WHERE indexname = %s", [name])
        elif connection.vendor == "sqlite":
            cursor.execute("SELECT sql FROM sqlite_master WHERE name = %s", [name])
        else:
            cursor.execute(
                "SELECT GROUP_CONCAT(non_unique, ':', column_name) FROM information_schema"
                ".statistics WHERE table_schema = DATABASE() AND index_name = %s",
                [name],
            )
        return str(cursor.fetchone()[0])


def test_the_active_key_index_holds_only_rows_with_a_key():
    """Partial where the database has partial indexes (rows without a key, and finished
    rows, add no entry on every write); a plain unique index on MariaDB / MySQL."""
    sql = _index_sql("tctask_active_unique_key")
    if connection.features.supports_partial_indexes:
        assert "UNIQUE" in sql.upper()
        assert "active_unique_key IS NOT NULL" in sql.replace('"', "")
    else:
        assert sql == "0:active_unique_key"
    # Still the arbiter: a second active row with the key is refused by the database.
    _row, created = QueuedTask.objects.enqueue_unique(unique_key="k", task_path="x.y")
    assert created
    with pytest.raises(IntegrityError), transaction.atomic():
        QueuedTask.objects.create(unique_key="k", task_path="x.y")
    assert check_unique_keys() == []
