"""PostgreSQL specifics: the claim uses the partial index; round trips are counted."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from tests.testapp.models import Document

pytestmark = [pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def _pg_only():
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL-specific")


def test_claim_plan_uses_partial_index_on_large_table():
    with connection.cursor() as cur:
        cur.execute(
            "INSERT INTO testapp_document (title, kind, payload, result, status, version, "
            "locked_by, attempts, priority, last_error) "
            "SELECT 'd' || g, '', '{}', '', CASE WHEN g % 100 = 0 THEN 'ready' ELSE 'done' END, "
            "0, '', 0, 0, '' FROM generate_series(1, 100000) g"
        )
        cur.execute("ANALYZE testapp_document")
    from django_taskclaim.options import get_options
    from django_taskclaim.strategies import candidates, compile_queryset

    sql, params = compile_queryset(
        candidates(Document.objects.claimable(), get_options(Document), 10)
    )
    with connection.cursor() as cur:
        cur.execute(f"EXPLAIN {sql} FOR UPDATE SKIP LOCKED", params)
        plan = "\n".join(r[0] for r in cur.fetchall())
    assert "testapp_document_claim" in plan, plan
    assert "Seq Scan" not in plan, plan


def test_round_trips_claim_one_complete_one():
    Document.objects.bulk_create([Document() for _ in range(20)])
    with CaptureQueriesContext(connection) as q:
        rows = Document.objects.claim(10)
    assert len(rows) == 10
    assert len(q.captured_queries) == 1, [x["sql"] for x in q.captured_queries]
    with CaptureQueriesContext(connection) as q:
        rows[0].complete(result="x")
    assert len(q.captured_queries) == 1
    with CaptureQueriesContext(connection) as q:
        Document.objects.extend_leases(rows[1:])
    assert len(q.captured_queries) == 1
    with CaptureQueriesContext(connection) as q:
        assert Document.objects.claim_next(strategy="advisory") is not None
    assert len(q.captured_queries) == 1
