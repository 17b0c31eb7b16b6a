"""The compare-and-set claim of ``django_taskclaim/claim/cas.py`` on real rows, at the points the
claim tests do not look (docs/testing.md, "Mutation testing"): which rows its rounds take
when another claimer takes candidates between the read and the write (the first in claim
order, the others after a collision, a second round when the whole first one collided),
how many candidates it reads (``TASKCLAIM_CAS_CANDIDATES``, never fewer than ``n``), the
token each row it returns carries, which rows come back marked recovered, and SQLite's
one-statement batch, which never takes a candidate that stopped being ``ready``.

The candidate-by-candidate way (``_claim_candidates``) is what ``claim(strategy="cas")``
runs on PostgreSQL and MariaDB; the tests run it on every database by calling it with the
request ``claim()`` would build, so that SQLite covers it too.
"""

from __future__ import annotations

from contextlib import contextmanager
from datetime import timedelta

import pytest
from django.db import connection
from django.db.models import F
from django.test.utils import CaptureQueriesContext, override_settings

from django_taskclaim.backends import for_connection
from django_taskclaim.claim import cas
from django_taskclaim.claim.base import was_recovered
from django_taskclaim.claim.cas import CompareAndSet
from django_taskclaim.claim.request import ClaimRequest
from django_taskclaim.config.options import get_options
from django_taskclaim.db import DbNow
from tests.support.keyedapp.models import KeyedJob
from tests.support.routers import ELSEWHERE
from tests.support.testapp.models import Document

pytestmark = pytest.mark.django_db(transaction=True)


def cas_claim(n: int, *, worker: str = "w", lease: float = 30) -> list[Document]:
    """``_claim_candidates`` on the claimable rows of ``Document``, as ``claim()`` calls it."""
    request = ClaimRequest(
        Document.objects.all().claimable(), n, get_options(Document), lease, worker
    )
    return CompareAndSet()._claim_candidates(request)


def make(n: int) -> list[Document]:
    return [Document.objects.create(title=f"d{i}") for i in range(n)]


@contextmanager
def taken_at_first_write(*victims: Document, how: str = "claimed"):
    """Another claimer takes ``victims`` just before the first ``UPDATE`` of the claim
    reaches the database (between its read of the candidates and its writes)."""
    state = {"done": False}

    def wrapper(execute, sql, params, many, context):
        if not state["done"] and sql.lstrip().upper().startswith("UPDATE"):
            state["done"] = True
            pks = [v.pk for v in victims]
            if how == "bumped":  # released and made ready again: a new token
                Document.objects.filter(pk__in=pks).update(version=F("version") + 1)
            elif how == "claimed":
                Document.objects.filter(pk__in=pks).update(
                    status="processing", version=F("version") + 1, locked_by="other"
                )
            else:
                Document.objects.filter(pk__in=pks).update(status=how)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(wrapper):
        yield state
    assert state["done"]


def titles(rows) -> list[str]:
    return [r.title for r in rows]


# -- the candidate-by-candidate way ---------------------------------------------------------


def test_the_first_rows_in_claim_order_get_the_claims_writes():
    docs = make(10)
    rows = cas_claim(3, worker="me", lease=120)
    assert titles(rows) == ["d0", "d1", "d2"]
    now = Document.objects.annotate(now=DbNow()).values_list("now", flat=True)[:1].get()
    for r in rows:
        db = Document.objects.get(pk=r.pk)
        assert (db.status, db.version, db.attempts, db.locked_by) == ("processing", 1, 1, "me")
        assert (r.status, r.version, r.attempts, r.locked_by) == ("processing", 1, 1, "me")
        assert timedelta(seconds=110) < db.locked_until - now <= timedelta(seconds=120)
        assert not was_recovered(r)
    assert Document.objects.filter(status="ready").count() == 7
    assert set(Document.objects.filter(status="ready").values_list("version", flat=True)) == {0}
    rows[0].complete(result="ok")  # each carries its row's token
    assert Document.objects.get(pk=docs[0].pk).status == "done"


def test_nothing_claimable_claims_nothing():
    assert cas_claim(3) == []
    Document.objects.create(title="x", status="done")
    assert cas_claim(3) == []


def test_fewer_rows_than_asked_are_all_taken_in_one_read():
    make(3)
    with CaptureQueriesContext(connection) as q:
        rows = cas_claim(5)
    assert titles(rows) == ["d0", "d1", "d2"]
    selects = [s for s in q.captured_queries if s["sql"].lstrip().upper().startswith("SELECT")]
    assert len(selects) == 2  # the candidates, then the re-read of the rows won


