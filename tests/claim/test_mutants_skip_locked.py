"""The ``skip_locked`` claim of ``django_taskclaim/claim/skip_locked.py`` on real rows, at the
points the claim tests do not look (docs/testing.md, "Mutation testing"): a row another
session holds locked is skipped, not waited for (also when the claim's filter joins a
row of another table that session holds), the lease each claimed row gets from the
database's clock (the same end in the row and in the instance), the token, holder and
attempts set in memory, which rows come back marked recovered, keyed models (one row per
key), and a claim of a deferred-field queryset that returns fully loaded rows.

``SkipLocked.claim`` has two ways: one ``UPDATE … RETURNING`` statement (PostgreSQL) and a
short transaction, locking ``SELECT`` then ``UPDATE`` (MariaDB, MySQL). On PostgreSQL the
tests run both (the second by telling the backend it cannot claim in one statement), so
that one run covers each line. SQLite has no ``SKIP LOCKED``: skipped there.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from datetime import timedelta

import pytest
from django.db import connection, connections, transaction
from django.test.utils import CaptureQueriesContext, override_settings

from django_taskclaim.backends import for_connection
from django_taskclaim.claim.base import was_recovered
from django_taskclaim.db import DbNow
from tests.support.archiveapp.models import Report, Shelf
from tests.support.keyedapp.models import KeyedJob
from tests.support.routers import ELSEWHERE
from tests.support.testapp.models import Document

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        connection.vendor == "sqlite", reason="SQLite has no SELECT … FOR UPDATE SKIP LOCKED"
    ),
]

#: A claim must skip a locked row at once; one that waits for it gets it after this long.
HOLD = 5.0


@pytest.fixture(params=["one_statement", "transaction"])
def way(request, monkeypatch):
    """The claim's way: one statement (PostgreSQL only), or the short transaction."""
    backend = type(for_connection(connection))
    if request.param == "one_statement":
        if not backend.claims_in_one_statement:
            pytest.skip("one-statement claims: PostgreSQL")
    else:
        monkeypatch.setattr(backend, "claims_in_one_statement", False)
    return request.param


@contextmanager
def locked_elsewhere(model, pk):
    """Another session holds the row ``pk`` of ``model`` locked (``SELECT … FOR UPDATE``)
    until the block ends, or ``HOLD`` seconds (a claim that waited for it gets it then)."""
    taken, done = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def hold():
        try:
            with transaction.atomic():
                list(model._base_manager.select_for_update().filter(pk=pk))
                taken.set()
                done.wait(HOLD)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
            taken.set()
        finally:
            connections.close_all()

    thread = threading.Thread(target=hold)
    thread.start()
    assert taken.wait(30)
    try:
        yield
    finally:
        done.set()
        thread.join(30)
    assert not errors


def make(n: int) -> list[Document]:
    return [Document.objects.create(title=f"d{i}") for i in range(n)]


def titles(rows) -> list[str]:
    return [r.title for r in rows]


def test_a_row_locked_elsewhere_is_skipped(way):
    docs = make(3)
    with locked_elsewhere(Document, docs[0].pk):
        rows = Document.objects.claim(2, strategy="skip_locked", worker="me")
        assert titles(rows) == ["d1", "d2"]
        assert Document.objects.get(pk=docs[0].pk).status == "ready"
    assert titles(Document.objects.claim(2, strategy="skip_locked")) == ["d0"]


def test_a_row_of_a_joined_table_locked_elsewhere_stops_nothing(way):
    if not connection.features.has_select_for_update_of:
        pytest.skip("MariaDB has no FOR UPDATE OF: its claim locks (and skips) the joined rows too")
    shelf = Shelf.objects.create(name="s")
    Report.objects.create(title="r0", shelf=shelf)
    Report.objects.create(title="r1", shelf=shelf)
    with locked_elsewhere(Shelf, shelf.pk):
        rows = Report.objects.filter(shelf__name="s").claim(5, strategy="skip_locked")
        assert sorted(r.title for r in rows) == ["r0", "r1"]


