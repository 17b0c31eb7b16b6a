"""Every write path on tables Django supports but ``Document`` does not exercise.

``UUIDTask`` (UUID primary key: ``char(32)`` on SQLite, native elsewhere), ``CharKeyTask``
(free-text primary key whose column is the reserved word ``key``; values with spaces,
quotes, ``%s``, backslashes and non-ASCII) and ``ColumnTask`` (every claim column and the
primary key renamed with ``db_column``) go through every strategy of the database and
every fenced write, and each time the database state is checked. ``NullableOrderTask``
is claimed in the order of a nullable column.
"""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.db.models import F
from django.test import override_settings
from django.utils import timezone

from django_taskclaim import ClaimLost, reap
from django_taskclaim.claim import STRATEGIES
from django_taskclaim.config.claim_meta import STRATEGY_NAMES
from django_taskclaim.db import DbNow
from django_taskclaim.settle.outcome import run_task
from tests.support.testapp.models import (
    CharKeyTask,
    ColumnTask,
    Ledger,
    NullableOrderTask,
    UUIDTask,
)

pytestmark = pytest.mark.django_db(transaction=True)

MODELS = [UUIDTask, CharKeyTask, ColumnTask]

#: Primary keys that break SQL built by string formatting, or by anything but the ORM's
#: own parameter binding. At most one character outside the BMP: MariaDB's
#: ``utf8mb4_unicode_ci`` weighs them all alike, so two would collide as duplicate keys.
CHAR_KEYS = [
    "plain",
    "with space",
    " leading space",
    "it's",
    'say "hi"',
    "ünïcødé ✓ 🙂",
    "%s %(x)s %%",
    "back\\slash",
    "semi;-- DROP",
]


def make(model, n):
    """``n`` ready rows of ``model``; returns their primary keys."""
    if model is CharKeyTask:
        assert n <= len(CHAR_KEYS)
        rows = [CharKeyTask(key=key, note=f"n{i}") for i, key in enumerate(CHAR_KEYS[:n])]
    else:
        rows = [model(note=f"n{i}") for i in range(n)]
    model.objects.bulk_create(rows)
    pks = set(model.objects.values_list("pk", flat=True))
    assert len(pks) == n
    return pks


def pk_type(model):
    return {UUIDTask: uuid.UUID, CharKeyTask: str, ColumnTask: int}[model]


def supported(strategy):
    if strategy != "auto" and not STRATEGIES[strategy].supported("default"):
        pytest.skip(f"{strategy} not supported on {connection.vendor}")


def claim(qs, n=1, strategy="auto", **kw):
    if strategy == "hold":
        with transaction.atomic():
            return qs.claim(n, strategy="hold", **kw)
    return qs.claim(n, strategy=strategy, **kw)


def state(model, pk):
    """(status, version, attempts) of one row, read from the database."""
    return model.objects.filter(pk=pk).values_list("status", "version", "attempts").get()


def fresh(row):
    return type(row).objects.annotate(now=DbNow()).get(pk=row.pk)


def expire(model, *rows):
    """Move leases into the past on the database clock (as if time had passed)."""
    model.objects.filter(pk__in=[r.pk for r in rows]).update(
        locked_until=DbNow() - timedelta(seconds=1)
    )


def steal(model, victim):
    """The lease of ``victim`` lapses, the reaper takes the row back, w2 claims it."""
    expire(model, victim)
    assert reap(model).requeued == 1
    thief = model.objects.claim_next(worker="w2", lease=60)
    assert thief is not None
    assert thief.pk == victim.pk
    return thief


def label(value):
    return getattr(value, "__name__", value)


# -- claiming ------------------------------------------------------------------------


