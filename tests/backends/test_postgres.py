"""PostgreSQL specifics: the claim uses the partial index; round trips are counted."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from tests.support.helpers import claim_queries
from tests.support.testapp.models import Document

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
    from django_taskclaim.claim.base import candidates
    from django_taskclaim.claim.statements import compile_queryset
    from django_taskclaim.config.options import get_options

    sql, params = compile_queryset(
        candidates(Document.objects.claimable(), get_options(Document), 10)
    )
    with connection.cursor() as cur:
        cur.execute(f"EXPLAIN {sql} FOR UPDATE SKIP LOCKED", params)
        plan = "\n".join(r[0] for r in cur.fetchall())
    assert "testapp_document_claim" in plan, plan
    assert "Seq Scan" not in plan, plan


def _plan_of_the_claim_and_completion(strategy: str) -> tuple[str, str]:
    """EXPLAIN of the claim statement ``claim()`` sends, and of the batched completion's,
    each in a transaction rolled back."""
    with CaptureQueriesContext(connection) as seen:
        claimed = Document.objects.claim(5, strategy=strategy)
        assert len(claimed) == 5
        Document.objects.complete_many(claimed)
    # The claim's UPDATE (one statement; the first of the compare-and-set ones), and
    # the completion (the last statement).
    writes = [q["sql"] for q in seen.captured_queries if q["sql"].startswith(("WITH", "UPDATE"))]
    claim, complete = writes[0], writes[-1]
    plans = []
    for sql in (claim, complete):
        with connection.cursor() as cur:
            cur.execute("BEGIN")
            cur.execute(f"EXPLAIN {sql}")
            plans.append("\n".join(r[0] for r in cur.fetchall()))
            cur.execute("ROLLBACK")
    return plans[0], plans[1]


@pytest.mark.parametrize("strategy", ["skip_locked", "cas"])
def test_stale_statistics_do_not_turn_the_claim_into_a_scan_of_every_ready_row(strategy):
    """Statistics taken while no row was ready (a large history, the queue empty), then a
    backlog: the claim's UPDATE must still find its rows by primary key. With a plain
    ``status = 'ready'`` re-check the planner scanned the whole partial claim index for
    each claim (it believes that index holds one row): quadratic drain."""
    with connection.cursor() as cur:
        cur.execute(
            "INSERT INTO testapp_document (title, kind, payload, result, status, version, "
            "locked_by, attempts, priority, last_error) "
            "SELECT 'd' || g, '', '{}', '', 'done', 1, '', 1, 0, '' "
            "FROM generate_series(1, 200000) g"
        )
        cur.execute("ANALYZE testapp_document")  # no row ready, none processing
        cur.execute(
            "INSERT INTO testapp_document (title, kind, payload, result, status, version, "
            "locked_by, attempts, priority, last_error) "
            "SELECT 'r' || g, '', '{}', '', 'ready', 0, '', 0, 0, '' "
            "FROM generate_series(1, 5000) g"
        )
    claim, complete = _plan_of_the_claim_and_completion(strategy)
    # The row to update is looked up by the primary key, never found by the claim index.
    assert "testapp_document_pkey" in claim, claim
    assert claim.count("testapp_document_claim") <= 1, claim  # the candidates' scan only
    assert "testapp_document_lease" not in complete, complete
    assert "testapp_document_pkey" in complete, complete


def test_round_trips_claim_one_complete_one():
    Document.objects.bulk_create([Document() for _ in range(20)])
    with CaptureQueriesContext(connection) as q:
        rows = Document.objects.claim(10)
    assert len(rows) == 10
    assert len(claim_queries(q)) == 1, [x["sql"] for x in q.captured_queries]
    with CaptureQueriesContext(connection) as q:
        rows[0].complete(result="x")
    assert len(q.captured_queries) == 1
    with CaptureQueriesContext(connection) as q:
        Document.objects.extend_leases(rows[1:])
    assert len(q.captured_queries) == 1
    with CaptureQueriesContext(connection) as q:
        assert Document.objects.claim_next(strategy="advisory") is not None
    assert len(claim_queries(q)) == 1


def test_a_serializable_claim_that_loses_every_race_claims_nothing(settings, caplog):
    """Another session updates the one ready row while a ``serializable`` claim waits on
    it; when that session commits, the claim's transaction cannot serialize. With no
    retries left the claim returns ``[]`` (the row went to someone else) instead of
    raising a database error at the caller — and the row is the other session's."""
    import threading

    from django.db import connections

    from tests.support.helpers import wait_for

    settings.TASKCLAIM_DB_RETRIES = 0
    caplog.set_level("INFO", logger="django_taskclaim.claim")
    doc = Document.objects.create(title="contended")
    other = connections.create_connection("default")
    outcome: dict[str, object] = {}
    try:
        other.set_autocommit(False)
        with other.cursor() as cur:
            cur.execute(
                "UPDATE testapp_document SET status = 'processing', version = version + 1, "
                "locked_by = 'other' WHERE id = %s",
                [doc.pk],
            )

        def claim() -> None:
            try:
                with connection.cursor() as cur:
                    cur.execute("SELECT pg_backend_pid()")
                    outcome["pid"] = cur.fetchone()[0]
                outcome["rows"] = Document.objects.claim(1, strategy="serializable")
            except BaseException as exc:  # the assertion below reports it
                outcome["error"] = exc
            finally:
                connections.close_all()

        claimer = threading.Thread(target=claim)
        claimer.start()

        def claimer_waits_on_the_row() -> bool:
            if "pid" not in outcome:
                return False
            with connection.cursor() as cur:
                cur.execute("SELECT cardinality(pg_blocking_pids(%s)) > 0", [outcome["pid"]])
                return bool(cur.fetchone()[0])

        wait_for(claimer_waits_on_the_row, what="the claim waiting on the updated row")
        other.commit()
        claimer.join(timeout=30)
    finally:
        other.close()
    assert "error" not in outcome, outcome.get("error")
    assert outcome["rows"] == []
    assert "lost the race on every retry" in caplog.text
    doc.refresh_from_db()
    assert (doc.status, doc.locked_by) == ("processing", "other")
