"""Locks that tell the holder the truth, first: deadlines, blocked statements, bad input,
threads sharing one advisory lock, nesting, and errors that never mask the block's own."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import DatabaseError, connection, connections, transaction
from django.db.models import F

from django_taskclaim.locks import (
    LeaseLock,
    LockLost,
    LockUsageError,
    advisory,
    safety_margin,
    singleton,
)
from django_taskclaim.models import Lease
from tests.support.helpers import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def skip_without_row_locks() -> None:
    if connection.vendor == "sqlite":
        pytest.skip("SQLite has no row locks (one writer at a time)")


def row_locker(key: str):
    """A thread holding the Lease row of ``key`` locked (SELECT … FOR UPDATE) until the
    returned event is set: every statement on that row waits meanwhile."""
    skip_without_row_locks()
    locked, release = threading.Event(), threading.Event()

    def hold() -> None:
        try:
            with transaction.atomic():
                Lease.objects.select_for_update().get(key=key)
                locked.set()
                release.wait(60)
        finally:
            connections.close_all()

    t = threading.Thread(target=hold, daemon=True)
    t.start()
    wait_for(locked.is_set, timeout=10, what="the row lock")
    return release, t


def test_a_lease_taken_after_waiting_longer_than_its_ttl_is_not_reported_held():
    """Expiry counts from the write, and the holder from the send: a statement that waited
    past the ttl on the row's lock does not return True for a lease about to end."""
    first = LeaseLock("waited", 30)
    assert first.acquire()
    first.release()  # the row exists, free
    release, locker = row_locker("waited")
    result: dict[str, object] = {}
    lock = LeaseLock("waited", 0.3)
    started = time.monotonic()

    def take() -> None:
        try:
            result["got"] = lock.acquire()
        finally:
            connections.close_all()

    t = threading.Thread(target=take)
    t.start()
    wait_for(
        lambda: time.monotonic() - started > 0.6, timeout=5, what="the wait to outlast the ttl"
    )
    release.set()
    t.join(10)
    locker.join(10)
    assert result["got"] is False
    assert not lock.held
    other = LeaseLock("waited", 30)
    assert other.acquire(), "a lease reported not acquired must not block the next owner"


def test_held_turns_false_before_anyone_else_can_take_it_even_if_renewal_hangs():
    """A renewer whose statement never answers (here: it waits on a row lock) does not keep
    the holder believing: held turns False at send + ttl - margin, before the lease can
    be taken, and leaving the block does not hang on the renewer."""
    skip_without_row_locks()  # before the renewer starts: a skip must not leak its thread
    lock = LeaseLock("hung", 1.0, auto_renew=0.2)
    before = time.monotonic()  # no later than the send of the acquiring statement
    lock.__enter__()
    entered = time.monotonic()  # no earlier than it
    deadline = lock.state.deadline
    renewer = lock._renewer
    assert renewer is not None
    release, locker = row_locker("hung")
    try:
        wait_for(lambda: not lock.held, timeout=5, what="held to turn False")
        assert lock.state.deadline == deadline  # no renewal landed: the hung one changed nothing
        assert lock.lost
        with pytest.raises(LockLost, match="was lost"):
            lock.check()
        exit_started = time.monotonic()
        with pytest.raises(LockLost, match="lost before the block ended"):
            lock.__exit__(None, None, None)
        assert time.monotonic() - exit_started < 3, "__exit__ waited on the hung renewer"
    finally:
        release.set()
        locker.join(10)
        # Its statement answers once the row lock goes: the renewer must then end, not
        # outlive the test (a leaked thread would touch the next test's database).
        renewer.join(30)
    assert not renewer.is_alive()
    # The holder knew before the lease could end (send + ttl): ``held`` is False from the
    # local deadline on (``LeaseState.held``), and that deadline comes a safety margin
    # before send + ttl. Read from the lock, not from when a poll noticed (a late poll
    # measured the machine's load, not the lock): the deadline is counted from the send
    # (between ``before`` and ``entered``; 50 ms allowed for what runs before the send),
    # not from the reply.
    assert deadline <= entered + 1.0 - safety_margin(1.0)
    assert deadline - before < 1.0 - safety_margin(1.0) + 0.05
    taker = LeaseLock("hung", 30)
    wait_for(taker.acquire, timeout=10, what="the lease to become free")


def test_auto_renew_inside_the_callers_transaction_is_refused():
    @singleton("in-atomic", ttl=30)
    def job():
        return "ran"  # pragma: no cover - refused before

    with transaction.atomic():
        with pytest.raises(LockUsageError, match="atomic"):
            job()
        with (
            pytest.raises(LockUsageError, match="atomic"),
            LeaseLock("in-atomic", 30, auto_renew=True),
        ):
            pass  # pragma: no cover
    assert job() == "ran"  # outside a transaction it runs


