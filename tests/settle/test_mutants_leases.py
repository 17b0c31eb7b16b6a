"""The lease renewals of ``django_taskclaim/settle/leases.py`` on real rows, at the points the
lifecycle and fence tests do not look (docs/testing.md, "Mutation testing"): the lease
each renewal writes (the one given, else the model's, counted from the database's
clock), the database it writes (the one given, not a router's choice), the busy database
it retries, the status re-check of its fence, and — on the databases with
``SKIP LOCKED`` — a row another session holds locked, reported busy and left alone.

``renew_leases`` has two ways: ``SELECT … FOR UPDATE SKIP LOCKED`` then an ``UPDATE``
where the database can skip locked rows, one ``UPDATE`` elsewhere (SQLite). On
PostgreSQL and MariaDB the tests run both (the second by telling the connection it has
no ``SKIP LOCKED``), so that one run covers each line.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from django.conf import settings
from django.db import connection, connections, transaction
from django.test.utils import CaptureQueriesContext, override_settings

from django_taskclaim.db import DbNow
from django_taskclaim.settle.leases import extend_leases, renew_leases
from tests.support.helpers import BusyOnce
from tests.support.testapp.models import Document

pytestmark = pytest.mark.django_db(transaction=True)

SKIP_LOCKED = settings.DB_VENDOR in ("postgresql", "mysql")


class ElsewhereRouter:
    """Sends every read and write it is asked about to a database alias that does not
    exist: a renewal given ``using`` must never ask it."""

    def db_for_read(self, model, **hints):
        return "elsewhere"

    def db_for_write(self, model, **hints):
        return "elsewhere"


ELSEWHERE = override_settings(DATABASE_ROUTERS=[f"{__name__}.ElsewhereRouter"])


WRITES = [
    pytest.param("extend", id="extend_leases"),
    pytest.param("skip_locked", id="renew_leases-skip_locked"),
    pytest.param("one_update", id="renew_leases-one_update"),
]


@pytest.fixture
def write(request, monkeypatch):
    """The lease write of the test's parameter: ``(tasks, seconds=None) -> result`` on
    ``default``, and the result that says every row was renewed."""
    way = request.param
    if way == "skip_locked" and not SKIP_LOCKED:
        pytest.skip("SKIP LOCKED: PostgreSQL and MariaDB")
    if way == "one_update":
        monkeypatch.setattr(connection.features, "has_select_for_update_skip_locked", False)
    if way == "extend":
        return (lambda tasks, *a: extend_leases(Document, "default", tasks, *a)), []
    return (lambda tasks, *a: renew_leases(Document, "default", tasks, *a)), ([], [])


def claimed(n: int) -> list[Document]:
    Document.objects.bulk_create(Document(title=f"d{i}") for i in range(n))
    return list(Document.objects.claim(n, worker="w"))


def lease_left(task: Document) -> float:
    """Seconds from the database's now to the row's lease end."""
    row = Document.objects.annotate(now=DbNow()).get(pk=task.pk)
    return (row.locked_until - row.now).total_seconds()


def tokens(tasks: list[Document]) -> list[int]:
    return [Document.objects.get(pk=t.pk).version for t in tasks]


@pytest.mark.parametrize("write", WRITES, indirect=True)
def test_the_lease_written_is_the_one_given_else_the_models(write):
    renew, nothing = write
    rows = claimed(2)
    before = tokens(rows)
    assert renew(rows, 600) == nothing
    for row in rows:
        assert 590 < lease_left(row) <= 600
    assert renew(rows, timedelta(seconds=200)) == nothing
    for row in rows:
        assert 190 < lease_left(row) <= 200
    assert renew(rows) == nothing  # ClaimMeta.lease = 30
    for row in rows:
        assert 20 < lease_left(row) <= 30
    assert tokens(rows) == before  # a renewal never moves the token
    assert set(Document.objects.values_list("status", flat=True)) == {"processing"}


@pytest.mark.parametrize("write", WRITES, indirect=True)
def test_a_renewal_writes_the_database_it_is_given_not_a_routers(write):
    renew, nothing = write
    held, lost = claimed(2)
    Document.objects.filter(pk=lost.pk).update(version=lost.version + 1)
    with ELSEWHERE:
        assert renew([held, lost], 600) == ([lost] if nothing == [] else ([lost], []))
        assert renew([held], 500) == nothing
    assert 490 < lease_left(held) <= 500
    assert lease_left(lost) < 40  # the lost row's lease was not touched


@pytest.mark.parametrize("write", WRITES, indirect=True)
def test_a_busy_database_is_retried_and_says_what_it_retries(write, caplog, request):
    renew, nothing = write
    way = request.node.callspec.params["write"]
    rows = claimed(2)
    # The first statement of the write: the UPDATE, or the SELECT … FOR UPDATE SKIP
    # LOCKED that picks the rows to renew.
    busy = BusyOnce("SELECT" if way == "skip_locked" else "UPDATE")
    with caplog.at_level("DEBUG", logger="django_taskclaim"), connection.execute_wrapper(busy):
        assert renew(rows, 600) == nothing
    assert busy.left == 0  # it did fail once
    for row in rows:
        assert 590 < lease_left(row) <= 600
    what = "extend leases" if way == "extend" else "renew leases"
    assert any(f"retrying what={what} attempt=1" in r.getMessage() for r in caplog.records)


@pytest.mark.skipif(
    settings.DB_VENDOR != "postgresql", reason="the opaque status re-check is PostgreSQL's"
)
@pytest.mark.parametrize("write", WRITES, indirect=True)
def test_the_lease_write_rechecks_the_status_as_an_opaque_parameter(write):
    """The fence's status condition in the write is the re-check a planner cannot take
    for a reason to scan the partial lease index (rules.status_recheck), not the read's
    plain ``status = 'processing'``."""
    renew, _ = write
    rows = claimed(1)
    with CaptureQueriesContext(connection) as queries:
        renew(rows, 600)
    fenced = [
        q["sql"]
        for q in queries.captured_queries
        if '"version"' in q["sql"] and ("FOR UPDATE" in q["sql"] or q["sql"].startswith("UPDATE"))
    ]
    assert fenced, queries.captured_queries
    assert all("(SELECT CAST(" in sql for sql in fenced), fenced


@pytest.mark.skipif(not SKIP_LOCKED, reason="SKIP LOCKED: PostgreSQL and MariaDB")
def test_a_row_locked_by_another_session_is_busy_and_not_waited_for():
    """The heartbeat's renewal skips a row another session holds locked: it reports it
    busy (not lost), leaves its lease alone, and renews the others without waiting."""
    free, locked, lost = claimed(3)
    Document.objects.filter(pk=lost.pk).update(version=lost.version + 1)
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        try:
            with transaction.atomic():
                Document.objects.select_for_update().get(pk=locked.pk)
                holding.set()
                release.wait(10)
        finally:
            connections.close_all()

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert holding.wait(10)
        start = time.monotonic()
        lost_rows, busy = renew_leases(Document, "default", [free, locked, lost], 600)
        took = time.monotonic() - start
    finally:
        release.set()
        holder.join(15)
    assert took < 5  # not waited for (the holder lets go after 10 s)
    assert (lost_rows, busy) == ([lost], [locked])
    assert 590 < lease_left(free) <= 600
    assert lease_left(locked) < 40  # skipped: its lease was not moved
    assert renew_leases(Document, "default", [free, locked], 600) == ([], [])
    assert 590 < lease_left(locked) <= 600
