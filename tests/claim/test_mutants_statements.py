"""The one-statement claim of ``django_taskclaim/claim/statements.py`` on PostgreSQL, at the
points the claim tests do not look (docs/testing.md, "Mutation testing"): the candidates
SELECT kept per batch size (a claim of 2 after one of 5 takes 2; compiled once per size,
a filtered claim's each time and limited to ``n`` rows; the ``advisory`` strategy's wider
read past rows another session holds), the instances built from the returned rows (every
field type read back as the ORM reads it, a field's converter given the table's column and
the claim's connection, the converters asked once per model; a plain model filled in
without ``Model.from_db()``, on every claim; a model that overrides ``__init__`` or
``from_db`` — a classmethod given the database and every attname, or a staticmethod —,
has fields behind descriptors of its own, or a ``post_init`` receiver is built the ORM's
way), the lease and holder written, the rows marked recovered, and the table's claim gate:
a claim of at least ``claim_gate`` rows waits for it, a smaller one and one inside the
caller's transaction do not (both ways of running gate and claim: one round trip, or two
statements in a transaction).

The one-statement claim runs only where the database returns the rows it writes
(PostgreSQL): skipped elsewhere.
"""

from __future__ import annotations

import threading
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from uuid import UUID

import pytest
from django.db import connection, connections, models, transaction
from django.db.models.query_utils import DeferredAttribute
from django.db.models.signals import post_init
from django.test.utils import override_settings

from django_taskclaim.backends import for_connection
from django_taskclaim.capped import CappedCache
from django_taskclaim.claim import statements
from django_taskclaim.claim.base import was_recovered
from django_taskclaim.claim.pg_strategies import advisory_table_key
from django_taskclaim.db import DbNow
from tests.support.helpers import wait_for
from tests.support.testapp.models import Document, ResultTypes

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        connection.vendor != "postgresql", reason="one-statement claims: PostgreSQL"
    ),
]


@pytest.fixture(autouse=True)
def nothing_kept(monkeypatch):
    """The SQL, converters and ways of building instances computed afresh in each test:
    none kept from earlier claims of the process (mutmut forks each mutant's run from one
    that ran every test once)."""
    monkeypatch.setattr(statements, "_COMPILED", CappedCache())
    monkeypatch.setattr(statements, "_CLAIMS", CappedCache())
    monkeypatch.setattr(statements, "_CONVERTERS", {})
    monkeypatch.setattr(statements, "_DIRECT", {})


def make(n: int) -> list[Document]:
    return [Document.objects.create(title=f"d{i}") for i in range(n)]


def titles(rows) -> list[str]:
    return [r.title for r in rows]


@pytest.mark.parametrize("strategy", ["skip_locked", "advisory"])
def test_each_batch_size_claims_its_own_count(strategy):
    make(12)
    assert titles(Document.objects.claim(5, strategy=strategy)) == [f"d{i}" for i in range(5)]
    assert titles(Document.objects.claim(2, strategy=strategy)) == ["d5", "d6"]
    assert titles(Document.objects.claim(3, strategy=strategy)) == ["d7", "d8", "d9"]
    assert titles(Document.objects.filter(title="d11").claim(4, strategy=strategy)) == ["d11"]
    assert titles(Document.objects.claim(4, strategy=strategy)) == ["d10"]


def test_a_filtered_claim_takes_at_most_n_of_its_rows():
    """A queryset with a filter of the caller's (its SQL compiled afresh each time): at
    most ``n`` of the matching rows, the others left ready."""
    for i in range(5):
        Document.objects.create(title=f"a{i}", kind="a")
    Document.objects.create(title="b0", kind="b")
    assert titles(Document.objects.filter(kind="a").claim(2, strategy="skip_locked")) == [
        "a0",
        "a1",
    ]
    assert sorted(Document.objects.filter(status="ready").values_list("title", flat=True)) == [
        "a2",
        "a3",
        "a4",
        "b0",
    ]


