"""The fenced lifecycle: every write after a claim is conditioned on the claim token."""

from __future__ import annotations

import uuid
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import pytest
from django.db import connection
from django.test import override_settings

from django_taskclaim import ClaimLost, Fail, Retry, reap
from django_taskclaim.db import DbNow
from django_taskclaim.settle.outcome import run_task
from tests.support.testapp.models import Document, Job, Ledger

pytestmark = pytest.mark.django_db(transaction=True)


def expire(*rows):
    """Move leases into the past on the database clock (as if time had passed)."""
    Document.objects.filter(pk__in=[r.pk for r in rows]).update(
        locked_until=DbNow() - timedelta(seconds=1)
    )


def fresh(row):
    return Document.objects.get(pk=row.pk)


def test_complete_saves_result_fields_in_the_same_fenced_update():
    Document.objects.create(title="a")
    row = Document.objects.claim_next()
    counter = _Counter()
    with connection.execute_wrapper(counter):
        row.complete(result="42")
    assert counter.statements == 1
    db = fresh(row)
    assert (db.status, db.result, db.version, db.locked_until) == ("done", "42", 2, None)
    assert db.finished_at is not None
    assert row.version == 2
    assert row.status == "done"


def test_complete_refuses_bookkeeping_and_unknown_fields():
    Document.objects.create()
    row = Document.objects.claim_next()
    with pytest.raises(ValueError, match="claim bookkeeping"):
        row.complete(version=99)
    with pytest.raises(ValueError, match="has no field 'nope'"):
        row.complete(nope=1)
    assert fresh(row).status == "processing"


def test_lost_claim_is_fenced_everywhere():
    """FENCED: claim → lease expires → reap → another worker claims → every write of the
    first worker affects nothing and raises ClaimLost; the new holder is untouched."""
    Document.objects.create(title="t")
    first = Document.objects.claim_next(worker="w1")
    expire(first)
    assert reap(Document).requeued == 1
    second = Document.objects.claim_next(worker="w2")
    assert second.pk == first.pk
    assert second.version == first.version + 2  # reap bumped it, the new claim too
    before = fresh(second)

    for write in (
        lambda: first.complete(result="stale"),
        lambda: first.fail("stale"),
        lambda: first.retry(),
        lambda: first.release(),
        lambda: first.extend_lease(600),
    ):
        with pytest.raises(ClaimLost):
            write()
    with pytest.raises(ClaimLost), first.fenced():
        Ledger.objects.create(task_id=first.pk, token=first.version, worker="w1")
    assert Ledger.objects.count() == 0

    after = fresh(second)
    for field in ("status", "version", "locked_until", "locked_by", "attempts", "result"):
        assert getattr(after, field) == getattr(before, field), field
    second.complete(result="fresh")
    assert fresh(second).result == "fresh"


def test_fenced_block_commits_only_while_the_claim_holds():
    Document.objects.create()
    row = Document.objects.claim_next()
    with row.fenced():
        Ledger.objects.create(task_id=row.pk, token=row.version)
        row.complete(result="in block")
    assert Ledger.objects.count() == 1
    assert fresh(row).status == "done"
    # A failing block rolls back the user's writes and keeps the claim.
    Document.objects.create()
    row2 = Document.objects.claim_next()

    def write_then_fail():
        with row2.fenced():
            Ledger.objects.create(task_id=row2.pk, token=row2.version)
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        write_then_fail()
    assert Ledger.objects.filter(task_id=row2.pk).count() == 0
    assert fresh(row2).status == "processing"


def test_admin_edit_of_row_data_does_not_unclaim():
    doc = Document.objects.create(title="v1")
    stale = Document.objects.get(pk=doc.pk)  # loaded while ready
    held = Document.objects.claim_next()
    stale.title = "v2"
    stale.save()  # writes data fields only
    db = fresh(doc)
    assert (db.title, db.status, db.version) == ("v2", "processing", held.version)
    held.complete()
    # Naming a claim field writes it and bumps the token (fencing any holder).
    db.status = "ready"
    db.save(update_fields=["status"])
    assert fresh(doc).version == held.version + 1
    assert db.version == held.version + 1


