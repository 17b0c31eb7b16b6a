"""Advisory locks: PostgreSQL advisory locks and MySQL/MariaDB ``GET_LOCK``.

Exclusion is observed from a second, independent database connection.
"""

from __future__ import annotations

import logging
import subprocess
import threading
import time
from typing import Any

import pytest
from django.db import connection, transaction
from django.test import override_settings

from django_taskclaim import LockNotAcquired
from django_taskclaim.locks import (
    LockLost,
    LockUsageError,
    advisory,
    advisory_key,
    mysql_lock_name,
    normalize_key,
)
from tests.support.helpers import PYTHON, ROOT, wait_for
from tests.support.testapp.models import Ledger

pytestmark = pytest.mark.django_db(transaction=True)

# Computed once and pinned: the hash must never change between releases or Pythons.
PINNED = {
    "taskclaim": 6617020046603809678,
    "daily-report": 2067039765893743488,
    "ключ": -4366948582326390670,
}


class Other:
    """A second, independent connection to the test database (autocommit)."""

    def __init__(self) -> None:
        params = connection.get_connection_params()
        self.raw: Any = connection.get_new_connection(params)
        if connection.vendor == "mysql":
            self.raw.autocommit(True)
        else:
            self.raw.autocommit = True

    def scalar(self, sql: str, params: tuple[Any, ...] = ()) -> Any:
        cur = self.raw.cursor()
        try:
            cur.execute(sql, params)
            row = cur.fetchone()
            return row[0] if row else None
        finally:
            cur.close()

    def can_lock(self, key: object) -> bool:
        """Whether an exclusive lock on ``key`` could be taken now (and give it back)."""
        if connection.vendor == "mysql":
            return bool(self.scalar("SELECT IS_FREE_LOCK(%s)", (mysql_lock_name(key),)))
        norm = normalize_key(key)
        args = (
            "CAST(%s AS bigint)" if len(norm) == 1 else "CAST(%s AS integer), CAST(%s AS integer)"
        )
        got = self.scalar(f"SELECT pg_try_advisory_lock({args})", norm)
        if got:
            self.scalar(f"SELECT pg_advisory_unlock({args})", norm)
        return bool(got)

    def can_lock_shared(self, key: object) -> bool:
        norm = normalize_key(key)
        got = self.scalar("SELECT pg_try_advisory_lock_shared(CAST(%s AS bigint))", norm)
        if got:
            self.scalar("SELECT pg_advisory_unlock_shared(CAST(%s AS bigint))", norm)
        return bool(got)

    def hold(self, key: object) -> None:
        if connection.vendor == "mysql":
            assert self.scalar("SELECT GET_LOCK(%s, 0)", (mysql_lock_name(key),)) == 1
        else:
            assert self.scalar(
                "SELECT pg_try_advisory_lock(CAST(%s AS bigint))", normalize_key(key)
            )

    def close(self) -> None:
        self.raw.close()


@pytest.fixture
def other():
    if connection.vendor == "sqlite":
        pytest.skip("SQLite has no advisory locks (tested in test_sqlite_points_to_lease_locks)")
    conn = Other()
    yield conn
    conn.close()


def pg_only():
    if connection.vendor != "postgresql":
        pytest.skip(f"PostgreSQL only (running on {connection.vendor})")


# ------------------------------------------------------------------ exclusion


def test_transaction_scope_excludes_and_ends_with_the_block(other):
    with advisory("nightly") as got:
        assert got is True
        assert connection.in_atomic_block  # the block is one transaction
        assert not other.can_lock("nightly")
    assert other.can_lock("nightly")


def test_transaction_scope_inside_callers_atomic_lasts_until_commit(other):
    pg_only()
    with transaction.atomic():
        with advisory(42):
            pass
        assert not other.can_lock(42), "an xact lock is held until the caller commits"
    assert other.can_lock(42)


def test_session_scope_excludes_and_is_released_at_block_end(other):
    with advisory((7, 9), xact=False):
        assert not connection.in_atomic_block
        assert not other.can_lock((7, 9))
    assert other.can_lock((7, 9))


def test_session_locks_are_reentrant(other):
    with advisory("re", xact=False):
        with advisory("re", xact=False, wait=False) as inner:
            assert inner is True, "the same session may take its own lock again"
        # the inner exit released one of two holds: still ours
        assert not other.can_lock("re")
    assert other.can_lock("re")


def test_xact_locks_are_reentrant_within_one_transaction(other):
    pg_only()
    with advisory("rex"), advisory("rex", wait=False) as inner:
        assert inner is True
    assert other.can_lock("rex")


def test_shared_mode_admits_shared_and_blocks_exclusive(other):
    pg_only()
    with advisory("reads", shared=True):
        assert other.can_lock_shared("reads")
        assert not other.can_lock("reads")
    assert other.can_lock("reads")