def test_the_candidates_sql_is_compiled_once_per_batch_size(monkeypatch):
    """An unfiltered claim compiles its candidates SELECT once per batch size; a filtered
    one each time."""
    compiled: list[int | None] = []
    original = statements.compile_queryset

    def compile_queryset(qs):
        compiled.append(qs.query.high_mark)
        return original(qs)

    monkeypatch.setattr(statements, "compile_queryset", compile_queryset)
    make(9)
    # Each claim its own holder: no claim statement is kept for the next one
    # (kept_claim), so each asks compiled_candidates() for its candidates.
    taken = [
        titles(Document.objects.claim(n, strategy="skip_locked", worker=f"w{i}"))
        for i, n in enumerate((2, 2, 3, 2))
    ]
    assert taken == [["d0", "d1"], ["d2", "d3"], ["d4", "d5", "d6"], ["d7", "d8"]]
    assert compiled == [2, 3]
    Document.objects.update(status="ready")
    Document.objects.filter(title__in=["d0", "d1"]).claim(1, strategy="skip_locked")
    Document.objects.filter(title__in=["d0", "d1"]).claim(1, strategy="skip_locked")
    assert compiled == [2, 3, 1, 1]


@pytest.mark.parametrize("strategy", ["skip_locked", "advisory"])
def test_a_claim_statement_is_built_once_per_size_lease_and_holder(monkeypatch, strategy):
    """The vendor's claim statement is built once for claims alike in batch size, lease
    and holder (``kept_claim``), again for each that differs, and on every claim of a
    queryset filtered by the caller (nothing kept: its key is ``None``)."""
    built: list[int] = []
    backend = type(for_connection(connection))
    original = backend.claim

    def claim(self, *args, **kwargs):
        built.append(1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(backend, "claim", claim)
    make(12)
    asks = [(2, "a"), (2, "a"), (3, "a"), (2, "a"), (2, "b")]
    taken = [titles(Document.objects.claim(n, strategy=strategy, worker=w)) for n, w in asks]
    assert taken == [["d0", "d1"], ["d2", "d3"], ["d4", "d5", "d6"], ["d7", "d8"], ["d9", "d10"]]
    assert len(built) == 3  # (2, a), (3, a), (2, b)
    filtered = Document.objects.filter(title__in=["d11"])
    assert titles(filtered.claim(1, strategy=strategy, worker="a")) == ["d11"]
    assert filtered.claim(1, strategy=strategy, worker="a") == []
    assert len(built) == 5
    assert statements._CLAIMS.get(None) is None  # nothing kept under no key


class AdvisoryLocksHeld:
    """Another session holds the ``advisory`` strategy's lock of each of ``rows``."""

    def __init__(self, rows) -> None:
        self.keys = [(advisory_table_key(Document), str(r.pk)) for r in rows]
        self.taken, self.released = threading.Event(), threading.Event()
        self.thread = threading.Thread(target=self._hold)

    def _hold(self) -> None:
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                for key in self.keys:
                    cursor.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", key)
                self.taken.set()
                self.released.wait(30)
        finally:
            connections.close_all()

    def __enter__(self) -> AdvisoryLocksHeld:
        self.thread.start()
        assert self.taken.wait(30)
        return self

    def __exit__(self, *exc) -> None:
        self.released.set()
        self.thread.join(30)


def test_advisory_candidates_reach_past_rows_other_claims_hold():
    """The ``advisory`` strategy reads more candidates than it claims: with the first
    rows' locks held by another session it takes the next ones, not fewer rows."""
    docs = make(6)
    with AdvisoryLocksHeld(docs[:3]):
        assert titles(Document.objects.claim(2, strategy="advisory")) == ["d3", "d4"]
    assert titles(Document.objects.claim(3, strategy="advisory")) == ["d0", "d1", "d2"]


def test_claimed_values_are_the_values_the_orm_reads():
    ResultTypes.objects.create(
        data={"a": [1, 2]},
        encoded={"when": "x"},
        text="t",
        number=2**40,
        ratio=0.5,
        flag=True,
        at=datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),
        day=date(2026, 1, 2),
        ref=UUID(int=7),
        amount=Decimal("12.3400"),
        took=timedelta(seconds=90),
        blob=b"\x00\x01",
    )
    (task,) = ResultTypes.objects.claim(1, strategy="skip_locked")
    orm = ResultTypes.objects.get(pk=task.pk)
    for field in ResultTypes._meta.concrete_fields:
        got, want = getattr(task, field.attname), getattr(orm, field.attname)
        if isinstance(want, memoryview):
            got, want = bytes(got), bytes(want)
        assert (field.name, got) == (field.name, want)
        assert type(got) is type(want), field.name
    assert task._state.adding is False
    assert task._state.db == "default"