def test_retry_backoff_and_attempts_until_failed():
    Document.objects.create()
    with override_settings(TASKCLAIM_MAX_ATTEMPTS=3, TASKCLAIM_RETRY_JITTER=0):
        for attempt in (1, 2):
            row = Document.objects.claim_next()
            assert row.attempts == attempt
            assert row.retry(error=RuntimeError("flaky")) == "ready"
            db = fresh(row)
            assert "flaky" in db.last_error
            assert db.run_after is not None  # backoff: 2s, then 4s
            assert Document.objects.claimable().count() == 0
            Document.objects.filter(pk=row.pk).update(run_after=None)
        row = Document.objects.claim_next()
        assert row.attempts == 3
        assert row.retry(error="still flaky") == "failed"
    db = fresh(row)
    assert db.status == "failed"
    assert "gave up after 3 attempt(s)" in db.last_error
    assert db.finished_at is not None


def test_backoff_grows_exponentially_with_cap():
    from django_taskclaim import get_options

    with override_settings(
        TASKCLAIM_RETRY_JITTER=0, TASKCLAIM_RETRY_BACKOFF=2, TASKCLAIM_RETRY_BACKOFF_MAX=10
    ):
        opts = get_options(Document)
        assert [opts.backoff(a) for a in (1, 2, 3, 4, 5)] == [2, 4, 8, 10, 10]
    with override_settings(TASKCLAIM_RETRY_JITTER=0.5, TASKCLAIM_RETRY_BACKOFF=4):
        values = {get_options(Document).backoff(1) for _ in range(50)}
        assert all(2 <= v <= 6 for v in values)
        assert len(values) > 1


def test_retry_with_explicit_delay_on_database_clock():
    Document.objects.create()
    row = Document.objects.claim_next()
    row.retry(delay=timedelta(minutes=10))
    db = Document.objects.annotate(now=DbNow()).get(pk=row.pk)
    assert 590 < (db.run_after - db.now).total_seconds() <= 600


def test_release_does_not_count_the_attempt():
    Document.objects.create()
    row = Document.objects.claim_next()
    row.release()
    db = fresh(row)
    assert (db.status, db.attempts, db.locked_until) == ("ready", 0, None)
    assert Document.objects.claim_next().attempts == 1


def test_extend_lease_keeps_the_token():
    Document.objects.create()
    row = Document.objects.claim_next(lease=5)
    row.extend_lease(300)
    db = Document.objects.annotate(now=DbNow()).get(pk=row.pk)
    assert db.version == row.version
    assert 290 < (db.locked_until - db.now).total_seconds() <= 300
    row.complete()


def test_extend_leases_in_bulk_reports_lost():
    Document.objects.bulk_create([Document() for _ in range(3)])
    rows = Document.objects.claim(3, lease=5)
    expire(rows[0])
    reap(Document)
    lost = Document.objects.extend_leases(rows, 300)
    assert [t.pk for t in lost] == [rows[0].pk]
    assert Document.objects.get(pk=rows[0].pk).status == "ready"


def test_attempts_counted_at_claim_so_poison_ends_failed():
    """ATTEMPTS: a task that dies every time ends failed after max_attempts (via the reaper)."""
    Document.objects.create()
    with override_settings(TASKCLAIM_MAX_ATTEMPTS=2):
        for _ in range(2):
            row = Document.objects.claim_next()
            assert row is not None
            expire(row)  # the worker was SIGKILLed; the lease ran out
            reap(Document)
        assert Document.objects.claim_next() is None
    db = Document.objects.get()
    assert db.status == "failed"
    assert "lease expired" in db.last_error