@pytest.mark.parametrize("strategy", STRATEGY_NAMES)
@pytest.mark.parametrize("model", MODELS, ids=label)
def test_claim_on_every_strategy(model, strategy):
    supported(strategy)
    pks = make(model, len(CHAR_KEYS))
    first = claim(model.objects, 4, strategy, worker="w1", lease=120)
    rest = claim(model.objects, 100, strategy, worker="w1", lease=120)
    assert len(first) == 4
    assert len(rest) == len(pks) - 4
    assert claim(model.objects, 1, strategy) == []
    claimed = first + rest
    assert {r.pk for r in claimed} == pks
    for row in claimed:
        assert isinstance(row.pk, pk_type(model))
        assert (row.status, row.version, row.attempts, row.locked_by) == (
            "processing",
            1,
            1,
            "w1",
        )
        db = fresh(row)
        assert (db.status, db.version, db.attempts, db.locked_by) == ("processing", 1, 1, "w1")
        assert 110 < (db.locked_until - db.now).total_seconds() <= 120
        assert db.note == row.note  # every column came back into the right attribute
    assert model.objects.complete_many(claimed) == []
    assert set(model.objects.values_list("status", "version", "attempts")) == {("done", 2, 1)}


@pytest.mark.parametrize("model", MODELS, ids=label)
def test_hold_claim_and_complete_inside_the_callers_transaction(model):
    supported("hold")
    pks = make(model, 3)
    with transaction.atomic():
        rows = model.objects.claim(3, strategy="hold")
        assert {r.pk for r in rows} == pks
        rows[0].complete(note="held")
        assert model.objects.complete_many(rows[1:]) == []
    assert set(model.objects.values_list("status", "version")) == {("done", 2)}
    assert model.objects.get(pk=rows[0].pk).note == "held"


# -- the fenced lifecycle of one row --------------------------------------------------


@pytest.mark.parametrize("model", MODELS, ids=label)
def test_complete_with_and_without_result_fields(model):
    make(model, 2)
    a, b = model.objects.claim(2)
    a.complete(note="result")
    b.complete()
    for row, note in ((a, "result"), (b, b.note)):
        db = fresh(row)
        assert (db.status, db.version, db.attempts, db.locked_until) == ("done", 2, 1, None)
        assert db.finished_at is not None
        assert db.note == note
        assert (row.status, row.version) == ("done", 2)


@pytest.mark.parametrize("model", MODELS, ids=label)
def test_complete_many_reports_the_one_lost_claim(model):
    make(model, 5)
    rows = model.objects.claim(5, worker="w1")
    victim = rows[2]
    thief = steal(model, victim)
    lost = model.objects.complete_many(rows)
    assert [t.pk for t in lost] == [victim.pk]
    for row in rows:
        db = fresh(row)
        if row.pk == victim.pk:
            assert (db.status, db.version, db.attempts, db.locked_by) == (
                "processing",
                thief.version,
                2,
                "w2",
            )
            assert row.status == "processing"
        else:
            assert (db.status, db.version, db.attempts, db.locked_until) == ("done", 2, 1, None)
            assert row.version == 2
    # Every token is stale now: nothing is written a second time.
    assert [t.pk for t in model.objects.complete_many(rows)] == [r.pk for r in rows]
    thief.complete()
    assert state(model, thief.pk) == ("done", thief.version, 2)


@pytest.mark.parametrize("model", MODELS, ids=label)
def test_fail(model):
    make(model, 1)
    row = model.objects.claim_next()
    row.fail("boom", note="failed note")
    db = fresh(row)
    assert (db.status, db.version, db.attempts, db.locked_until) == ("failed", 2, 1, None)
    assert (db.last_error, db.note) == ("boom", "failed note")
    assert db.finished_at is not None


@pytest.mark.parametrize("model", MODELS, ids=label)
def test_retry_then_give_up(model):
    make(model, 1)
    with override_settings(TASKCLAIM_MAX_ATTEMPTS=2):
        row = model.objects.claim_next()
        assert row.retry(delay=60, error="flaky") == "ready"
        db = fresh(row)
        assert (db.status, db.version, db.attempts, db.locked_until) == ("ready", 2, 1, None)
        assert db.last_error == "flaky"
        assert 50 < (db.run_after - db.now).total_seconds() <= 60
        model.objects.filter(pk=row.pk).update(run_after=None)
        row = model.objects.claim_next()
        assert row.retry(error="still flaky") == "failed"
    db = fresh(row)
    assert (db.status, db.version, db.attempts) == ("failed", 4, 2)
    assert "gave up after 2 attempt(s)" in db.last_error