@pytest.mark.parametrize("kind", ["classmethod", "staticmethod"])
def test_a_model_with_its_own_from_db_is_built_by_it(monkeypatch, kind):
    """Its ``from_db`` gets the database and every field's attname, in field order (as
    Django's documented override that keeps the loaded values reads them); one declared
    as a ``staticmethod`` (no ``__func__``) is honoured the same."""
    made = []
    original = Document.from_db.__func__

    if kind == "classmethod":

        def from_db(cls, db, field_names, values, **kwargs):
            obj = original(cls, db, field_names, values, **kwargs)
            made.append((obj.pk, db, tuple(field_names)))
            return obj

        monkeypatch.setattr(Document, "from_db", classmethod(from_db))
    else:

        def from_db_static(db, field_names, values, **kwargs):
            obj = original(Document, db, field_names, values, **kwargs)
            made.append((obj.pk, db, tuple(field_names)))
            return obj

        monkeypatch.setattr(Document, "from_db", staticmethod(from_db_static))
    docs = make(2)
    rows = Document.objects.claim(2, strategy="skip_locked")
    attnames = tuple(f.attname for f in Document._meta.concrete_fields)
    assert sorted(made) == sorted((d.pk, "default", attnames) for d in docs)
    assert [(r.status, r.version) for r in rows] == [("processing", 1)] * 2
    assert [r._state.db for r in rows] == ["default"] * 2
    assert [r._state.adding for r in rows] == [False] * 2


def test_a_model_with_its_own_init_is_built_by_it(monkeypatch):
    original = Document.__init__

    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        self.built_by_init = True

    docs = make(2)
    monkeypatch.setattr(Document, "__init__", __init__)
    rows = Document.objects.claim(2, strategy="skip_locked")
    assert [(r.pk, getattr(r, "built_by_init", False)) for r in rows] == [
        (d.pk, True) for d in docs
    ]
    assert [(r.title, r.status, r._state.db) for r in rows] == [
        ("d0", "processing", "default"),
        ("d1", "processing", "default"),
    ]


def test_fields_behind_descriptors_that_do_more_are_set_through_them(monkeypatch):
    """Every field of the model behind a descriptor of its own (a subclass of Django's
    that records each value set): each claimed instance is built through them."""
    seen: list[tuple[str, object]] = []

    class Recorded(DeferredAttribute):
        def __set__(self, instance, value):
            seen.append((self.field.attname, value))
            instance.__dict__[self.field.attname] = value

    (doc,) = make(1)
    fields = Document._meta.concrete_fields
    for field in fields:
        monkeypatch.setattr(Document, field.attname, Recorded(field))
    (task,) = Document.objects.claim(1, strategy="skip_locked")
    assert [name for name, _ in seen] == [f.attname for f in fields]
    assert dict(seen)["id"] == doc.pk
    assert dict(seen)["version"] == 1
    assert (task.title, task.status, task._state.db) == ("d0", "processing", "default")


