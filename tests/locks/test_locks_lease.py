"""Lease locks on the ``taskclaim.Lease`` table: every database, real connections."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_taskclaim import LockNotAcquired
from django_taskclaim.db import DbNow
from django_taskclaim.locks import LeaseLock, LockLost, LockUsageError, lease_lock
from django_taskclaim.models import Lease
from tests.support.helpers import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def expired(key: str) -> bool:
    """Whether the lease row of ``key`` has ended on the database clock."""
    return Lease.objects.filter(key=key, locked_until__lte=DbNow()).exists()


def test_acquire_excludes_and_release_frees():
    a = LeaseLock("report", 30, owner="a")
    b = LeaseLock("report", 30, owner="b")
    assert a.acquire() is True
    assert a.token == 1
    assert b.acquire() is False
    assert b.token is None
    row = Lease.objects.get(key="report")
    assert (row.owner, row.token) == ("a", 1)
    assert a.renew() is True
    assert a.release() is True
    assert a.token is None
    assert b.acquire() is True
    assert b.token == 2  # the row is reused: tokens keep growing across holders
    assert Lease.objects.get(key="report").owner == "b"
    assert b.release() is True
    assert a.release() is False  # nothing held any more


def test_each_operation_is_one_statement_on_postgres_and_sqlite(vendor):
    lock = LeaseLock("one-statement", 30)
    expected = 3 if vendor == "mysql" else 1  # MySQL: stamp, upsert, read-back
    with CaptureQueriesContext(connection) as ctx:
        assert lock.acquire()
    assert len(ctx.captured_queries) == expected, ctx.captured_queries
    # MySQL's clock is fixed at a statement's start: renew reads the new end back to
    # check it is still in the future (the UPDATE may have waited on the row's lock).
    for op, statements in ((lock.renew, 2 if vendor == "mysql" else 1), (lock.release, 1)):
        with CaptureQueriesContext(connection) as ctx:
            assert op()
        assert len(ctx.captured_queries) == statements, ctx.captured_queries


def test_a_renewal_may_name_its_own_ttl():
    """``renew(ttl)`` moves the end to ``now() + ttl`` for that renewal only (the reap
    lock is held briefly while reaping, then until the next reap is due)."""
    lock = LeaseLock("brief-then-long", 5, owner="a")
    assert lock.acquire()

    def left() -> float:
        row = Lease.objects.annotate(clock=DbNow()).values_list("locked_until", "clock")
        until, now = row.get(key="brief-then-long")
        return (until - now).total_seconds()

    assert left() <= 5
    assert lock.renew(600) is True
    assert 590 < left() <= 600
    assert lock.seconds_left > 500
    assert lock.renew() is True  # the lock's own ttl again
    assert left() <= 5
    with pytest.raises(LockUsageError):
        lock.renew(float("nan"))


def test_takeover_after_expiry_fences_the_old_holder():
    old = LeaseLock("files", 1.0, owner="old")
    new = LeaseLock("files", 30, owner="new")
    assert old.acquire()
    assert not new.acquire()
    wait_for(lambda: expired("files"), timeout=10, what="the short lease to end")
    assert new.acquire(), "an expired lease must be taken over"
    assert new.token == old.token + 1
    before = Lease.objects.values("owner", "token", "locked_until").get(key="files")
    assert old.renew() is False
    assert old.lost is True
    assert old.release() is False
    after = Lease.objects.values("owner", "token", "locked_until").get(key="files")
    assert after == before, "a fenced holder must change nothing"
    assert new.renew() is True


def test_a_lease_past_its_deadline_is_not_renewed_but_can_be_taken_again():
    """Past its local deadline the holder no longer holds it (someone may), so renew()
    refuses; acquire() takes it anew with a new token."""
    lock = LeaseLock("lazy", 1.0)
    assert lock.acquire()
    wait_for(lambda: expired("lazy"), timeout=10, what="the lease to end")
    assert not lock.held
    assert lock.lost
    assert lock.renew() is False
    assert lock.acquire() is True
    assert lock.token == 2
    assert lock.held
    assert not expired("lazy")


def test_context_manager_raises_when_held_elsewhere():
    with LeaseLock("ctx", 30) as held:
        assert held.token == 1
        with pytest.raises(LockNotAcquired, match="held by another owner"), LeaseLock("ctx", 30):
            pass  # pragma: no cover - never entered
    # released on exit: the next one gets it at once
    with lease_lock("ctx", 30) as again:
        assert again.token == 2


def test_context_manager_reports_a_lost_lease_on_exit():
    # 1 s, not less: a statement slower than the lease (a loaded machine) gives it back.
    slow = LeaseLock("lost", 1.0, owner="slow")
    with pytest.raises(LockLost, match="was lost before the block ended"), slow:  # noqa: PT012
        wait_for(lambda: expired("lost"), timeout=10, what="the lease to end")
        assert LeaseLock("lost", 30, owner="fast").acquire()
    assert Lease.objects.get(key="lost").owner == "fast"


def test_background_renewal_keeps_a_long_block_covered():
    with LeaseLock("long", 1.0, auto_renew=0.1) as lock:
        first_end = Lease.objects.get(key="long").locked_until
        # The block outlives its first lease end; the renewer keeps moving the end.
        wait_for(
            lambda: (
                Lease.objects.filter(key="long", acquired_at__lt=DbNow()).exists()
                and Lease.objects.annotate(now=DbNow())
                .filter(key="long", now__gt=first_end + timedelta(seconds=0.5))
                .exists()
            ),
            timeout=20,
            what="the database clock to pass the first lease end",
        )
        assert not expired("long")
        assert not LeaseLock("long", 30).acquire()
        assert lock.held
    assert expired("long")  # released on exit
    assert not any(t.name.startswith("taskclaim-lease-") for t in threading.enumerate())


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"key": ""}, "must not be empty"),
        ({"key": "x" * 256}, "at most 255"),
        ({"key": 5}, "lease key is a string"),
        ({"key": "k", "ttl": 0}, "ttl must be > 0"),
        ({"key": "k", "ttl": -1}, "ttl must be > 0"),
        ({"key": "k", "ttl": True}, "ttl must be a number of seconds"),
        ({"key": "k", "ttl": 1, "owner": ""}, "owner must be"),
        ({"key": "k", "ttl": 1, "auto_renew": 5}, "below ttl"),
    ],
)
def test_bad_input_is_a_clear_error(kwargs, message):
    with pytest.raises(LockUsageError, match=message):
        LeaseLock(**kwargs)
    assert not Lease.objects.exists()