def test_the_claimed_rows_carry_the_lease_token_and_holder_written(way):
    docs = make(4)
    rows = Document.objects.claim(3, strategy="skip_locked", worker="me", lease=120)
    assert titles(rows) == ["d0", "d1", "d2"]
    now = Document.objects.annotate(now=DbNow()).values_list("now", flat=True)[:1].get()
    for r in rows:
        db = Document.objects.get(pk=r.pk)
        assert (db.status, db.version, db.attempts, db.locked_by) == ("processing", 1, 1, "me")
        assert (r.status, r.version, r.attempts, r.locked_by) == ("processing", 1, 1, "me")
        assert r.locked_until == db.locked_until
        assert timedelta(seconds=110) < db.locked_until - now <= timedelta(seconds=120)
        assert db.claimed_at is not None
        assert not hasattr(r, "_taskclaim_now")
        assert not was_recovered(r)
    assert Document.objects.get(pk=docs[3].pk).status == "ready"
    rows[0].complete(result="ok")  # a fenced instance: its token matches
    assert Document.objects.get(pk=rows[0].pk).status == "done"


def test_nothing_to_claim_is_empty(way):
    assert Document.objects.claim(3, strategy="skip_locked") == []


def test_rows_back_from_a_lost_holder_are_marked_recovered(way):
    docs = make(3)
    Document.objects.filter(pk=docs[2].pk).update(
        locked_until=DbNow() - timedelta(seconds=5), priority=2
    )
    rows = Document.objects.claim(3, strategy="skip_locked")
    assert [(r.title, was_recovered(r)) for r in rows] == [
        ("d2", True),
        ("d0", False),
        ("d1", False),
    ]


def test_a_deferred_field_queryset_claims_fully_loaded_rows(way):
    Document.objects.create(title="t", payload={"n": 1})
    (row,) = Document.objects.only("title").claim(1, strategy="skip_locked")
    with CaptureQueriesContext(connection) as q:
        seen = (row.payload, row.status, row.version)
    assert q.captured_queries == []
    assert seen == ({"n": 1}, "processing", 1)


def test_a_keyed_model_gets_one_row_per_key(way):
    for customer in (1, 1, 2):
        KeyedJob.objects.create(customer_id=customer)
    rows = KeyedJob.objects.claim(3, strategy="skip_locked", worker="me")
    assert sorted(r.customer_id for r in rows) == [1, 2]
    assert KeyedJob.objects.filter(status="processing").count() == 2


def test_a_keyed_row_locked_elsewhere_is_skipped(way):
    jobs = [KeyedJob.objects.create(customer_id=c) for c in (1, 2)]
    with locked_elsewhere(KeyedJob, jobs[0].pk):
        rows = KeyedJob.objects.claim(2, strategy="skip_locked")
        assert [r.pk for r in rows] == [jobs[1].pk]


def test_a_claim_runs_on_the_querysets_database(way):
    make(2)
    with override_settings(DATABASE_ROUTERS=[ELSEWHERE]):
        # filtered: a plain claim reuses a claimable queryset kept per database alias
        qs = Document.objects.using("default").filter(title__startswith="d")
        rows = qs.claim(2, strategy="skip_locked", worker="me")
    assert titles(rows) == ["d0", "d1"]
    assert Document.objects.filter(locked_by="me").count() == 2


def test_one_statement_claims_alike_reuse_the_statement_they_built(monkeypatch):
    """PostgreSQL: claims alike in size, lease and holder build the claim statement
    once (``statements.kept_claim``); each still skips a row locked elsewhere."""
    backend = type(for_connection(connection))
    if not backend.claims_in_one_statement:
        pytest.skip("one-statement claims: PostgreSQL")
    built: list[int] = []
    original = backend.claim

    def claim(self, *args, **kwargs):
        built.append(1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(backend, "claim", claim)
    first, second, third = (Document.objects.create(title=f"k{i}") for i in range(3))
    with locked_elsewhere(Document, first.pk):
        got = Document.objects.claim(1, strategy="skip_locked", worker="w")
        assert [r.pk for r in got] == [second.pk]
        got = Document.objects.claim(1, strategy="skip_locked", worker="w")
        assert [r.pk for r in got] == [third.pk]
    assert len(built) == 1