def test_a_plain_model_is_built_without_from_db(monkeypatch):
    """A model that overrides neither ``__init__`` nor ``from_db`` and has no
    ``pre_init``/``post_init`` receiver: its instances are filled in directly, on every
    claim (``Model.from_db`` is never called), and are the instances it would build."""
    calls = []
    original = models.Model.from_db.__func__

    def from_db(cls, db, field_names, values, **kwargs):
        calls.append(cls)
        return original(cls, db, field_names, values, **kwargs)

    make(4)
    monkeypatch.setattr(models.Model, "from_db", classmethod(from_db))
    first = Document.objects.claim(2, strategy="skip_locked")
    second = Document.objects.claim(2, strategy="skip_locked")
    assert calls == []
    assert titles(first) + titles(second) == ["d0", "d1", "d2", "d3"]
    for task in first + second:
        orm = Document.objects.get(pk=task.pk)
        assert {f.attname: getattr(task, f.attname) for f in Document._meta.concrete_fields} == {
            f.attname: getattr(orm, f.attname) for f in Document._meta.concrete_fields
        }
        assert (task._state.adding, task._state.db) == (False, "default")


def test_converters_are_asked_once_per_model_for_each_column(monkeypatch):
    """The backend's converters are asked for each field's column of the model's table
    once, on its first claim, and kept per model: a claim of another model gets its own
    (JSON decoded in the right places), a second claim asks nothing."""
    asked: list[tuple[str, str]] = []
    ops = connection.ops
    original = ops.get_db_converters

    def get_db_converters(expression):
        asked.append((expression.alias, expression.target.attname))
        return original(expression)

    ResultTypes.objects.create(data={"a": 1}, encoded=[1, "x"], text="t", number=5)
    Document.objects.create(title="d0", payload={"b": [2]})
    monkeypatch.setattr(ops, "get_db_converters", get_db_converters)
    (result,) = ResultTypes.objects.claim(1, strategy="skip_locked")
    table = ResultTypes._meta.db_table
    assert asked == [(table, f.attname) for f in ResultTypes._meta.concrete_fields]
    asked.clear()
    (doc,) = Document.objects.claim(1, strategy="skip_locked")
    table = Document._meta.db_table
    assert asked == [(table, f.attname) for f in Document._meta.concrete_fields]
    assert (result.data, result.encoded, result.text, result.number) == ({"a": 1}, [1, "x"], "t", 5)
    assert (doc.title, doc.payload) == ("d0", {"b": [2]})
    ResultTypes.objects.create(data={"c": 3})
    asked.clear()
    (again,) = ResultTypes.objects.claim(1, strategy="skip_locked")
    assert asked == []
    assert again.data == {"c": 3}


def test_a_field_converter_gets_the_column_and_connection_the_orm_gives(monkeypatch):
    """A field's ``from_db_value`` is called with the column of the model's table and the
    connection of the claim, as when the ORM reads the row."""
    field = Document._meta.get_field("title")

    def from_db_value(value, expression, conn):
        return f"{value}|{expression.alias}|{expression.target.name}|{conn.alias}"

    make(1)
    monkeypatch.setattr(field, "from_db_value", from_db_value, raising=False)
    (task,) = Document.objects.claim(1, strategy="skip_locked")
    assert task.title == "d0|testapp_document|title|default"
    assert Document.objects.get(pk=task.pk).title == task.title


def test_a_post_init_receiver_hears_every_claimed_instance():
    heard = []

    def receiver(sender, instance, **kwargs):
        heard.append(instance)

    make(2)
    post_init.connect(receiver, sender=Document)
    try:
        rows = Document.objects.claim(2, strategy="skip_locked")
    finally:
        post_init.disconnect(receiver, sender=Document)
    assert [r.pk for r in rows] == [h.pk for h in heard]
    assert all(h.status == "processing" for h in heard)


@pytest.mark.parametrize("strategy", ["skip_locked", "advisory"])
def test_the_claim_writes_the_lease_and_holder_asked_for(strategy):
    """The row and the instance carry the lease asked for (from the database's clock),
    the worker, the first token and attempt."""
    make(2)
    rows = Document.objects.claim(1, strategy=strategy, worker="me", lease=120)
    now = Document.objects.annotate(now=DbNow()).values_list("now", flat=True)[:1].get()
    (task,) = rows
    row = Document.objects.get(pk=task.pk)
    assert (row.status, row.version, row.attempts, row.locked_by) == ("processing", 1, 1, "me")
    assert (task.status, task.version, task.attempts, task.locked_by) == row_claim(row)
    assert task.locked_until == row.locked_until
    assert timedelta(seconds=110) < row.locked_until - now <= timedelta(seconds=120)
    assert Document.objects.filter(status="ready").count() == 1