@pytest.mark.parametrize(
    ("payload", "outcome", "status"),
    [
        ({}, "done", "done"),
        ({"raise": "oops"}, "ready", "ready"),
        ({"fail": "bad input"}, "failed", "failed"),
        ({"retry": 0}, "ready", "ready"),
    ],
)
def test_run_task_outcomes(payload, outcome, status):
    Document.objects.create(payload=payload)
    row = Document.objects.claim_next()
    assert run_task(row) == outcome
    db = fresh(row)
    assert db.status == status
    if outcome == "done":
        assert db.result == f"processed {row.pk}"
    if "raise" in payload:
        assert "RuntimeError: oops" in db.last_error
    if "fail" in payload:
        assert db.last_error == "bad input"


def test_run_task_after_lost_claim_reports_lost():
    Document.objects.create()
    row = Document.objects.claim_next()
    expire(row)
    reap(Document)
    assert run_task(row, handler=lambda t: None) == "lost"
    assert fresh(row).status == "ready"


def test_run_task_with_handler_that_raises_control_flow():
    Document.objects.create()
    row = Document.objects.claim_next()

    def handler(task):
        raise Retry(delay=0, reason="not yet")

    assert run_task(row, handler) == "ready"
    row = Document.objects.claim_next()

    def handler2(task):
        raise Fail("never")

    assert run_task(row, handler2) == "failed"


class _Counter:
    def __init__(self):
        self.statements = 0

    def __call__(self, execute, sql, params, many, context):
        self.statements += 1
        return execute(sql, params, many, context)


def test_complete_many_is_one_fenced_update_and_reports_lost_claims():
    """Batched acknowledgement: one statement; a row whose claim was lost (reaped and
    re-claimed by another worker) is reported and left to its new holder."""
    Document.objects.bulk_create([Document(title=str(i)) for i in range(5)])
    rows = Document.objects.claim(5, worker="w1")
    victim = rows[2]
    expire(victim)
    assert reap(Document).requeued == 1
    thief = Document.objects.claim_next(worker="w2")
    assert thief.pk == victim.pk
    counter = _Counter()
    with connection.execute_wrapper(counter):
        lost = Document.objects.complete_many(rows)
    assert counter.statements == 2  # the UPDATE, then one read to tell who was lost
    assert [t.pk for t in lost] == [victim.pk]
    for row in rows:
        db = fresh(row)
        if row.pk == victim.pk:
            assert (db.status, db.locked_by, db.version) == ("processing", "w2", thief.version)
            assert row.status == "processing"  # the instance is untouched too
        else:
            assert (db.status, db.version, db.locked_until) == ("done", row.version, None)
            assert db.finished_at is not None
            assert row.status == "done"
    thief.complete()  # the new holder is unaffected
    assert fresh(thief).status == "done"


def test_complete_many_all_held_is_a_single_statement():
    Document.objects.bulk_create([Document() for _ in range(3)])
    rows = Document.objects.claim(3)
    counter = _Counter()
    with connection.execute_wrapper(counter):
        assert Document.objects.complete_many(rows) == []
    assert counter.statements == 1
    assert Document.objects.done().count() == 3
    assert Document.objects.complete_many(rows) == rows  # second time: every token is stale


def test_complete_many_refuses_other_models_and_duplicates():
    Document.objects.create()
    row = Document.objects.claim_next()
    with pytest.raises(TypeError, match=r"not a testapp\.Job"):
        Job.objects.complete_many([row])
    with pytest.raises(ValueError, match="same row twice"):
        Document.objects.complete_many([row, row])
    assert fresh(row).status == "processing"


def test_run_task_defers_completion_when_asked():
    Document.objects.create()
    row = Document.objects.claim_next()
    deferred = []
    assert run_task(row, lambda t: None, defer=deferred.append) == "deferred"
    assert deferred == [row]
    assert fresh(row).status == "processing"
    # a handler returning result fields is completed at once, with them
    Document.objects.create()
    other = Document.objects.claim_next()
    assert run_task(other, lambda t: {"result": "r"}, defer=deferred.append) == "done"
    assert fresh(other).result == "r"
    assert deferred == [row]