def test_it_reads_at_least_n_candidates_whatever_the_setting():
    make(6)
    with override_settings(TASKCLAIM_CAS_CANDIDATES=1):
        assert titles(cas_claim(4)) == ["d0", "d1", "d2", "d3"]


def test_it_stops_once_n_rows_are_won():
    make(6)
    with CaptureQueriesContext(connection) as q:
        assert titles(cas_claim(2)) == ["d0", "d1"]
    updates = [s for s in q.captured_queries if s["sql"].lstrip().upper().startswith("UPDATE")]
    assert len(updates) == 2
    assert Document.objects.filter(status="ready").count() == 4


def test_a_row_taken_by_another_claimer_is_passed_over_for_another():
    docs = make(4)
    with taken_at_first_write(docs[0]):
        rows = cas_claim(1, worker="me")
    assert len(rows) == 1
    assert rows[0].pk != docs[0].pk
    db = Document.objects.get(pk=docs[0].pk)
    assert (db.locked_by, db.version) == ("other", 1)  # the other claimer's, untouched
    assert Document.objects.filter(locked_by="me").count() == 1


def test_after_a_collision_the_rows_won_come_back_in_claim_order():
    docs = make(6)
    with taken_at_first_write(docs[0]):
        rows = cas_claim(4, worker="me")
    assert len(rows) == 4
    assert docs[0].pk not in {r.pk for r in rows}
    assert [r.pk for r in rows] == sorted(r.pk for r in rows)
    assert all(r.locked_by == "me" and r.version == 1 for r in rows)


def test_a_first_round_that_all_collided_is_followed_by_a_second():
    docs = make(4)
    with override_settings(TASKCLAIM_CAS_CANDIDATES=2), taken_at_first_write(docs[0], docs[1]):
        rows = cas_claim(2, worker="me")
    assert titles(rows) == ["d2", "d3"]
    assert set(Document.objects.filter(locked_by="other").values_list("title", flat=True)) == {
        "d0",
        "d1",
    }


def test_a_second_round_takes_what_the_first_left():
    docs = make(5)
    with override_settings(TASKCLAIM_CAS_CANDIDATES=2), taken_at_first_write(docs[0]):
        rows = cas_claim(3, worker="me")
    # round one: d0 taken by the other, d1 won; round two reads d2, d3 (d1 excluded)
    assert titles(rows) == ["d1", "d2", "d3"]


def test_a_row_whose_token_changed_since_the_read_is_not_written():
    docs = make(3)
    with taken_at_first_write(docs[0], how="bumped"):
        rows = cas_claim(1, worker="me")
    assert len(rows) == 1
    assert rows[0].pk != docs[0].pk
    db = Document.objects.get(pk=docs[0].pk)
    assert (db.status, db.version, db.locked_by) == ("ready", 1, "")


def test_after_a_collision_the_next_row_is_drawn_at_random(monkeypatch):
    class Last:
        """Draws the last of the remaining candidates."""

        @staticmethod
        def randrange(n):
            return n - 1

    monkeypatch.setattr(cas, "random", Last)
    docs = make(5)
    with taken_at_first_write(docs[0]):
        rows = cas_claim(1, worker="me")
    assert titles(rows) == ["d4"]


def test_a_claim_that_won_its_rows_after_a_collision_reads_no_more():
    docs = make(6)
    with taken_at_first_write(docs[0]), CaptureQueriesContext(connection) as q:
        rows = cas_claim(2, worker="me")
    assert len(rows) == 2
    selects = [s for s in q.captured_queries if s["sql"].lstrip().upper().startswith("SELECT")]
    assert len(selects) == 2  # the candidates once, then the re-read of the rows won


def test_it_gives_up_after_eight_rounds_that_all_collided():
    """Every candidate is taken by another claimer just before this claim's write: eight
    rounds of one candidate each, then nothing claimed."""
    make(12)
    stolen = []

    def wrapper(execute, sql, params, many, context):
        if sql.lstrip().upper().startswith("UPDATE") and stolen[-1:] != ["busy"]:
            stolen.append("busy")
            first = Document.objects.filter(status="ready").order_by("created_at", "pk")[:1]
            pk = first.values_list("pk", flat=True).get()
            Document.objects.filter(pk=pk).update(status="processing", locked_by="other")
            stolen[-1] = pk
        return execute(sql, params, many, context)

    with override_settings(TASKCLAIM_CAS_CANDIDATES=1), connection.execute_wrapper(wrapper):
        assert cas_claim(1, worker="me") == []
    assert len(stolen) == 8
    assert Document.objects.filter(locked_by="other").count() == 8
    assert not Document.objects.filter(locked_by="me").exists()


