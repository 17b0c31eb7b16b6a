"""The pieces every claim strategy shares, ``django_taskclaim/claim/base.py``, at the points the
claim tests do not look (docs/testing.md, "Mutation testing"): which strategies each
database supports, the order claimed rows come back in (descending fields, ``NULL`` last
either way, ties in pk order), the pk tie-break of the claim order and where it is left
out, the candidates a claim reads, what a claim sets on an instance in memory, which
rows are marked recovered, and the quoted claim columns the vendor statements get
(``db_column`` honoured, kept per model, database and options object).
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.db.models import F

from django_taskclaim import ConfigurationError
from django_taskclaim.backends import for_connection
from django_taskclaim.claim import STRATEGIES, base
from django_taskclaim.claim.base import (
    RECOVERED_ATTR,
    _mark_recovered,
    _order_by,
    _sort,
    apply_claim,
    candidates,
    claim_columns,
    claim_order,
    claim_updates,
    column,
    read_claimed,
    was_recovered,
)
from django_taskclaim.config.options import ClaimOptions, get_options
from django_taskclaim.db import DbNow
from tests.support.testapp.models import ColumnTask, Document, Job, NullableOrderTask, UUIDTask

pytestmark = pytest.mark.django_db(transaction=True)

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def ordered(opts: ClaimOptions, *ordering: str) -> ClaimOptions:
    """Another options object for the same model, with ``ordering``."""
    return ClaimOptions(dataclasses.replace(opts._s, ordering=ordering))


def at(minutes: int | None) -> datetime | None:
    return None if minutes is None else T0 + timedelta(minutes=minutes)


# -- Strategy.supported ---------------------------------------------------------------------


def test_each_database_supports_its_strategies():
    vendor = connection.vendor
    got = {name for name, s in STRATEGIES.items() if s.supported("default")}
    if vendor == "sqlite":
        assert got == {"cas"}
    elif vendor == "postgresql":
        assert got == {"cas", "skip_locked", "advisory", "serializable", "hold"}
    else:
        assert {"cas", "skip_locked"} <= got


def test_a_strategy_the_driver_cannot_serve_is_unsupported(monkeypatch):
    backend = type(for_connection(connection))
    monkeypatch.setattr(backend, "claim_strategies", backend.claim_strategies | {"skip_locked"})
    monkeypatch.setattr(connection.features, "has_select_for_update_skip_locked", False)
    assert STRATEGIES["skip_locked"].supported("default") is False
    assert STRATEGIES["cas"].supported("default") is True
    monkeypatch.setattr(connection.features, "has_select_for_update_skip_locked", True)
    assert STRATEGIES["skip_locked"].supported("default") is True


# -- _sort: the order claimed rows come back in ---------------------------------------------


def nullable(pk: int, due: int | None) -> NullableOrderTask:
    return NullableOrderTask(pk=pk, due=at(due))


def test_sort_of_nothing_is_nothing():
    assert _sort([], ("due",)) == []


def test_sort_ascending_puts_null_last_and_ties_in_pk_order():
    rows = [nullable(5, None), nullable(4, 2), nullable(3, 1), nullable(2, None), nullable(1, 2)]
    out = _sort(rows, ("due",))
    assert out is rows  # sorted in place, and returned
    assert [r.pk for r in out] == [3, 1, 4, 2, 5]


def test_sort_descending_still_puts_null_last():
    rows = [nullable(1, None), nullable(2, 1), nullable(3, 3), nullable(4, 2)]
    assert [r.pk for r in _sort(rows, ("-due",))] == [3, 4, 2, 1]


def test_sort_by_several_fields_the_first_one_decides():
    rows = [
        Document(pk=1, priority=0, created_at=at(1)),
        Document(pk=2, priority=5, created_at=at(3)),
        Document(pk=3, priority=0, created_at=at(0)),
        Document(pk=4, priority=5, created_at=at(2)),
    ]
    assert [r.pk for r in _sort(rows, ("-priority", "created_at"))] == [4, 2, 3, 1]


def test_sort_by_pk_either_way():
    rows = [Document(pk=2), Document(pk=3), Document(pk=1)]
    assert [r.pk for r in _sort(rows, ("pk",))] == [1, 2, 3]
    assert [r.pk for r in _sort(rows, ("-pk",))] == [3, 2, 1]


def test_sort_ties_follow_the_pk_attribute_of_a_renamed_key():
    rows = [ColumnTask(id=3, priority=1), ColumnTask(id=1, priority=1), ColumnTask(id=2)]
    assert [r.id for r in _sort(rows, ("-priority",))] == [1, 3, 2]


# -- claim_order / _order_by / candidates ---------------------------------------------------


def test_claim_order_adds_pk_where_it_is_free():
    opts = get_options(Document)
    free = connection.vendor != "postgresql"
    assert claim_order(opts, "default") == (
        ("-priority", "created_at", "pk") if free else ("-priority", "created_at")
    )


def test_claim_order_never_adds_pk_twice_nor_to_a_uuid_key():
    assert claim_order(get_options(NullableOrderTask), "default") == ("due", "pk")
    opts = ordered(get_options(Document), "-pk")
    assert claim_order(opts, "default") == ("-pk",)
    assert claim_order(get_options(UUIDTask), "default") == get_options(UUIDTask).ordering
    assert "pk" not in claim_order(get_options(UUIDTask), "default")


def make_due(*dues: int | None) -> list[int]:
    made = [NullableOrderTask.objects.create(due=at(d)) for d in dues]
    return [m.pk for m in made]


def test_candidates_come_in_claim_order_with_null_last():
    a, b, c, d = make_due(None, 5, 1, None)
    opts = get_options(NullableOrderTask)
    qs = NullableOrderTask.objects.all().claimable()
    got = list(candidates(qs, opts, 10))
    assert [g["pk"] for g in got] == [c, b, a, d]
    assert set(got[0]) == {"pk", "locked_until"}
    assert [g["pk"] for g in candidates(qs, opts, 2)] == [c, b]


def test_a_descending_nullable_field_still_orders_null_last():
    a, b, c = make_due(None, 1, 5)
    opts = ordered(get_options(NullableOrderTask), "-due", "pk")
    qs = NullableOrderTask.objects.all()
    assert list(qs.order_by(*_order_by(opts, "default")).values_list("pk", flat=True)) == [c, b, a]


def test_order_by_leaves_fields_that_cannot_be_null_plain():
    opts = get_options(Document)
    plain = [o for o in _order_by(opts, "default") if isinstance(o, str)]
    assert plain == list(claim_order(opts, "default"))


def test_candidates_carry_the_lost_lease_of_a_recovered_row():
    docs = [Document.objects.create(title=f"d{i}") for i in range(2)]
    Document.objects.filter(pk=docs[1].pk).update(locked_until=DbNow() - timedelta(seconds=5))
    got = list(candidates(Document.objects.all().claimable(), get_options(Document), 5))
    assert [g["pk"] for g in got] == [docs[0].pk, docs[1].pk]
    assert got[0]["locked_until"] is None
    assert got[1]["locked_until"] is not None


# -- what a claim writes, in the database and in memory -------------------------------------


def test_claim_updates_write_the_claim():
    doc = Document.objects.create()
    opts = get_options(Document)
    Document.objects.filter(pk=doc.pk).update(**claim_updates(opts, 90, "w7"))
    row = Document.objects.annotate(now=DbNow()).get(pk=doc.pk)
    assert (row.status, row.version, row.attempts, row.locked_by) == ("processing", 1, 1, "w7")
    assert timedelta(seconds=80) < row.locked_until - row.now <= timedelta(seconds=90)
    assert row.claimed_at is not None
    job = Job.objects.create(name="j")
    Job.objects.filter(pk=job.pk).update(**claim_updates(get_options(Job), 30, "w"))
    assert Job.objects.get(pk=job.pk).status == Job.PENDING


def test_apply_claim_sets_in_memory_what_the_claim_wrote():
    doc = Document(pk=1, version=4, attempts=2, status="ready")
    doc.__dict__["claimed_at"] = at(0)  # a stale value: the claim wrote the database's clock
    until = at(30)
    apply_claim(doc, get_options(Document), until, "w3")
    assert (doc.status, doc.version, doc.attempts, doc.locked_until, doc.locked_by) == (
        "processing",
        5,
        3,
        until,
        "w3",
    )
    assert "claimed_at" not in doc.__dict__
    job = Job(pk=1, version=0, attempts=0, status=Job.NEW)
    apply_claim(job, get_options(Job), until, "w")
    assert job.status == Job.PENDING


def test_only_the_rows_named_are_marked_recovered():
    rows = [Document(pk=1), Document(pk=2), Document(pk=3)]
    assert _mark_recovered(rows, {2, 9}) is rows
    assert [was_recovered(r) for r in rows] == [False, True, False]
    assert getattr(rows[1], RECOVERED_ATTR) is True
    assert not hasattr(rows[0], RECOVERED_ATTR)


def test_a_claim_marks_only_rows_back_from_a_lost_holder():
    docs = [Document.objects.create(title=f"d{i}") for i in range(3)]
    Document.objects.filter(pk=docs[0].pk).update(locked_until=DbNow() - timedelta(seconds=5))
    rows = Document.objects.claim(3)
    assert [(r.title, was_recovered(r)) for r in rows] == [
        ("d0", True),
        ("d1", False),
        ("d2", False),
    ]


def test_read_claimed_returns_only_rows_still_carrying_the_token_won():
    docs = [Document.objects.create(title=f"d{i}") for i in range(3)]
    Document.objects.update(status="processing", version=1)
    Document.objects.filter(pk=docs[1].pk).update(version=2)  # re-claimed by another
    Document.objects.filter(pk=docs[2].pk).update(status="ready")  # released
    base = Document._base_manager.all()
    won = {d.pk: 1 for d in docs}
    assert [r.pk for r in read_claimed(base, get_options(Document), won)] == [docs[0].pk]
    assert read_claimed(base, get_options(Document), {docs[0].pk: 2}) == []


# -- the quoted claim columns ---------------------------------------------------------------


@pytest.fixture
def no_kept_columns(monkeypatch):
    """The claim columns computed afresh: none kept from earlier claims."""
    monkeypatch.setattr(base, "_COLUMNS", {})


def test_claim_columns_name_the_columns_not_the_fields(no_kept_columns):
    qn = connection.ops.quote_name
    opts = get_options(ColumnTask)
    columns = claim_columns(ColumnTask, opts, connection)
    table = qn(ColumnTask._meta.db_table)
    assert (columns.table, columns.pk, columns.status) == (table, qn("row_id"), qn("st"))
    assert (columns.version, columns.attempts, columns.locked_until) == (
        qn("tok"),
        qn("tries"),
        qn("lease_end"),
    )
    assert columns.returning == ", ".join(
        f"{table}.{qn(f.column)}" for f in ColumnTask._meta.concrete_fields
    )
    assert columns.returning.startswith(f"{table}.{qn('row_id')}, {table}.{qn('st')}")
    assert columns.claim_writes == ((qn("holder"), "holder"), (qn("claimed"), "clock"))
    assert columns.complete_writes == ((qn("ended"), "clock"),)
    status = ColumnTask._meta.get_field("status")
    assert columns.status_type == str(status.cast_db_type(connection))
    assert columns.status_type != "text" or connection.vendor == "sqlite"


def test_claim_columns_are_kept_while_the_options_are_the_same_object(no_kept_columns):
    opts = get_options(Document)
    first = claim_columns(Document, opts, connection)
    assert claim_columns(Document, opts, connection) is first
    other = ClaimOptions(opts._s)
    again = claim_columns(Document, other, connection)
    assert again is not first
    assert again == first
    assert claim_columns(Document, other, connection) is again
    job = claim_columns(Job, get_options(Job), connection)
    assert job.table == connection.ops.quote_name("job")
    assert claim_columns(Document, other, connection) is again  # kept per model


def test_column_names_the_pk_and_db_columns_and_refuses_the_rest():
    qn = connection.ops.quote_name
    assert column(ColumnTask, "pk", qn) == qn("row_id")
    assert column(ColumnTask, "note", qn) == qn("remark")
    assert column(Document, "title", qn) == qn("title")
    from tests.support.archiveapp.models import Shelf

    with pytest.raises(ConfigurationError) as info:
        column(Shelf, "report", qn)  # the reverse side of a ForeignKey: no column
    assert str(info.value) == "archiveapp.Shelf.report is not a concrete column"


def test_a_claim_of_renamed_columns_writes_them():
    ColumnTask.objects.create(note="a")
    (task,) = ColumnTask.objects.claim(1, worker="w5")
    row = ColumnTask.objects.get(pk=task.pk)
    assert (row.status, row.version, row.locked_by, row.attempts) == ("processing", 1, "w5", 1)
    assert (task.version, task.locked_by) == (1, "w5")
    assert ColumnTask.objects.filter(pk=task.pk, version=F("version")).exists()
