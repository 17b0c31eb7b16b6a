"""``singleton()``: run where the lock was won, skip (and say so) elsewhere."""

from __future__ import annotations

import logging

import pytest
from django.db import connection
from django.db.models import F

from django_taskclaim import SKIPPED, LeaseLock, singleton
from django_taskclaim.db import DbNow
from django_taskclaim.locks import LockLost, LockUsageError
from django_taskclaim.models import Lease
from tests.support.helpers import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def test_runs_where_won_and_releases():
    @singleton("daily-report", ttl=30)
    def report(n):
        assert Lease.objects.filter(key="daily-report", locked_until__gt=DbNow()).exists()
        return n * 2

    assert report(21) == 42
    assert Lease.objects.filter(key="daily-report", locked_until__lte=DbNow()).exists()
    assert report(1) == 2  # released, so the next call wins again
    assert Lease.objects.get(key="daily-report").token == 2


def test_skips_and_says_so_where_held_elsewhere(caplog):
    calls = []

    @singleton(ttl=30)
    def nightly():
        calls.append(1)

    key = f"{__name__}.{nightly.__qualname__}"
    with LeaseLock(key, 30), caplog.at_level(logging.INFO, logger="django_taskclaim.locks"):
        result = nightly()
    assert result is SKIPPED
    assert not result
    assert calls == []
    assert f"singleton skipped key={key} backend=lease" in caplog.text


def test_bare_decorator_uses_the_dotted_path():
    @singleton
    def job():
        return Lease.objects.get().key

    assert job() == f"{__name__}.{job.__qualname__}"


def test_an_error_propagates_and_the_lease_is_released():
    @singleton("boom", ttl=30)
    def boom():
        raise ValueError("bad input file")

    with pytest.raises(ValueError, match="bad input file"):
        boom()
    assert LeaseLock("boom", 30).acquire()


def test_a_lease_lost_while_running_is_reported():
    @singleton("stolen", ttl=30)
    def work():
        # somebody takes the lease over (as after an expiry): the holder is fenced
        Lease.objects.filter(key="stolen").update(token=F("token") + 1, owner="intruder")

    with pytest.raises(LockLost, match="lost before the block ended"):
        work()
    assert Lease.objects.get(key="stolen").owner == "intruder"


def test_background_renewal_notices_a_takeover():
    with pytest.raises(LockLost), LeaseLock("watched", 3, auto_renew=0.05) as lock:  # noqa: PT012
        Lease.objects.filter(key="watched").update(token=F("token") + 1)
        wait_for(lambda: lock.lost, timeout=10, what="the renewer to notice")
        with pytest.raises(LockLost, match="was lost"):
            lock.check()


def test_advisory_backend_skips_where_held():
    if connection.vendor == "sqlite":
        with pytest.raises(LockUsageError, match="lease"):
            singleton("adv", backend="advisory")(lambda: 1)()
        return
    from tests.locks.test_locks_advisory import Other

    other = Other()
    try:

        @singleton("adv", backend="advisory")
        def job():
            return "ran"

        assert job() == "ran"
        other.hold("adv")
        assert job() is SKIPPED
    finally:
        other.close()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"backend": "redis"}, 'lease" or "advisory'),
        ({"ttl": -1}, "ttl must be > 0"),
        ({"ttl": 0}, "ttl must be > 0"),
    ],
)
def test_bad_input_is_a_clear_error(kwargs, message):
    with pytest.raises(LockUsageError, match=message):
        singleton("k", **kwargs)


def test_bad_keys_are_clear_errors():
    with pytest.raises(LockUsageError, match="must not be empty"):
        singleton("", ttl=1)
    with pytest.raises(LockUsageError, match="out of the signed 64-bit range"):
        singleton(2**64, backend="advisory")