def test_rows_back_from_a_lost_holder_are_marked_recovered():
    docs = make(3)
    Document.objects.filter(pk=docs[1].pk).update(locked_until=DbNow() - timedelta(seconds=5))
    rows = cas_claim(3)
    assert [was_recovered(r) for r in rows] == [False, True, False]


# -- SQLite: the whole batch in one statement -----------------------------------------------


@pytest.fixture
def sqlite():
    if connection.vendor != "sqlite":
        pytest.skip("the one-statement batch is SQLite's compare-and-set")


def test_sqlite_batch_never_takes_a_candidate_that_stopped_being_ready(sqlite):
    docs = make(3)
    with taken_at_first_write(docs[1], how="done"):
        rows = Document.objects.claim(3, strategy="cas", worker="me")
    assert titles(rows) == ["d0", "d2"]
    db = Document.objects.get(pk=docs[1].pk)
    assert (db.status, db.version, db.locked_by) == ("done", 0, "")


def test_sqlite_batch_marks_recovered_rows_and_sorts_them(sqlite):
    docs = make(4)
    Document.objects.filter(pk=docs[2].pk).update(
        locked_until=DbNow() - timedelta(seconds=5), priority=3
    )
    rows = Document.objects.claim(4, strategy="cas", worker="me")
    assert titles(rows) == ["d2", "d0", "d1", "d3"]
    assert [was_recovered(r) for r in rows] == [True, False, False, False]
    assert all((r.version, r.locked_by) == (1, "me") for r in rows)


def test_sqlite_batch_of_nothing_is_empty(sqlite):
    assert Document.objects.claim(3, strategy="cas") == []


@pytest.fixture(params=["one_writer", "many_writers"])
def writers(request, monkeypatch):
    """The database as it is, and (on SQLite) as one that is not one writer at a time: the
    claim then takes the candidate-by-candidate way, as on PostgreSQL and MariaDB."""
    backend = type(for_connection(connection))
    if request.param == "many_writers":
        monkeypatch.setattr(backend, "one_writer_at_a_time", False)
    elif not backend.one_writer_at_a_time:
        pytest.skip("one writer at a time: SQLite")
    return request.param


def test_a_claim_passes_a_taken_row_over(writers):
    docs = make(3)
    with taken_at_first_write(docs[0]):
        rows = Document.objects.claim(2, strategy="cas", worker="me")
    if writers == "one_writer":  # one statement: the batch is what was read
        assert titles(rows) == ["d1"]
    else:
        assert titles(rows) == ["d1", "d2"]
    assert Document.objects.get(pk=docs[0].pk).locked_by == "other"


def test_a_keyed_model_gets_one_row_per_key(writers):
    for customer in (1, 1, 2, 3):
        KeyedJob.objects.create(customer_id=customer)
    rows = KeyedJob.objects.claim(4, strategy="cas", worker="me")
    assert sorted(r.customer_id for r in rows) == [1, 2, 3]
    assert all((r.status, r.version, r.locked_by) == ("processing", 1, "me") for r in rows)
    assert KeyedJob.objects.filter(status="processing").count() == 3


def test_sqlite_batch_opens_no_savepoint(sqlite):
    make(3)
    with CaptureQueriesContext(connection) as q:
        assert len(Document.objects.claim(3, strategy="cas")) == 3
    assert not [s for s in q.captured_queries if "SAVEPOINT" in s["sql"].upper()]


def test_a_claim_runs_on_the_querysets_database(writers):
    make(2)
    with override_settings(DATABASE_ROUTERS=[ELSEWHERE]):
        # filtered: a plain claim reuses a claimable queryset kept per database alias,
        # built earlier without the alias pinned (the router of the moment decides it)
        qs = Document.objects.using("default").filter(title__startswith="d")
        rows = qs.claim(2, strategy="cas", worker="me")
    assert titles(rows) == ["d0", "d1"]
    assert Document.objects.filter(locked_by="me").count() == 2