def test_nested_with_on_one_lease_lock_is_refused():
    lock = LeaseLock("nested", 30)

    def nest() -> None:
        with lock, lock:
            pass  # pragma: no cover

    with pytest.raises(LockUsageError, match="nested"):
        nest()
    assert not lock.held  # the outer block released on its way out
    assert LeaseLock("nested", 30).acquire()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"ttl": 1e300}, "ttl must be from"),
        ({"ttl": 1e-9}, "ttl must be from"),
        ({"ttl": float("inf")}, "ttl must be a finite number"),
        ({"ttl": 30, "auto_renew": 1e-6}, "auto_renew is"),
        ({"ttl": 30, "auto_renew": float("nan")}, "auto_renew is"),
        ({"ttl": 30, "owner": "a\x00b"}, "owner must be"),
    ],
)
def test_absurd_lease_options_are_usage_errors(kwargs, message):
    with pytest.raises(LockUsageError, match=message):
        LeaseLock("opts", **kwargs)


def test_a_nul_in_a_lease_key_is_a_usage_error():
    with pytest.raises(LockUsageError, match="NUL"):
        LeaseLock("a\x00b", 30)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"shared": "no"}, "shared is True or False"),
        ({"xact": 1}, "xact is True or False"),
        ({"timeout": 3e6}, "timeout is at most"),
    ],
)
def test_absurd_advisory_options_are_usage_errors(kwargs, message):
    with pytest.raises(LockUsageError, match=message):
        advisory("opts", **kwargs)


def test_check_asks_the_database_without_a_renewer():
    """A lease broken by an operator (the admin's "break" action) is noticed by check()."""
    lock = LeaseLock("broken", 30)
    assert lock.acquire()
    lock.check()
    Lease.objects.filter(key="broken").update(token=F("token") + 1)
    with pytest.raises(LockLost):
        lock.check()


def test_a_failed_release_never_masks_the_blocks_exception_and_resets_the_connection():
    if connection.vendor != "postgresql":
        pytest.skip("pg_terminate_backend is PostgreSQL's")
    lock = LeaseLock("dying", 30)

    def body() -> None:
        with lock:
            try:  # the connection dies under the block
                with connection.cursor() as cursor:
                    cursor.execute("SELECT pg_terminate_backend(pg_backend_pid())")
            except DatabaseError:
                pass
            raise ValueError("the block's own error")

    with pytest.raises(ValueError, match="the block's own error"):
        body()
    # the broken connection was reset: the next lock in this thread works
    with LeaseLock("after", 30) as again:
        assert again.held


def test_one_session_advisory_lock_object_shared_by_two_threads():
    """A module-level advisory(xact=False) used by two threads: each thread's enter and
    exit pair up; neither removes the other's state, both locks are released."""
    if connection.vendor not in ("postgresql", "mysql"):
        pytest.skip("advisory locks need PostgreSQL or MySQL/MariaDB")
    shared_lock = advisory("shared-object", xact=False)
    order: list[str] = []
    inside = threading.Event()
    done = threading.Event()
    errors: list[BaseException] = []

    def first() -> None:
        try:
            with shared_lock:
                order.append("first in")
                inside.set()
                done.wait(10)
                # The last act under the lock: once it is released, the second thread may
                # run before this one appends anything more.
                order.append("first leaving")
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    def second() -> None:
        try:
            with shared_lock:  # waits until the first thread releases
                order.append("second in")
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    a = threading.Thread(target=first)
    a.start()
    wait_for(inside.is_set, timeout=10, what="the first thread inside")
    b = threading.Thread(target=second)
    b.start()
    done.set()
    a.join(20)
    b.join(20)
    assert not errors, errors
    assert order == ["first in", "first leaving", "second in"]
    with advisory("shared-object", xact=False, wait=False, on_fail="return") as free:
        assert free is True


def test_mysql_sessions_in_different_time_zones_never_share_a_lease():
    """Lease times are UTC_TIMESTAMP(6): a holder in +02:00 and a contender in -05:00 (or
    a server crossing a daylight-saving change) agree on when the lease ends."""
    if connection.vendor != "mysql":
        pytest.skip("session time zones are a MySQL/MariaDB matter")
    with connection.cursor() as cursor:
        cursor.execute("SET time_zone = '-05:00'")
    try:
        holder = LeaseLock("zoned", 60)
        assert holder.acquire()
        result: dict[str, object] = {}

        def contend() -> None:
            try:
                with connection.cursor() as cursor:
                    cursor.execute("SET time_zone = '+02:00'")
                result["got"] = LeaseLock("zoned", 60).acquire()
            finally:
                connections.close_all()

        t = threading.Thread(target=contend)
        t.start()
        t.join(30)
        assert result["got"] is False, "a session in another zone took a valid lease"
        assert holder.renew()
        holder.check()
    finally:
        connections["default"].close()


@pytest.mark.parametrize(("a", "b"), [("Report", "report"), ("job", "job "), ("a", "ä")])
def test_lease_keys_that_differ_only_in_case_spaces_or_accents_are_two_leases(a, b):
    """On MySQL/MariaDB the key column compares byte for byte (a binary NO PAD collation);
    elsewhere text compares exactly anyway."""
    first, second = LeaseLock(a, 30), LeaseLock(b, 30)
    assert first.acquire()
    assert second.acquire(), f"{b!r} was taken as the same lease as {a!r}"
    assert {first.token, second.token} == {1}
    assert Lease.objects.filter(key__in=[a, b]).count() == 2
