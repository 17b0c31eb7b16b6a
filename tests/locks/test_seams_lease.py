"""Lease renewals under contention and load: six processes contend for one ``LeaseLock``
with a 1 s ttl and ``auto_renew`` while two busy loops load the CPUs. The ledger
(holder, token, acquired, released, lost-at; database clock) never shows two holders, and
a holder whose lease was taken over had been told (its cancel flag) before the takeover.
Also: the renewal cadence (at least three attempts per ttl), and ``lost`` stays lost."""

from __future__ import annotations

import itertools
import json
import logging
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.db import connection, connections

from django_taskclaim.locks import LeaseLock, LockLost
from tests.support.helpers import PYTHON, ROOT, child_env, wait_for
from tests.support.seams_lease_contender import DDL

pytestmark = pytest.mark.django_db(transaction=True)

PROCS, TTL, SECONDS, HOLD = 6, 1.0, 10.0, 2.5


@pytest.fixture
def cpu_load() -> Iterator[None]:
    """Two busy-loop processes beside the test, for its whole duration."""
    loops = [subprocess.Popen([PYTHON, "-c", "while True: pass"]) for _ in range(2)]
    try:
        yield
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()


@pytest.fixture
def ledger() -> Iterator[str]:
    if connection.vendor == "sqlite":
        pytest.skip("SQLite has one writer at a time: no row lock to contend on")
    name = "seams_lease_ledger"
    qname = connection.ops.quote_name(name)
    with connection.cursor() as cursor:
        cursor.execute(f"DROP TABLE IF EXISTS {qname}")
        cursor.execute(DDL[connection.vendor].format(t=qname))
    try:
        yield name
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"DROP TABLE IF EXISTS {qname}")


def run_contenders(table: str) -> dict[str, int]:
    with tempfile.TemporaryDirectory(prefix="taskclaim-seams-lease-") as tmp:
        go = str(Path(tmp) / "go")
        args = ["seams-contended", str(TTL), str(SECONDS), str(HOLD), table, go]
        children = [
            subprocess.Popen(
                [PYTHON, str(ROOT / "tests" / "support" / "seams_lease_contender.py"), *args],
                env=child_env(),
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(PROCS)
        ]
        try:
            wait_for(
                lambda: (
                    len(list(Path(tmp).glob("go.ready.*"))) == PROCS
                    or any(c.poll() is not None for c in children)
                ),
                timeout=120,
                what="all contenders to start",
            )
            Path(go).touch()
            totals = {"won": 0, "busy": 0}
            for child in children:
                out, err = child.communicate(timeout=180)
                assert child.returncode == 0, f"contender failed:\n{err}"
                result = json.loads(out.strip().splitlines()[-1])
                totals["won"] += result["won"]
                totals["busy"] += result["busy"]
            return totals
        finally:
            for child in children:
                if child.poll() is None:
                    child.kill()
                    child.communicate()


@pytest.mark.slow
def test_contended_short_lease_renewals_land_and_a_lost_holder_is_told_first(ledger, cpu_load):
    totals = run_contenders(ledger)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT holder, token, started_at, ended_at, lost_at, told_at_exit FROM "
            f"{connection.ops.quote_name(ledger)} ORDER BY started_at, id"
        )
        rows = cursor.fetchall()
    print(f"lease contention on {connection.vendor}: {totals}, {len(rows)} holds")
    assert totals["won"] == len(rows) >= 3
    assert totals["busy"] > 0, "the contenders never collided: the test proved nothing"
    told_at_exit = [r for r in rows if r[5]]
    assert told_at_exit == [], "a holder learnt of its lost lease only when it left"
    for prev, cur in itertools.pairwise(rows):
        assert cur[1] > prev[1], "tokens grow with each holder"
        stopped = prev[4] if prev[4] is not None else prev[3]
        assert stopped is not None, f"a hold never ended: {prev}"
        assert stopped <= cur[2], f"two holders at once: {prev} then {cur}"
    completed = [r for r in rows if r[3] is not None]
    assert len(completed) * 2 >= len(rows), f"renewals did not land: {rows}"


def test_renewals_are_attempted_at_least_three_times_per_ttl(caplog):
    ttl = 0.6
    with (
        caplog.at_level(logging.DEBUG, logger="django_taskclaim.locks"),
        LeaseLock("cadence", ttl, auto_renew=True) as lock,
    ):
        started = time.monotonic()
        wait_for(lambda: time.monotonic() - started >= 4 * ttl, what="four ttls")
        assert lock.held
    renewed = [r for r in caplog.records if r.getMessage().startswith("lease renewed")]
    assert len(renewed) >= 4 * 3 - 1, f"{len(renewed)} renewals in four ttls"


def test_lost_stays_lost_when_an_inflight_renewal_returns_after_it_was_read():
    """A renewal sent in time that lands after the local deadline: ``lost`` read True while
    it was in flight must not turn False when it returns."""
    lock = LeaseLock("sticky", 0.5)
    assert lock.acquire()
    sent, release = threading.Event(), threading.Event()
    real = lock._statement

    def slow_statement(step):
        sent.set()
        release.wait(10)
        return real(step)

    lock._statement = slow_statement  # type: ignore[method-assign]
    result: dict[str, bool] = {}

    def renew() -> None:
        try:
            result["ok"] = lock.renew()
        finally:
            connections.close_all()

    renewing = threading.Thread(target=renew)
    renewing.start()
    try:
        wait_for(sent.is_set, what="the renewal to be sent")
        wait_for(lambda: lock.lost, timeout=5, what="the deadline to pass")
        assert lock.cancel_flag.is_set()
    finally:
        release.set()
        renewing.join(10)
    assert result["ok"] is False
    assert lock.lost
    assert not lock.held
    assert lock.cancel_flag.is_set()
    with pytest.raises(LockLost):
        lock.check()
    lock.release()
    again = LeaseLock("sticky", 30)
    wait_for(again.acquire, timeout=10, what="the lease to end at its ttl")
    again.release()