def test_key_is_visible_in_pg_locks_under_advisory_key():
    pg_only()
    with advisory("daily-report"), connection.cursor() as cursor:
        cursor.execute(
            "SELECT (classid::bigint << 32) | objid::bigint FROM pg_locks "
            "WHERE locktype = 'advisory' AND objsubid = 1 AND pid = pg_backend_pid()"
        )
        (unsigned,) = cursor.fetchone()
    signed = unsigned - 2**64 if unsigned >= 2**63 else unsigned
    assert signed == advisory_key("daily-report") == PINNED["daily-report"]


# ------------------------------------------------------------- not acquired


def test_try_and_outcomes_when_held_elsewhere(other):
    other.hold("busy")
    with advisory("busy", wait=False, on_fail="return") as got:
        assert got is False
    with pytest.raises(LockNotAcquired, match="held elsewhere"), advisory("busy", wait=False):
        pass  # pragma: no cover - not entered
    with pytest.raises(LockUsageError, match="skip"), advisory("busy", on_fail="skip"):
        pass  # pragma: no cover - refused before entering


def test_timeout_gives_up_after_the_timeout(other):
    other.hold("slow")
    started = time.monotonic()
    with pytest.raises(LockNotAcquired, match="timed out"), advisory("slow", timeout=0.3):
        pass  # pragma: no cover
    assert time.monotonic() - started >= 0.25


def test_timeout_acquires_when_released_in_time(other):
    pg_only()
    other.hold("soon")
    key = normalize_key("soon")[0]

    def release_once_we_wait() -> None:
        wait_for(
            lambda: other.scalar(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
                "AND ((classid::bigint << 32) | objid::bigint) = %s",
                (key,),
            ),
            timeout=10,
            what="the timed wait to start",
        )
        other.scalar("SELECT pg_advisory_unlock(CAST(%s AS bigint))", (key,))

    releaser = threading.Thread(target=release_once_we_wait)
    releaser.start()
    try:
        with advisory("soon", timeout=30) as got:
            assert got is True
            assert not other.can_lock("soon")
    finally:
        releaser.join()


def test_timeout_does_not_poison_the_callers_transaction(other):
    pg_only()
    other.hold("poison")
    with transaction.atomic():
        Ledger.objects.create(task_id=1, token=1, worker="before")
        with advisory("poison", timeout=0.1, on_fail="return") as got:
            assert got is False
        # the transaction is still usable and commits what it wrote
        Ledger.objects.create(task_id=2, token=1, worker="after")
    assert sorted(Ledger.objects.values_list("worker", flat=True)) == ["after", "before"]


def test_timeout_restores_lock_timeout_after_success():
    pg_only()
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL lock_timeout = '7s'")
        with advisory("restore", timeout=2):
            cursor.execute("SHOW lock_timeout")
            assert cursor.fetchone()[0] == "7s"


def test_decorator_uses_the_dotted_path_and_skips_when_held(other, caplog):
    calls = []

    @advisory(wait=False, on_fail="skip")
    def nightly_report():
        calls.append(1)
        return "done"

    dotted = f"{__name__}.{nightly_report.__qualname__}"
    assert nightly_report() == "done"
    other.hold(dotted)
    with caplog.at_level(logging.INFO, logger="django_taskclaim.locks"):
        assert nightly_report() is None
    assert calls == [1]
    assert f"call skipped key={dotted}" in caplog.text


def test_bare_decorator_runs_under_the_lock(other):
    @advisory
    def job():
        return other.can_lock(f"{__name__}.{job.__qualname__}")

    assert job() is False  # while it ran, nobody else could lock its key


# --------------------------------------------------------- lost connections


def _kill(other: Other, vendor: str, conn_id: int) -> None:
    if vendor == "mysql":
        other.scalar(f"KILL CONNECTION {int(conn_id)}")
    else:
        assert other.scalar("SELECT pg_terminate_backend(%s)", (conn_id,))


def _my_id() -> int:
    with connection.cursor() as cursor:
        pid = "CONNECTION_ID()" if connection.vendor == "mysql" else "pg_backend_pid()"
        cursor.execute(f"SELECT {pid}")
        return int(cursor.fetchone()[0])


def test_session_lock_lost_with_its_connection_is_detected_on_release(other):
    vendor = connection.vendor
    with pytest.raises(LockLost, match="lost with its connection"), advisory("fragile", xact=False):  # noqa: PT012
        _kill(other, vendor, _my_id())
        # the server dropped the session and its lock: others can take it
        wait_for(lambda: other.can_lock("fragile"), timeout=10, what="the lock to vanish")
    # the library dropped the dead connection; the next query reconnects
    assert Ledger.objects.count() == 0
    with advisory("fragile", xact=False):
        assert not other.can_lock("fragile")


