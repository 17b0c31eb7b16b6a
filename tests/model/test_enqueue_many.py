"""``enqueue_many()``: producers' bulk enqueue, one INSERT per batch, one wake-up after commit.

Rows are read back from the database and compared, field by field, with a row made by
``create()``; statements are counted with Django's query capture; the wake-up is heard
on a real LISTENing connection (PostgreSQL).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta

import psycopg
import pytest
from asgiref.sync import async_to_sync
from django.db import IntegrityError, connection, transaction
from django.db.models.signals import post_save, pre_save
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_taskclaim import enqueue_many
from django_taskclaim.exceptions import NotClaimableError
from tests.support.testapp.models import Document, Job, Ledger
from tests.support.uniqueapp.models import Export

pytestmark = pytest.mark.django_db(transaction=True)

#: Fields a producer sets, or that differ between two rows by nature.
OWN = {"id", "title", "created_at"}


def _inserts(captured: CaptureQueriesContext) -> list[str]:
    return [
        q["sql"]
        for q in captured.captured_queries
        if q["sql"].lstrip().upper().startswith("INSERT")
    ]


def _returns_pks() -> bool:
    return bool(connection.features.can_return_rows_from_bulk_insert)


def _row(pk: int) -> dict:
    return Document.objects.filter(pk=pk).values().get()


def test_rows_are_left_as_create_leaves_them():
    made = Document.objects.create(title="create", priority=3)
    from_dict, from_obj = Document.objects.enqueue_many(
        [{"title": "dict", "priority": 3}, Document(title="obj", priority=3)]
    )
    by_create = _row(made.pk)
    rows = list(Document.objects.exclude(pk=made.pk).order_by("pk").values())
    assert [r["title"] for r in rows] == ["dict", "obj"]
    for row in rows:
        for name, value in by_create.items():
            if name not in OWN:
                assert row[name] == value, name
        assert isinstance(row["created_at"], datetime)  # the database clock's, as create()
        assert row["created_at"] >= by_create["created_at"]
    claim_state = ("status", "version", "attempts", "locked_until", "locked_by", "last_error")
    assert [by_create[k] for k in claim_state] == ["ready", 0, 0, None, "", ""]
    if _returns_pks():
        assert [from_dict.pk, from_obj.pk] == [r["id"] for r in rows]
        assert from_dict.created_at == rows[0]["created_at"]
    claimed = Document.objects.claim(5)
    assert sorted(t.title for t in claimed) == ["create", "dict", "obj"]


def test_legacy_status_values_and_run_after():
    later = timezone.now() + timedelta(hours=1)
    enqueue_many(Job, [{"name": "j"}])
    stored = Job.objects.values("status", "version", "attempts", "locked_until").get()
    assert stored == {"status": Job.NEW, "version": 0, "attempts": 0, "locked_until": None}
    Document.objects.enqueue_many([{"title": "later", "run_after": later}])
    assert Document.objects.get(title="later").run_after == later
    assert not Document.objects.claimable().filter(title="later").exists()
    assert Document.objects.enqueue_many([]) == []


def test_one_insert_per_batch_and_all_or_nothing():
    with CaptureQueriesContext(connection) as captured:
        made = Document.objects.enqueue_many([{"title": f"t{i}"} for i in range(25)], batch_size=10)
    assert len(_inserts(captured)) == 3
    assert len(made) == Document.objects.count() == 25
    with CaptureQueriesContext(connection) as captured:
        Document.objects.enqueue_many([Document(title=f"u{i}") for i in range(40)])
    assert len(_inserts(captured)) == 1
    assert Document.objects.count() == 65


def test_no_save_signals_are_sent():
    heard: list[str] = []

    def hear(sender, **kwargs):
        heard.append(kwargs.get("signal") and sender.__name__)

    pre_save.connect(hear, sender=Document, weak=False)
    post_save.connect(hear, sender=Document, weak=False)
    try:
        Document.objects.enqueue_many([{"title": "quiet"}])
    finally:
        pre_save.disconnect(hear, sender=Document)
        post_save.disconnect(hear, sender=Document)
    assert heard == []
    assert Document.objects.filter(title="quiet").exists()


@pytest.mark.parametrize(
    ("call", "error", "words"),
    [
        (lambda: Document.objects.enqueue_many([Job(name="x")]), TypeError, "testapp.Job row"),
        (lambda: enqueue_many(Ledger, [{}]), NotClaimableError, "enqueue_many()"),
        (lambda: Document.objects.enqueue_many([{"titel": "x"}]), TypeError, "'titel'"),
        (lambda: Document.objects.enqueue_many([{"attempts": 2}]), ValueError, "'attempts'"),
        (lambda: Document.objects.enqueue_many([{"version": 7}]), ValueError, "'version'"),
        (
            lambda: Document.objects.enqueue_many([{"created_at": timezone.now()}]),
            ValueError,
            "'created_at'",
        ),
        (
            lambda: Document.objects.enqueue_many([{"locked_until": timezone.now()}]),
            ValueError,
            "'locked_until'",
        ),
        (lambda: Document.objects.enqueue_many([Document(attempts=3)]), ValueError, "attempts=3"),
        (lambda: Document.objects.enqueue_many([{"status": "done"}]), ValueError, "ready"),
        (lambda: enqueue_many(Job, [{"status": Job.PENDING}]), ValueError, "ready (1)"),
        (
            lambda: Document.objects.enqueue_many([{"run_after": datetime(2030, 1, 1)}]),
            ValueError,
            "naive run_after",
        ),
        (lambda: Document.objects.enqueue_many({"title": "x"}), TypeError, "iterable of rows"),
        (lambda: Document.objects.enqueue_many([42]), TypeError, "row 0 is a int"),
        (lambda: Document.objects.enqueue_many([{}, {"titel": 1}]), TypeError, "row 1"),
    ],
)
def test_bad_input_is_refused_in_one_line_before_any_write(call, error, words):
    with pytest.raises(error) as info:
        call()
    message = str(info.value)
    assert words in message, message
    assert "\n" not in message
    assert Document.objects.count() + Job.objects.count() == 0


def test_a_saved_instance_is_refused():
    row = Document.objects.create(title="saved")
    with pytest.raises(ValueError, match="already saved"):
        Document.objects.enqueue_many([row])
    assert Document.objects.count() == 1


def test_inside_the_callers_transaction_it_rolls_back_with_it():
    seen = []

    def produce_then_fail() -> None:
        with transaction.atomic():
            Document.objects.enqueue_many([{"title": "gone"}])
            seen.append(Document.objects.filter(title="gone").exists())
            raise RuntimeError("the caller's block fails")

    with pytest.raises(RuntimeError):
        produce_then_fail()
    assert seen == [True]
    assert Document.objects.count() == 0


def test_async_twin():
    async def produce() -> list[Document]:
        return await Document.objects.aenqueue_many([{"title": "a"}, {"title": "b"}])

    made = async_to_sync(produce)()
    assert len(made) == 2
    assert sorted(Document.objects.values_list("title", flat=True)) == ["a", "b"]


# -- the wake-up (PostgreSQL) --------------------------------------------------------------


class Listener:
    """A LISTENing connection of its own; :meth:`drain` returns what arrived before its
    own sentinel notification (delivery follows commit order)."""

    def __init__(self, channel: str = "taskclaim") -> None:
        s = connection.settings_dict
        self.channel = channel
        self.conn = psycopg.connect(
            host=s["HOST"] or "127.0.0.1",
            port=int(s["PORT"] or 5432),
            user=s["USER"] or "postgres",
            dbname=s["NAME"],
            autocommit=True,
        )
        self.conn.execute(f'LISTEN "{channel}"')

    def drain(self) -> list[str]:
        self.conn.execute("SELECT pg_notify(%s, 'sentinel')", [self.channel])
        got = []
        for note in self.conn.notifies(timeout=30):
            if note.payload == "sentinel":
                return got
            got.append(note.payload)
        raise AssertionError(f"no sentinel within 30 s; got {got}")


@pytest.fixture
def listener() -> Iterator[Listener]:
    if connection.vendor != "postgresql":
        pytest.skip(f"NOTIFY is PostgreSQL's (running on {connection.vendor})")
    heard = Listener()
    yield heard
    heard.conn.close()


def test_one_wake_up_per_call_and_only_after_commit(listener):
    with transaction.atomic():
        Document.objects.enqueue_many([{"title": f"n{i}"} for i in range(30)], batch_size=10)
        assert listener.drain() == []  # not before the commit
    assert listener.drain() == ["testapp.Document"]
    Document.objects.enqueue_many([{"title": f"m{i}"} for i in range(30)], batch_size=10)
    assert listener.drain() == ["testapp.Document"]  # autocommit: once, after the rows
    Document.objects.enqueue_many([])
    assert listener.drain() == []


def test_an_active_unique_key_refuses_the_whole_batch():
    Export.objects.create(dedupe_key="k", payload="first")
    with pytest.raises(IntegrityError):
        Export.objects.enqueue_many(
            [{"dedupe_key": "a", "payload": "x"}, {"dedupe_key": "k", "payload": "y"}]
        )
    assert list(Export.objects.values_list("dedupe_key", flat=True)) == ["k"]
    Export.objects.enqueue_many([{"dedupe_key": "b", "payload": "z"}])
    assert Export.objects.filter(dedupe_key="b", status="ready").count() == 1