def test_handler_returning_unknown_fields_is_retried_with_a_clear_error():
    Document.objects.create()
    row = Document.objects.claim_next()
    assert run_task(row, lambda t: {"nope": 1}) == "ready"
    assert "has no field 'nope'" in fresh(row).last_error


def test_complete_many_on_a_mapped_integer_status_table():
    """A legacy table: integer statuses, its own timestamps, no finished_at."""
    Job.objects.bulk_create([Job(name=f"j{i}") for i in range(3)])
    rows = Job.objects.claim(3)
    assert Job.objects.complete_many(rows[:2]) == []
    assert sorted(Job.objects.values_list("status", flat=True)) == [Job.SUCCESS] * 2 + [Job.PENDING]
    assert all(r.status == Job.SUCCESS for r in rows[:2])


def test_fenced_complete_commits_the_writes_and_done_together():
    Document.objects.create(title="a")
    (task,) = Document.objects.claim(1)
    with task.fenced(complete=True):
        Ledger.objects.create(task_id=task.pk, token=task.version, worker="w")
    row = Document.objects.get(pk=task.pk)
    assert (row.status, row.version) == ("done", task.version)
    assert task.status == "done"
    assert Ledger.objects.filter(task_id=task.pk).count() == 1


def test_fenced_complete_that_raises_commits_nothing_and_restores_the_task():
    Document.objects.create(title="a")
    (task,) = Document.objects.claim(1)
    token = task.version

    def body():
        with task.fenced(complete=True):
            Ledger.objects.create(task_id=task.pk, token=task.version, worker="w")
            task.complete(result="premature")  # rolled back with the rest
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        body()
    assert not Ledger.objects.exists()
    assert (task.status, task.version) == ("processing", token)  # as on entry
    row = Document.objects.get(pk=task.pk)
    assert (row.status, row.version, row.result) == ("processing", token, "")
    assert task.retry(delay=0) == "ready"  # the token still matches the row


def test_fenced_complete_keeps_a_completion_made_in_the_block():
    Document.objects.create(title="a")
    (task,) = Document.objects.claim(1)
    with task.fenced(complete=True):
        task.complete(result="from the block")
    assert Document.objects.get(pk=task.pk).result == "from the block"


def test_atomic_meta_rolls_back_a_body_whose_result_cannot_be_stored(monkeypatch):
    Document.objects.create(title="a")
    (task,) = Document.objects.claim(1)
    monkeypatch.setattr(Document.ClaimMeta, "atomic", True, raising=False)
    from django_taskclaim.config import options

    options._cache.pop(Document, None)
    try:

        def body(row):
            Ledger.objects.create(task_id=row.pk, token=row.version, worker="w")
            return {"no_such_field": 1}

        assert run_task(task, body) == "ready"
    finally:
        monkeypatch.undo()
        options._cache.pop(Document, None)
    assert not Ledger.objects.exists()
    assert "no_such_field" in Document.objects.get(pk=task.pk).last_error


def test_atomic_meta_must_be_a_bool(monkeypatch):
    from django_taskclaim import ConfigurationError, get_options
    from django_taskclaim.config import options

    monkeypatch.setattr(Document.ClaimMeta, "atomic", "yes", raising=False)
    options._cache.pop(Document, None)
    try:
        with pytest.raises(ConfigurationError, match="atomic must be True or False"):
            get_options(Document).atomic  # noqa: B018
    finally:
        monkeypatch.undo()
        options._cache.pop(Document, None)