def test_session_lock_on_a_replaced_connection_is_lost(other):
    with pytest.raises(LockLost, match="closed or replaced"), advisory("replaced", xact=False):  # noqa: PT012
        connection.close()
        connection.ensure_connection()
    assert other.can_lock("replaced")


# ---------------------------------------------------------- pooler / vendors


@override_settings(TASKCLAIM_POOLER_MODE="transaction")
def test_transaction_pooler_refuses_session_scope_but_not_xact(other):
    pg_only()
    with pytest.raises(LockUsageError, match="transaction pooler"), advisory("s", xact=False):
        pass  # pragma: no cover
    assert other.can_lock("s")  # nothing was locked
    with advisory("s") as got:
        assert got
        assert not other.can_lock("s")


def test_mysql_rejects_shared_mode_and_xact_inside_atomic():
    if connection.vendor != "mysql":
        pytest.skip(f"MySQL/MariaDB only (running on {connection.vendor})")
    with pytest.raises(LockUsageError, match="no shared mode"), advisory("k", shared=True):
        pass  # pragma: no cover
    with transaction.atomic():
        with pytest.raises(LockUsageError, match="transaction-scoped"), advisory("k"):
            pass  # pragma: no cover
        Ledger.objects.create(task_id=1, token=1)  # the transaction is intact
    assert Ledger.objects.count() == 1
    with transaction.atomic(), advisory("k", xact=False) as got:
        assert got is True


def test_sqlite_points_to_lease_locks():
    if connection.vendor != "sqlite":
        pytest.skip(f"SQLite only (running on {connection.vendor})")
    with pytest.raises(LockUsageError, match="LeaseLock"), advisory("k"):
        pass  # pragma: no cover


# ----------------------------------------------------------------- keys / input


def test_string_keys_are_pinned_and_stable_across_processes():
    names = list(PINNED)
    assert [advisory_key(n) for n in names] == list(PINNED.values())
    code = (
        "import sys; from django_taskclaim.locks import advisory_key; "
        "print(*[advisory_key(n) for n in sys.argv[1:]])"
    )
    out = subprocess.run(
        [PYTHON, "-c", code, *names],
        cwd=ROOT,
        env={"PYTHONHASHSEED": "12345", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert [int(v) for v in out.stdout.split()] == list(PINNED.values())


def test_string_keys_equal_the_documented_sql_recipe():
    names = [*PINNED, "x" * 300, "a b\tc", "😀 emoji", "0"]
    if connection.vendor == "postgresql":
        recipe = "SELECT ('x' || substr(md5(%s), 1, 16))::bit(64)::bigint"
    elif connection.vendor == "mysql":
        recipe = "SELECT CAST(CONV(LEFT(MD5(%s), 16), 16, 10) AS SIGNED)"
    else:
        pytest.skip("the SQL recipe is for PostgreSQL and MySQL/MariaDB")
    with connection.cursor() as cursor:
        for name in names:
            cursor.execute(recipe, (name,))
            assert int(cursor.fetchone()[0]) == advisory_key(name), name


@pytest.mark.parametrize(
    ("key", "kwargs", "message"),
    [
        ("", {}, "must not be empty"),
        (2**63, {}, "out of the signed 64-bit range"),
        (-(2**63) - 1, {}, "out of the signed 64-bit range"),
        ((2**31, 1), {}, "32-bit"),
        ((1, "a"), {}, "two integers"),
        ((1, 2, 3), {}, "non-empty string"),
        (True, {}, "bool"),
        (1.5, {}, "non-empty string"),
        ("k", {"timeout": -1}, ">= 0"),
        ("k", {"timeout": float("nan")}, ">= 0"),
        ("k", {"timeout": 1, "wait": False}, "timeout needs wait=True"),
        ("k", {"on_fail": "ignore"}, "on_fail"),
    ],
)
def test_bad_input_is_a_clear_error(key, kwargs, message):
    with pytest.raises(LockUsageError, match=message):
        advisory(key, **kwargs)


def test_extreme_int_keys_are_accepted(other):
    for key in (2**63 - 1, -(2**63), 0, (-(2**31), 2**31 - 1)):
        with advisory(key) as got:
            assert got is True
            assert not other.can_lock(key)


def test_mysql_lock_names_are_scoped_to_the_database():
    if connection.vendor != "mysql":
        pytest.skip(f"MySQL/MariaDB only (running on {connection.vendor})")
    name = mysql_lock_name("daily-report")
    assert name == f"tc:{connection.settings_dict['NAME']}:{PINNED['daily-report']}"
    assert len(mysql_lock_name((-(2**31), -(2**31)))) <= 64
    with advisory("daily-report", xact=False), connection.cursor() as cursor:
        cursor.execute("SELECT IS_USED_LOCK(%s) = CONNECTION_ID()", (name,))
        assert cursor.fetchone()[0] == 1
