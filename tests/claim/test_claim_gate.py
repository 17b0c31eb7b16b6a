"""The claim gate: large claims of one table take turns (PostgreSQL).

A claim of at least ``TASKCLAIM_CLAIM_GATE`` rows first takes a transaction-scope
advisory lock of its table, in the same round trip, so concurrent large claims never
walk over each other's locked rows. These tests watch the gate from another session
(``pg_locks``), run many claimer processes behind it (ONE HOLDER, NO LOSS), through a
real pgBouncer in transaction pooling, and with Django's server-side binding cursors.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import psycopg
import pytest
from django.core import checks
from django.db import connection, connections, transaction
from django.test.utils import CaptureQueriesContext, override_settings

from django_taskclaim.backends.postgresql import CLAIM_GATE_SPACE, claim_gate_key
from django_taskclaim.config.options import get_options
from tests.guarantees.test_one_holder import run_claimers
from tests.support import pgbouncer
from tests.support.helpers import child_env, claim_queries, wait_for
from tests.support.testapp.models import Document

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _postgresql_only():
    if connection.vendor != "postgresql":
        pytest.skip(f"the claim gate is PostgreSQL's (running on {connection.vendor})")


def _unsigned(value: int) -> int:
    return value & 0xFFFFFFFF


def waiting_at_gate() -> int:
    """Sessions waiting for Document's claim gate, seen from another session."""
    space, table = claim_gate_key(Document._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
            "AND classid = %s::oid AND objid = %s::oid AND objsubid = 2",
            [_unsigned(space), _unsigned(table)],
        )
        return int(cursor.fetchone()[0])


def another_session() -> psycopg.Connection[Any]:
    s = connection.settings_dict
    return psycopg.connect(
        host=s["HOST"] or "127.0.0.1",
        port=int(s["PORT"] or 5432),
        user=s["USER"] or "postgres",
        dbname=s["NAME"],
    )


def claims_sent(captured: list[dict[str, str]]) -> list[str]:
    return [q["sql"] for q in captured if "taskclaim_c" in q["sql"]]


@override_settings(TASKCLAIM_CLAIM_GATE=10)
def test_a_large_claim_takes_the_gate_in_the_same_round_trip():
    Document.objects.bulk_create([Document(title=str(i)) for i in range(30)])
    with CaptureQueriesContext(connection) as large:
        rows = Document.objects.claim(10)
    with CaptureQueriesContext(connection) as small:
        fewer = Document.objects.claim(9)
    assert len(rows) == 10
    assert len(fewer) == 9
    assert {r.pk for r in rows}.isdisjoint(r.pk for r in fewer)
    assert all(r.status == "processing" and r.version == 1 for r in rows + fewer)
    # One round trip each; only the large claim carries the gate.
    assert len(claim_queries(large)) == 1
    assert len(claim_queries(small)) == 1
    assert claim_queries(large)[0]["sql"].startswith("SELECT pg_advisory_xact_lock(")
    assert "pg_advisory" not in claim_queries(small)[0]["sql"]
    # The gate ends with the claim's transaction: nothing is left held.
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = %s::oid",
            [_unsigned(CLAIM_GATE_SPACE)],
        )
        assert cursor.fetchone()[0] == 0


@override_settings(TASKCLAIM_CLAIM_GATE=None)
def test_no_gate_when_the_setting_is_none():
    Document.objects.bulk_create([Document(title=str(i)) for i in range(300)])
    with CaptureQueriesContext(connection) as ctx:
        assert len(Document.objects.claim(200)) == 200
    assert not any("pg_advisory" in q["sql"] for q in ctx.captured_queries)


@override_settings(TASKCLAIM_CLAIM_GATE=10)
def test_a_large_claim_waits_for_the_gate_and_a_small_one_does_not():
    Document.objects.bulk_create([Document(title=str(i)) for i in range(40)])
    holder = another_session()  # a large claim in flight: the gate taken, not yet committed
    holder.execute("SELECT pg_advisory_xact_lock(%s, %s)", claim_gate_key("testapp_document"))
    got: dict[str, Any] = {}

    def large_claim() -> None:
        try:
            got["rows"] = Document.objects.claim(10)
        finally:
            connections.close_all()

    waiter = threading.Thread(target=large_claim)
    waiter.start()
    try:
        wait_for(lambda: waiting_at_gate() == 1, timeout=30, what="the large claim at the gate")
        small = Document.objects.claim(5)  # below the gate: not held up
        assert len(small) == 5
        assert "rows" not in got, "the large claim passed a closed gate"
        assert waiter.is_alive()
    finally:
        holder.commit()
        holder.close()
        waiter.join(timeout=30)
    assert len(got["rows"]) == 10
    assert {r.pk for r in got["rows"]}.isdisjoint(r.pk for r in small)
    assert waiting_at_gate() == 0


