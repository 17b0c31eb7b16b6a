"""Locks through a real pgBouncer in transaction pooling mode (PostgreSQL only).

pgBouncer is started by a fixture on a free loopback port in front of the test database.
With ``pool_mode = transaction`` every transaction (every statement in autocommit) may
run on another server connection: transaction-scope advisory locks and lease locks still
exclude; session-scope advisory locks do not, and the library refuses them when
``TASKCLAIM_POOLER_MODE = "transaction"``.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from django.db import connection

from tests.support import pgbouncer
from tests.support.locks_contender import contend, ledger_rows, ledger_table, overlaps

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def bouncer():
    """``(port, database, single-connection database)`` of a running pgBouncer."""
    if connection.vendor != "postgresql":
        pytest.skip(f"pgBouncer sits in front of PostgreSQL (running on {connection.vendor})")
    if pgbouncer.binary() is None:
        reason = "pgbouncer is not installed (apt-get install pgbouncer); skipping"
        print(reason)
        pytest.skip(reason)
    name = str(connection.settings_dict["NAME"])
    single = f"{name}_single"
    dbs = {name: (name, 4), single: (name, 1)}
    with pgbouncer.run_pgbouncer(connection.settings_dict, dbs) as port:
        yield port, name, single


def through(port: int, dbname: str) -> psycopg.Connection[Any]:
    conn = psycopg.connect(
        host="127.0.0.1", port=port, dbname=dbname, user="postgres", autocommit=True
    )
    return conn


def child_env(port: int) -> dict[str, str]:
    return {
        "DATABASE_URL": f"postgres://postgres@127.0.0.1:{port}/postgres",
        "TASKCLAIM_CHILD_POOLER_MODE": "transaction",
    }


def check(totals: dict[str, int], table: str, attempts: int) -> None:
    rows = ledger_rows(table)
    assert totals["won"] + totals["skipped"] == attempts
    assert totals["won"] == len(rows) >= 5
    assert totals["skipped"] > 0, "the contenders never collided"
    assert sorted(r[0] for r in rows) == list(range(1, len(rows) + 1))
    assert overlaps(rows) == []


@pytest.mark.slow
def test_transaction_scope_advisory_locks_exclude(bouncer):
    port, name, _ = bouncer
    with ledger_table() as table:
        totals = contend("advisory", table, procs=5, attempts=30, env=child_env(port))
        check(totals, table, 150)
    # every attempt went through pgBouncer
    assert pgbouncer.transactions_served(port, name) >= 150


@pytest.mark.slow
def test_lease_locks_exclude(bouncer):
    port, name, _ = bouncer
    with ledger_table() as table:
        totals = contend("lease", table, procs=5, attempts=30, env=child_env(port))
        check(totals, table, 150)
    # every attempt went through pgBouncer
    assert pgbouncer.transactions_served(port, name) >= 150


@pytest.mark.slow
def test_session_scope_advisory_locks_are_refused(bouncer):
    port, _, _ = bouncer
    with ledger_table() as table, pytest.raises(AssertionError) as failed:
        contend("advisory-session", table, procs=1, attempts=1, env=child_env(port))
    assert "LockUsageError" in str(failed.value)
    assert "TASKCLAIM_POOLER_MODE" in str(failed.value)


def test_a_raw_session_lock_does_not_exclude_through_transaction_pooling(bouncer):
    """The classic pooler pitfall, executable: two clients both "hold" one session lock."""
    port, name, single = bouncer
    a, b = through(port, single), through(port, single)
    try:
        (got_a,) = a.execute("SELECT pg_try_advisory_lock(4242)").fetchone()
        (got_b,) = b.execute("SELECT pg_try_advisory_lock(4242)").fetchone()
        assert got_a is True
        assert got_b is True, "client b 'acquired' the lock client a holds"
        # The lock belongs to a pooled server connection, not to either client.
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                "AND objid = 4242 AND pid <> pg_backend_pid()"
            )
            assert cursor.fetchone()[0] == 1
    finally:
        a.execute("SELECT pg_advisory_unlock_all()")
        a.close()
        b.close()
    # Transaction-scope locks, on the same kind of pool, do exclude.
    c, d = through(port, name), through(port, name)
    try:
        with c.transaction():
            (got_c,) = c.execute("SELECT pg_try_advisory_xact_lock(4242)").fetchone()
            with d.transaction():
                (got_d,) = d.execute("SELECT pg_try_advisory_xact_lock(4242)").fetchone()
        assert (got_c, got_d) == (True, False)
    finally:
        c.close()
        d.close()


@pytest.mark.slow
def test_an_undeclared_pooler_is_detected_and_session_locks_refused(bouncer):
    """pgBouncer on a port other than 6432 and TASKCLAIM_POOLER_MODE unset: PostgreSQL
    reports the port it accepted the connection on, which is not the one Django dialled,
    so session-scope advisory locks are refused instead of silently excluding nobody."""
    port, _, _ = bouncer
    assert port != 6432
    env = {"DATABASE_URL": f"postgres://postgres@127.0.0.1:{port}/postgres"}
    with ledger_table() as table, pytest.raises(AssertionError) as failed:
        contend("advisory-session", table, procs=1, attempts=1, env=env)
    assert "LockUsageError" in str(failed.value)
    assert "a pooler or proxy sits between" in str(failed.value)


def test_session_locks_work_when_connected_directly():
    """The same check passes on a direct connection (the port Django dialled is the
    server's), so session locks are not refused without a pooler."""
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL only")
    from django_taskclaim.locks import advisory

    with advisory("direct-session", xact=False) as got:
        assert got is True
