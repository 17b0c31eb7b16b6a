"""Unique enqueue on users' models: the database's unique constraint is the arbiter.

Races use real connections (one per thread, released together by a barrier); every
other test reads the outcome back from the database.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.core import checks
from django.db import IntegrityError, connection, models, transaction
from django.test.utils import isolate_apps

from django_taskclaim.checks.unique import check_model, check_unique_keys
from django_taskclaim.exceptions import ConfigurationError
from django_taskclaim.model import unique_insert
from django_taskclaim.model.unique import ActiveKeyField
from django_taskclaim.models import ClaimableModel
from tests.support.testapp.models import Document
from tests.support.uniqueapp.models import Export, LegacySync

pytestmark = pytest.mark.django_db(transaction=True)

THREADS = 8
ROUNDS = 4


def _active(key: str) -> list[int]:
    return list(
        Export.objects.filter(dedupe_key=key, status__in=["ready", "processing"]).values_list(
            "pk", flat=True
        )
    )


def _race(n: int, call: Any) -> list[Any]:
    """Run ``call(i)`` in ``n`` threads, each on its own connection, released at once."""
    barrier = threading.Barrier(n)
    results: list[Any] = [None] * n

    def run(i: int) -> None:
        try:
            barrier.wait(timeout=30)
            results[i] = call(i)
        except BaseException as exc:  # recorded, asserted below
            results[i] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
        assert not t.is_alive(), "an enqueuer hung"
    return results


def test_race_leaves_one_active_row_and_every_caller_gets_it() -> None:
    for rnd in range(ROUNDS):
        key = f"race-{rnd}"

        def enqueue(i: int, key: str = key) -> tuple[int, bool]:
            row, created = Export.objects.enqueue_unique(dedupe_key=key, payload=f"t{i}")
            return row.pk, created

        ledger = _race(THREADS, enqueue)
        errors = [r for r in ledger if isinstance(r, BaseException)]
        assert not errors, errors
        created = Counter(c for _, c in ledger)
        assert created[True] == 1, ledger
        assert created[False] == THREADS - 1, ledger
        pks = {pk for pk, _ in ledger}
        assert pks == set(_active(key)), (ledger, _active(key))
        assert len(pks) == 1
        assert Export.objects.filter(dedupe_key=key).count() == 1


def test_race_on_a_key_whose_row_finishes_meanwhile_still_one_active_row() -> None:
    first, _ = Export.objects.enqueue_unique(dedupe_key="churn", payload="first")

    def act(i: int) -> Any:
        if i == 0:  # finishes the holder while the others enqueue
            task = Export.objects.claim_next()
            assert task is not None
            assert task.pk == first.pk
            task.complete()
            return ("completed", task.pk)
        row, created = Export.objects.enqueue_unique(dedupe_key="churn", payload=f"t{i}")
        return (row.pk, created)

    ledger = _race(THREADS, act)
    assert not [r for r in ledger if isinstance(r, BaseException)], ledger
    active = _active("churn")
    callers = [r for r in ledger if r[0] != "completed"]
    created = [pk for pk, c in callers if c]
    # At most one caller created a row, and that row is the only active one: none when
    # every caller came before the completion, one when some came after it.
    assert created == active, (ledger, active)
    # Whoever was refused got the row that held the key at that moment: the first row
    # (still active when they read it) or the one row created after it finished.
    assert {pk for pk, _ in callers} <= {first.pk, *active}
    Export.objects.get(pk=first.pk, status="done")


def test_plain_create_of_a_second_active_row_is_refused_by_the_database() -> None:
    Export.objects.create(dedupe_key="db", payload="a")
    with pytest.raises(IntegrityError), transaction.atomic():
        Export.objects.create(dedupe_key="db", payload="b")
    assert Export.objects.filter(dedupe_key="db").count() == 1


@pytest.mark.parametrize("finish", ["complete", "fail", "cancel"])
def test_after_the_row_finishes_a_new_enqueue_creates_a_row(finish: str) -> None:
    row, created = Export.objects.enqueue_unique(dedupe_key="k", payload="a")
    assert created
    assert row.active_dedupe_key == "k"
    if finish == "cancel":
        assert Export.objects.filter(pk=row.pk).cancel() == 1
    else:
        task = Export.objects.claim_next()
        assert task is not None
        assert task.pk == row.pk
        task.complete() if finish == "complete" else task.fail("boom")
    old = Export.objects.get(pk=row.pk)
    assert old.active_dedupe_key is None
    again, created = Export.objects.enqueue_unique(dedupe_key="k", payload="b")
    assert created
    assert again.pk != row.pk
    assert _active("k") == [again.pk]


def test_processing_and_retried_rows_still_hold_the_key() -> None:
    row, _ = Export.objects.enqueue_unique(dedupe_key="r", payload="a")
    task = Export.objects.claim_next()
    assert task is not None
    assert task.pk == row.pk
    held, created = Export.objects.enqueue_unique(dedupe_key="r", payload="b")
    assert (held.pk, created, held.status) == (row.pk, False, "processing")
    assert task.retry(delay=3600) == "ready"
    held, created = Export.objects.enqueue_unique(dedupe_key="r", payload="c")
    assert (held.pk, created, held.status) == (row.pk, False, "ready")
    assert Export.objects.filter(dedupe_key="r").count() == 1
    assert Export.objects.get(pk=row.pk).payload == "a"


def test_other_integrity_errors_are_raised() -> None:
    with pytest.raises(IntegrityError):  # NOT NULL payload
        Export.objects.enqueue_unique(dedupe_key="n", payload=None)
    Export.objects.create(dedupe_key="other", payload="a", ref="R1")
    with pytest.raises(IntegrityError):  # another unique constraint (ref)
        Export.objects.enqueue_unique(dedupe_key="fresh", payload="b", ref="R1")
    assert not Export.objects.filter(dedupe_key__in=["n", "fresh"]).exists()


def test_a_duplicate_primary_key_is_not_taken_for_a_duplicate_key() -> None:
    row, _ = Export.objects.enqueue_unique(dedupe_key="pk1", payload="a")
    with pytest.raises(IntegrityError):
        Export.objects.enqueue_unique(id=row.pk, dedupe_key="pk2", payload="b")


class Abort(Exception):
    pass


def _enqueue_then_abort(**fields: Any) -> None:
    with transaction.atomic():
        row, created = Export.objects.enqueue_unique(**fields)
        assert created
        assert Export.objects.filter(pk=row.pk).exists()
        raise Abort


def test_inside_atomic_a_rollback_leaves_nothing() -> None:
    with pytest.raises(Abort):
        _enqueue_then_abort(dedupe_key="tx", payload="a")
    assert not Export.objects.filter(dedupe_key="tx").exists()
    _row, created = Export.objects.enqueue_unique(dedupe_key="tx", payload="b")
    assert created


def test_a_duplicate_inside_atomic_leaves_the_transaction_usable() -> None:
    first, _ = Export.objects.enqueue_unique(dedupe_key="dup", payload="a")
    with transaction.atomic():
        held, created = Export.objects.enqueue_unique(dedupe_key="dup", payload="b")
        assert (held.pk, created) == (first.pk, False)
        Export.objects.create(dedupe_key="after", payload="c")  # the block goes on
    assert Export.objects.filter(dedupe_key="after").count() == 1
    assert Export.objects.filter(dedupe_key="dup").count() == 1


@pytest.mark.parametrize("outcome", ["commit", "rollback"])
def test_an_uncommitted_enqueue_decides_once_it_commits_or_rolls_back(outcome: str) -> None:
    """A second enqueuer started while the first one's insert is uncommitted gets the
    committed row, or creates its own when the first rolls back (on PostgreSQL and
    MariaDB its INSERT waits on the first one's index entry; on SQLite on the write
    lock)."""
    key = f"wait-{outcome}"
    inserted, finish = threading.Event(), threading.Event()
    seen: dict[str, Any] = {}

    def first() -> None:
        try:
            with transaction.atomic():
                seen["first"] = Export.objects.enqueue_unique(dedupe_key=key, payload="1")
                inserted.set()
                assert finish.wait(30)
                if outcome == "rollback":
                    transaction.set_rollback(True)
        finally:
            connection.close()

    def second() -> None:
        try:
            seen["second"] = Export.objects.enqueue_unique(dedupe_key=key, payload="2")
        finally:
            connection.close()

    t1 = threading.Thread(target=first)
    t1.start()
    assert inserted.wait(30)
    t2 = threading.Thread(target=second)
    t2.start()
    finish.set()
    t1.join(60)
    t2.join(60)
    (row1, created1), (row2, created2) = seen["first"], seen["second"]
    assert created1
    if outcome == "commit":
        assert (row2.pk, created2) == (row1.pk, False)
    else:
        assert created2
        assert Export.objects.get(pk=row2.pk).payload == "2"
        assert not Export.objects.filter(dedupe_key=key, payload="1").exists()
    assert _active(key) == [row2.pk]


def test_holder_finishing_between_refused_insert_and_read_retries_the_insert(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    holder, _ = Export.objects.enqueue_unique(dedupe_key="gone", payload="a")
    real = unique_insert.is_unique_violation
    finished: list[int] = []

    def finish_holder_then_classify(exc: BaseException, key: Any, using: str) -> bool:
        verdict = real(exc, key, using)
        if verdict and not finished:  # the holder completes right after the refusal
            finished.append(Export.objects.filter(pk=holder.pk).cancel())
        return verdict

    monkeypatch.setattr(unique_insert, "is_unique_violation", finish_holder_then_classify)
    row, created = Export.objects.enqueue_unique(dedupe_key="gone", payload="b")
    assert finished == [1]
    assert created
    assert row.pk != holder.pk
    assert _active("gone") == [row.pk]


def test_custom_status_field_column_and_values() -> None:
    row, created = LegacySync.objects.enqueue_unique(account_id=7)
    assert created
    assert row.active_account_id == 7
    same, created = LegacySync.objects.enqueue_unique(account_id=7)
    assert (same.pk, created) == (row.pk, False)
    other, created = LegacySync.objects.enqueue_unique(account_id=8)
    assert created
    task = LegacySync.objects.filter(pk=row.pk).claim_next()
    assert task is not None
    held, created = LegacySync.objects.enqueue_unique(account_id=7)
    assert (held.pk, created) == (row.pk, False)
    task.complete()
    assert LegacySync.objects.get(pk=row.pk).state == LegacySync.OK
    new, created = LegacySync.objects.enqueue_unique(account_id=7)
    assert created
    assert new.pk not in (row.pk, other.pk)


def test_requeue_of_a_failed_row_whose_key_is_held_again_is_refused() -> None:
    old, _ = Export.objects.enqueue_unique(dedupe_key="rq", payload="a")
    task = Export.objects.claim_next()
    assert task is not None
    task.fail("boom")
    new, created = Export.objects.enqueue_unique(dedupe_key="rq", payload="b")
    assert created
    with pytest.raises(IntegrityError), transaction.atomic():
        Export.objects.filter(pk=old.pk).requeue()
    assert Export.objects.get(pk=old.pk).status == "failed"
    Export.objects.filter(pk=new.pk).cancel()
    assert Export.objects.filter(pk=old.pk).requeue() == 1
    assert _active("rq") == [old.pk]


def test_a_row_without_a_key_is_refused() -> None:
    with pytest.raises(ValueError, match="needs a value for 'dedupe_key'"):
        Export.objects.enqueue_unique(payload="a")
    assert not Export.objects.exists()


def test_a_model_without_an_active_key_gets_a_clear_error() -> None:
    with pytest.raises(ConfigurationError, match="no ActiveKeyField"):
        Document.objects.enqueue_unique(title="x")
    with pytest.raises(ConfigurationError, match="no ActiveKeyField for 'nope'"):
        Export.objects.enqueue_unique(key_field="nope", dedupe_key="x", payload="a")


def test_editing_a_row_keeps_its_key_active() -> None:
    row, _ = Export.objects.enqueue_unique(dedupe_key="edit", payload="a")
    row.payload = "b"
    row.save()
    row.refresh_from_db()
    assert (row.payload, row.active_dedupe_key) == ("b", "edit")


def test_async_twin() -> None:
    async def both() -> tuple[Any, Any]:
        first = await Export.objects.aenqueue_unique(dedupe_key="async", payload="a")
        second = await Export.objects.aenqueue_unique(dedupe_key="async", payload="b")
        return first, second

    # async_to_sync runs the thread-sensitive calls in this thread, on its connection.
    (row, created), (again, created2) = async_to_sync(both)()
    assert created
    assert not created2
    assert again.pk == row.pk
    assert _active("async") == [row.pk]


# -- system check -------------------------------------------------------------------------


@pytest.mark.django_db(transaction=False)
def test_check_is_registered_and_passes_for_the_installed_models() -> None:
    assert check_unique_keys in checks.registry.registry.get_checks()
    assert "taskclaim" in check_unique_keys.tags  # type: ignore[attr-defined]
    assert check_unique_keys() == []
    assert not [
        m for m in checks.run_checks(tags=["taskclaim"]) if m.id.startswith("taskclaim.E03")
    ]


@pytest.mark.django_db(transaction=False)
@isolate_apps("tests.support.uniqueapp")
def test_check_refuses_an_active_key_without_its_constraint() -> None:
    class NoConstraint(ClaimableModel):
        k = models.CharField(max_length=10, null=True)
        active_k = ActiveKeyField("k")

        class Meta(ClaimableModel.Meta):
            app_label = "uniqueapp"

    class Conditional(ClaimableModel):
        k = models.CharField(max_length=10, null=True)
        active_k = ActiveKeyField("k")

        class Meta(ClaimableModel.Meta):
            app_label = "uniqueapp"
            constraints = [
                models.UniqueConstraint(
                    fields=["active_k"], condition=models.Q(k__gt=""), name="cond_k"
                )
            ]

    for model in (NoConstraint, Conditional):
        assert [e.id for e in check_model(model)] == ["taskclaim.E030"], model
        with pytest.raises(ConfigurationError, match=r"taskclaim\.E030"):
            model.objects.enqueue_unique(k="x")


@pytest.mark.django_db(transaction=False)
@isolate_apps("tests.support.uniqueapp")
def test_check_refuses_an_active_key_that_disagrees_with_claim_meta() -> None:
    class Stale(ClaimableModel):
        k = models.CharField(max_length=10, null=True)
        active_k = ActiveKeyField("k", active_values=["ready"])

        class Meta(ClaimableModel.Meta):
            app_label = "uniqueapp"
            constraints = [models.UniqueConstraint(fields=["active_k"], name="stale_k")]

    errors = check_model(Stale)
    assert [e.id for e in errors] == ["taskclaim.E031"]
    assert "['ready']" in errors[0].msg


@pytest.mark.django_db(transaction=False)
def test_active_key_field_needs_its_key_field_declared_first() -> None:
    with isolate_apps("tests.support.uniqueapp"), pytest.raises(TypeError, match="declare the key"):

        class Backwards(ClaimableModel):
            active_k = ActiveKeyField("k")
            k = models.CharField(max_length=10, null=True)

            class Meta(ClaimableModel.Meta):
                app_label = "uniqueapp"