@pytest.mark.parametrize("model", MODELS, ids=label)
def test_release(model):
    make(model, 1)
    row = model.objects.claim_next()
    row.release()
    db = fresh(row)
    assert (db.status, db.version, db.attempts, db.locked_until) == ("ready", 2, 0, None)


@pytest.mark.parametrize("model", MODELS, ids=label)
def test_extend_lease(model):
    make(model, 1)
    row = model.objects.claim_next(lease=5)
    row.extend_lease(300)
    db = fresh(row)
    assert (db.status, db.version, db.attempts) == ("processing", 1, 1)
    assert 290 < (db.locked_until - db.now).total_seconds() <= 300


@pytest.mark.parametrize("model", MODELS, ids=label)
def test_fenced_block(model):
    make(model, 2)
    mine, other = model.objects.claim(2, worker="w1")
    with mine.fenced():
        Ledger.objects.create(task_id=0, token=mine.version, worker=str(mine.pk))
        mine.complete(note="in block")
    assert Ledger.objects.get().worker == str(mine.pk)
    assert state(model, mine.pk) == ("done", 2, 1)
    steal(model, other)
    with pytest.raises(ClaimLost), other.fenced():
        Ledger.objects.create(task_id=0, token=other.version, worker="zombie")
    assert not Ledger.objects.filter(worker="zombie").exists()
    assert state(model, other.pk) == ("processing", 3, 2)


@pytest.mark.parametrize("model", MODELS, ids=label)
def test_lost_claim_writes_nothing(model):
    make(model, 1)
    first = model.objects.claim_next(worker="w1")
    second = steal(model, first)
    for write in (
        lambda: first.complete(note="stale"),
        lambda: first.fail("stale"),
        lambda: first.retry(),
        lambda: first.release(),
        lambda: first.extend_lease(600),
    ):
        with pytest.raises(ClaimLost):
            write()
    db = fresh(second)
    assert (db.status, db.version, db.attempts, db.locked_by) == ("processing", 3, 2, "w2")
    assert db.note != "stale"


@pytest.mark.parametrize("model", MODELS, ids=label)
def test_run_task(model):
    make(model, 1)
    row = model.objects.claim_next()
    assert run_task(row) == "done"
    db = fresh(row)
    assert (db.status, db.version, db.note) == ("done", 2, "processed")


# -- the queryset operations ----------------------------------------------------------


@pytest.mark.parametrize("model", MODELS, ids=label)
def test_extend_leases_in_bulk(model):
    make(model, 3)
    rows = model.objects.claim(3, lease=5, worker="w1")
    steal(model, rows[1])
    lost = model.objects.extend_leases(rows, 300)
    assert [t.pk for t in lost] == [rows[1].pk]
    for row in (rows[0], rows[2]):
        db = fresh(row)
        assert (db.status, db.version, db.attempts) == ("processing", 1, 1)
        assert 290 < (db.locked_until - db.now).total_seconds() <= 300
    db = fresh(rows[1])
    assert (db.status, db.version, db.locked_by) == ("processing", 3, "w2")
    assert (db.locked_until - db.now).total_seconds() < 290  # the thief's lease, untouched


@pytest.mark.parametrize("model", MODELS, ids=label)
def test_reap_expired_leases(model):
    make(model, 2)
    a, b = model.objects.claim(2, worker="w1")
    expire(model, a)
    result = reap(model)
    assert (result.requeued, result.failed) == (1, 0)
    db = fresh(a)
    assert (db.status, db.version, db.attempts) == ("ready", 2, 1)
    assert db.last_error == "lease expired; held by w1"
    assert state(model, b.pk) == ("processing", 1, 1)  # its lease has not run out
    with override_settings(TASKCLAIM_MAX_ATTEMPTS=1):
        expire(model, b)
        result = model.objects.reap()
        assert (result.requeued, result.failed) == (0, 1)
    db = fresh(b)
    assert (db.status, db.version, db.attempts, db.locked_until) == ("failed", 2, 1, None)
    assert db.finished_at is not None


