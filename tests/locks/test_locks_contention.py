"""10 processes contend for one singleton ~500 times; the ledger never shows two holders.

Each win records, inside the lock, its holding interval (database timestamps) and a
sequence number read and then written in separate statements: two holders at once would
show overlapping intervals or a repeated sequence number.
"""

from __future__ import annotations

import pytest
from django.db import connection

from tests.support.locks_contender import contend, ledger_rows, ledger_table, overlaps

pytestmark = pytest.mark.django_db(transaction=True)

PROCS, ATTEMPTS = 10, 50  # 500 attempts in all


def assert_one_holder_at_a_time(
    totals: dict[str, int], table: str, *, attempts: int = PROCS * ATTEMPTS
) -> None:
    rows = ledger_rows(table)
    assert totals["won"] + totals["skipped"] == attempts
    assert totals["won"] == len(rows), "every win wrote exactly one ledger row"
    assert totals["skipped"] > 0, "the contenders never collided: the test proved nothing"
    assert len(rows) >= 10, f"too few wins to be meaningful: {totals}"
    seqs = sorted(r[0] for r in rows)
    assert seqs == list(range(1, len(rows) + 1)), "a sequence number was taken twice"
    assert overlaps(rows) == [], "two holders at once"
    assert len({r[1] for r in rows}) > 1, "more than one process must have won"


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["lease", "advisory", "advisory-session"])
def test_singleton_has_one_holder_at_a_time(backend):
    if backend != "lease" and connection.vendor == "sqlite":
        pytest.skip("SQLite has no advisory locks (lease locks are tested on it)")
    with ledger_table() as table:
        totals = contend(backend, table, procs=PROCS, attempts=ATTEMPTS)
        print(f"{backend} on {connection.vendor}: {totals}")
        assert_one_holder_at_a_time(totals, table)


@pytest.mark.slow
def test_the_ledger_catches_two_holders_when_there_is_no_lock():
    with ledger_table() as table:
        contend("none", table, procs=4, attempts=15, hold_ms=5)
        rows = ledger_rows(table)
        seqs = [r[0] for r in rows]
        assert overlaps(rows) or len(set(seqs)) < len(seqs), "the detector is blind"