@override_settings(TASKCLAIM_CLAIM_GATE=2)
def test_no_gate_inside_a_transaction_the_claim_does_not_own():
    """``hold`` claims inside the caller's transaction: a gate there would be held for the
    caller's whole job, so none is taken."""
    Document.objects.bulk_create([Document(title=str(i)) for i in range(10)])
    with transaction.atomic(), CaptureQueriesContext(connection) as ctx:
        rows = Document.objects.claim(5, strategy="hold")
        assert len(rows) == 5
    assert not any("pg_advisory" in q["sql"] for q in ctx.captured_queries)


@override_settings(TASKCLAIM_CLAIM_GATE=5)
def test_server_side_binding_takes_the_gate_in_a_transaction_of_its_own():
    """Django's server-side binding cursors send one statement per call: the gate and the
    claim then go as two statements of one transaction."""
    from django.db.backends.postgresql.psycopg_any import is_psycopg3

    if not is_psycopg3:
        pytest.skip("server-side binding is a psycopg 3 option")
    Document.objects.bulk_create([Document(title=str(i)) for i in range(20)])
    options = connection.settings_dict["OPTIONS"]
    connection.close()
    options["server_side_binding"] = True
    try:
        with CaptureQueriesContext(connection) as ctx:
            rows = Document.objects.claim(8)
        assert type(connection.connection.cursor()).__name__ == "ServerBindingCursor"
    finally:
        connection.close()
        del options["server_side_binding"]
    assert len(rows) == 8
    assert all(r.status == "processing" for r in rows)
    sent = [q["sql"] for q in claim_queries(ctx) if q["sql"] not in ("BEGIN", "COMMIT")]
    assert len(sent) == 2
    assert sent[0].startswith("SELECT pg_advisory_xact_lock(")
    assert sent[1] == claims_sent(ctx.captured_queries)[0]


@pytest.mark.slow
def test_every_row_claimed_once_behind_the_gate(tmp_path):
    """ONE HOLDER and NO LOSS with every claim behind the gate (8 processes)."""
    Document.objects.bulk_create([Document(title=str(i)) for i in range(3000)], batch_size=1000)
    claims, _ = run_claimers(tmp_path, extra=["--claim-gate", "1"])
    counts = Counter(c["pk"] for c in claims)
    assert max(counts.values()) == 1, "a row was claimed twice"
    assert len(counts) == 3000
    assert not [c for c in claims if c["got"] > c["n"]]
    assert set(Document.objects.values_list("status", "version", "attempts").distinct()) == {
        ("processing", 1, 1)
    }


@pytest.mark.slow
def test_claims_behind_the_gate_through_pgbouncer_transaction_pooling(tmp_path):
    """The gate is transaction-scoped: it holds through a transaction-pooling pgBouncer,
    where each round trip may run on another server connection."""
    if pgbouncer.binary() is None:
        reason = "pgbouncer is not installed (apt-get install pgbouncer); skipping"
        print(reason)
        pytest.skip(reason)
    name = str(connection.settings_dict["NAME"])
    Document.objects.bulk_create([Document(title=str(i)) for i in range(1500)], batch_size=1000)
    with pgbouncer.run_pgbouncer(connection.settings_dict, {name: (name, 3)}) as port:
        env = child_env(
            DATABASE_URL=f"postgres://postgres@127.0.0.1:{port}/postgres",
            TASKCLAIM_CHILD_POOLER_MODE="transaction",
        )
        claims, _ = run_claimers(tmp_path, extra=["--claim-gate", "1"], env=env, processes=4)
        assert pgbouncer.transactions_served(port, name) >= 1500 // 10
    counts = Counter(c["pk"] for c in claims)
    assert max(counts.values()) == 1
    assert len(counts) == 1500


@pytest.mark.parametrize("value", [0, -1, 1.5, "50", True, 10**6])
def test_absurd_gate_settings_are_refused_by_the_checks(value):
    with override_settings(TASKCLAIM_CLAIM_GATE=value):
        found = [e for e in checks.run_checks(tags=["taskclaim"]) if e.id == "taskclaim.E005"]
    assert any("CLAIM_GATE" in e.msg for e in found), found


def test_none_and_whole_numbers_are_accepted():
    for value in (None, 1, 50, 100_000):
        with override_settings(TASKCLAIM_CLAIM_GATE=value):
            assert get_options(Document).claim_gate == value
            assert not [
                e for e in checks.run_checks(tags=["taskclaim"]) if e.id == "taskclaim.E005"
            ]


def test_claim_meta_gate_is_checked(monkeypatch):
    from django_taskclaim.config import options

    monkeypatch.setattr(Document.ClaimMeta, "claim_gate", 0, raising=False)
    options._cache.pop(Document, None)
    try:
        found = [e for e in checks.run_checks(tags=["taskclaim"]) if e.id == "taskclaim.E002"]
        assert any("claim_gate" in e.msg and "testapp.Document" in e.msg for e in found), found
    finally:
        monkeypatch.undo()
        options._cache.pop(Document, None)