@pytest.mark.parametrize("batch_size", [None, 1])
@pytest.mark.parametrize("model", MODELS, ids=label)
def test_release_requeue_cancel_querysets(model, batch_size):
    pks = make(model, 4)
    held = model.objects.claim(2)
    assert model.objects.release(batch_size=batch_size) == 2
    for row in held:
        assert state(model, row.pk) == ("ready", 2, 1)
        with pytest.raises(ClaimLost):
            row.complete()
    done = model.objects.claim(1)
    assert model.objects.complete_many(done) == []
    failed = model.objects.claim_next()
    failed.fail("x")
    before = dict(model.objects.values_list("pk", "version"))
    assert model.objects.requeue(batch_size=batch_size) == 2
    for row in (*done, failed):
        db = fresh(row)
        assert (db.status, db.version, db.attempts) == ("ready", before[row.pk] + 1, 0)
        assert (db.finished_at, db.locked_until) == (None, None)
        assert db.run_after is not None  # due now: ready since the requeue
    processing = model.objects.claim_next()
    before = dict(model.objects.values_list("pk", "version"))
    assert model.objects.cancel(batch_size=batch_size) == 4
    for pk in pks:
        db = model.objects.get(pk=pk)
        assert (db.status, db.version, db.locked_until) == ("cancelled", before[pk] + 1, None)
        assert db.finished_at is not None
    with pytest.raises(ClaimLost):
        processing.complete()


# -- ordering on a nullable column ---------------------------------------------------


def make_nullable():
    now = timezone.now()
    NullableOrderTask.objects.bulk_create(
        [
            NullableOrderTask(due=None),
            NullableOrderTask(due=now - timedelta(hours=1)),
            NullableOrderTask(due=None),
            NullableOrderTask(due=now - timedelta(hours=2)),
            NullableOrderTask(due=now),
        ]
    )
    # The claim order: ``due`` with NULL last on every vendor (their defaults differ), then pk.
    order = (F("due").asc(nulls_last=True), "pk")
    return list(NullableOrderTask.objects.order_by(*order).values_list("pk", flat=True))


def claim_nullable(n, strategy):
    try:
        return claim(NullableOrderTask.objects, n, strategy)
    except Exception as exc:
        stray = list(NullableOrderTask.objects.processing().values_list("pk", flat=True))
        pytest.fail(f"claim raised {exc!r}; rows left processing without an owner: {stray}")


@pytest.mark.parametrize("strategy", STRATEGY_NAMES)
def test_nullable_ordering_claims_every_row(strategy):
    supported(strategy)
    expected = make_nullable()
    first = claim_nullable(3, strategy)
    assert len(first) == 3
    processing = set(NullableOrderTask.objects.processing().values_list("pk", flat=True))
    assert {r.pk for r in first} == processing
    rest = claim_nullable(10, strategy)
    assert sorted(r.pk for r in first + rest) == sorted(expected)
    assert NullableOrderTask.objects.processing().count() == len(expected)


@pytest.mark.parametrize("strategy", STRATEGY_NAMES)
def test_nullable_ordering_claims_in_the_databases_order(strategy):
    """The rows claimed, and the order they come back in, follow ``ordering``, with NULL
    last on every vendor."""
    supported(strategy)
    expected = make_nullable()
    first = claim_nullable(3, strategy)
    assert [r.pk for r in first] == expected[:3]
    rest = claim_nullable(10, strategy)
    assert [r.pk for r in rest] == expected[3:]


def test_uuid_rows_enqueued_together_are_claimed_in_insertion_order(vendor):
    """Rows that tie on (priority, created_at) — enqueued in one transaction — come out
    in insertion order: a UUID pk is not used as the tie-break (it would shuffle them)."""
    if vendor == "mysql":
        pytest.skip("InnoDB keeps index ties in primary-key order: a UUID pk orders them")
    with transaction.atomic():
        made = [UUIDTask.objects.create(note=str(i)) for i in range(30)]
    claimed = []
    while (row := UUIDTask.objects.claim_next(worker="w")) is not None:
        claimed.append(row.pk)
    assert claimed == [r.pk for r in made]