def row_claim(row) -> tuple:
    return (row.status, row.version, row.attempts, row.locked_by)


def test_claimed_rows_are_marked_recovered_from_the_statement():
    docs = make(3)
    Document.objects.filter(pk=docs[1].pk).update(locked_until=DbNow() - timedelta(seconds=5))
    rows = Document.objects.claim(3, strategy="skip_locked")
    assert [(r.title, was_recovered(r)) for r in rows] == [
        ("d0", False),
        ("d1", True),
        ("d2", False),
    ]


# -- the claim gate -------------------------------------------------------------------------


@pytest.fixture(params=["one_round_trip", "two_statements"])
def gate_way(request, monkeypatch):
    if request.param == "two_statements":
        backend = type(for_connection(connection))
        monkeypatch.setattr(backend, "several_statements", lambda self, settings_dict: False)
    return request.param


class GateHeld:
    """Another session holds the claim gate of ``Document``'s table until :meth:`open`."""

    def __init__(self) -> None:
        self.taken, self.opened = threading.Event(), threading.Event()
        self.thread = threading.Thread(target=self._hold)

    def _hold(self) -> None:
        try:
            gate = for_connection(connection).claim_gate(Document._meta.db_table)
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute(gate.sql, gate.params)
                self.taken.set()
                self.opened.wait(30)
        finally:
            connections.close_all()

    def __enter__(self) -> GateHeld:
        self.thread.start()
        assert self.taken.wait(30)
        return self

    def open(self) -> None:
        self.opened.set()
        self.thread.join(30)

    def __exit__(self, *exc) -> None:
        self.open()


def claim_in_thread(n: int, **kw) -> tuple[threading.Thread, list]:
    out: list = []

    def run():
        try:
            out.append(Document.objects.claim(n, **kw))
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, out


def waiting_for_the_gate() -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted")
        return cursor.fetchone()[0] > 0


@override_settings(TASKCLAIM_CLAIM_GATE=3)
def test_a_claim_of_claim_gate_rows_waits_for_the_gate(gate_way):
    make(4)
    with GateHeld() as gate:
        thread, out = claim_in_thread(3, strategy="skip_locked")
        wait_for(waiting_for_the_gate, timeout=10, what="the claim to wait for the gate")
        assert out == []
        gate.open()
        thread.join(30)
    assert titles(out[0]) == ["d0", "d1", "d2"]


@override_settings(TASKCLAIM_CLAIM_GATE=3)
def test_a_smaller_claim_passes_a_held_gate(gate_way):
    make(4)
    with GateHeld():
        thread, out = claim_in_thread(2, strategy="skip_locked")
        thread.join(30)
        assert not thread.is_alive()
        assert titles(out[0]) == ["d0", "d1"]


@override_settings(TASKCLAIM_CLAIM_GATE=None)
def test_no_gate_when_the_model_has_none():
    make(4)
    with GateHeld():
        thread, out = claim_in_thread(4, strategy="skip_locked")
        thread.join(30)
        assert not thread.is_alive()
        assert len(out[0]) == 4


@override_settings(TASKCLAIM_CLAIM_GATE=2)
def test_a_claim_inside_the_callers_transaction_takes_no_gate():
    make(3)
    with GateHeld():
        out = []

        def run():
            try:
                with transaction.atomic():
                    out.append(Document.objects.claim(3, strategy="hold"))
            finally:
                connections.close_all()

        thread = threading.Thread(target=run)
        thread.start()
        thread.join(30)
        assert not thread.is_alive()
        assert len(out[0]) == 3