@pytest.mark.parametrize("shape", ["same fields", "mixed fields"])
def test_deferred_result_fields_are_written_per_row_in_one_update(shape):
    """run_task(defer=...) with a BatchableResult keeps each row's fields; complete_many
    writes them all in one fenced UPDATE, each row its own values, and calls on_written."""
    from django.test.utils import CaptureQueriesContext

    from django_taskclaim.settle.batch import BatchableResult, complete_many

    Document.objects.bulk_create([Document(title=f"b{i}") for i in range(4)])
    rows = Document.objects.claim(4)
    written: list[int] = []
    buffered: list = []
    for i, row in enumerate(rows):
        fields = {"result": f"r{row.pk}"}
        if shape == "mixed fields" and i % 2:
            fields["kind"] = "odd"
        result = BatchableResult(fields, on_written=lambda pk=row.pk: written.append(pk))
        assert run_task(row, lambda _row, r=result: r, defer=buffered.append) == "deferred"
    rows[1].release()  # one claim is lost before the batch is written
    with CaptureQueriesContext(connection) as ctx:
        lost = complete_many(buffered)
    assert [t.pk for t in lost] == [rows[1].pk]
    updates = [q for q in ctx.captured_queries if q["sql"].startswith("UPDATE")]
    assert len(updates) == 1
    assert sorted(written) == sorted(r.pk for r in rows if r.pk != rows[1].pk)
    for i, row in enumerate(rows):
        got = Document.objects.get(pk=row.pk)
        if row.pk == rows[1].pk:
            assert (got.status, got.result) == ("ready", "")
            continue
        assert (got.status, got.result) == ("done", f"r{row.pk}")
        expected_kind = "odd" if shape == "mixed fields" and i % 2 else Document().kind
        assert got.kind == expected_kind


TRICKY = "quote ' double \" back\\slash {brace,comma} new\nline tab\t ünïcødé ✓ NULL"


@pytest.mark.parametrize(
    ("case", "fields"),
    [
        (
            "json-ready values",
            {
                "data": {"nested": [1, 2.5, None, True, TRICKY], "empty": {}},
                "text": TRICKY,
                "number": -(2**62),
                "ratio": 0.1,
                "flag": False,
                "at": datetime(2031, 2, 3, 4, 5, 6, 789012, tzinfo=UTC),
                "day": date(1999, 12, 31),
                "ref": uuid.UUID("12345678-1234-5678-1234-567812345678"),
                "amount": Decimal("-12345678.9012"),
            },
        ),
        ("a JSON string and nulls", {"data": TRICKY, "number": None, "at": None, "ref": None}),
        ("a field with its own JSON encoder", {"encoded": {"when": date(2020, 1, 2)}}),
        ("a duration", {"took": timedelta(days=2, microseconds=3), "text": TRICKY}),
        ("bytes", {"blob": b"\x00\xff'\\", "text": TRICKY}),
    ],
)
def test_batched_completions_store_each_result_value_as_the_orm_would(case, fields):
    """complete_many writes every row's result fields in one UPDATE (on PostgreSQL from
    one JSON document when every value has a faithful JSON form, else from one array per
    column): what is read back equals what a plain save would store."""
    from django.test.utils import CaptureQueriesContext

    from django_taskclaim.settle.batch import BatchableResult, complete_many
    from tests.support.testapp.models import ResultTypes

    ResultTypes.objects.bulk_create([ResultTypes() for _ in range(3)])
    rows = ResultTypes.objects.claim(3)
    buffered: list = []
    for i, row in enumerate(rows):
        mine = {**fields, "text": f"{fields.get('text', '')}#{i}"}
        result = BatchableResult(mine)
        assert run_task(row, lambda _row, r=result: r, defer=buffered.append) == "deferred"
    with CaptureQueriesContext(connection) as ctx:
        assert complete_many(buffered) == []
    updates = [q["sql"] for q in ctx.captured_queries if q["sql"].startswith("UPDATE")]
    assert len(updates) == 1
    if connection.vendor == "postgresql":
        as_json = case in ("json-ready values", "a JSON string and nulls")
        assert ("jsonb_to_recordset" in updates[0]) is as_json, updates[0][:300]
    for i, row in enumerate(rows):
        values = {**fields, "text": f"{fields.get('text', '')}#{i}"}
        want = ResultTypes.objects.get(pk=ResultTypes.objects.create(**values).pk)
        got = ResultTypes.objects.get(pk=row.pk)
        assert got.status == "done"
        for name in values:
            assert getattr(got, name) == getattr(want, name), name
