"""The lease lock of ``django_taskclaim/locks/lease.py`` on the ``taskclaim.Lease`` table, at the
points the lease tests do not look (docs/testing.md, "Mutation testing"): the ttl and
renewal interval it accepts (at their bounds), its owner and database, the local deadline
counted from the statement's send (on a fake monotonic clock, so that no test waits for
it), who holds the row after each call, a release that fails or finds the lease taken,
``check()`` against a lease broken in the database, and the context manager's refusals.
"""

from __future__ import annotations

import logging
import re
from datetime import timedelta

import pytest
from django.db import DatabaseError, connection, transaction
from django.test.utils import override_settings

from django_taskclaim import LockNotAcquired
from django_taskclaim.locks import LeaseLock, LockLost, LockUsageError, lease
from django_taskclaim.locks.lease import validate_ttl
from django_taskclaim.locks.state import LeaseState
from django_taskclaim.models import Lease

pytestmark = pytest.mark.django_db(transaction=True)


class Clock:
    """A monotonic clock the test moves: the lock's local deadline without waiting."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(lease, "time", fake)
    return fake


def holder(key: str) -> tuple[str, int] | None:
    row = Lease.objects.filter(key=key).values_list("owner", "token").first()
    return None if row is None else tuple(row)


def seconds_to_end(key: str) -> float:
    """Seconds from the database's clock to the lease's end."""
    from django_taskclaim.db import DbNow

    until, now = (
        Lease.objects.annotate(clock=DbNow()).values_list("locked_until", "clock").get(key=key)
    )
    return (until - now).total_seconds()


# -- ttl, renewal interval, owner, database -------------------------------------------------


def test_ttl_defaults_to_the_lease_setting_and_takes_a_timedelta():
    with override_settings(TASKCLAIM_LEASE=42):
        assert validate_ttl(None) == 42.0
        assert LeaseLock("k").ttl == 42.0
    assert validate_ttl(timedelta(seconds=90)) == 90.0
    assert isinstance(validate_ttl(7), float)
    assert validate_ttl(0.05) == 0.05
    with pytest.raises(LockUsageError):
        validate_ttl(0.04)


def test_auto_renew_true_renews_every_quarter_ttl_and_false_never():
    assert LeaseLock("k", 8, auto_renew=True).renew_every == 2.0
    assert LeaseLock("k", 8, auto_renew=False).renew_every is None
    assert LeaseLock("k", 8).renew_every is None


@pytest.mark.parametrize("every", [0.01, 1, 2.0, 3.0])
def test_auto_renew_interval_within_its_bounds_is_kept(every):
    lock = LeaseLock("k", 9, auto_renew=every)
    assert lock.renew_every == every
    assert isinstance(lock.renew_every, float)


@pytest.mark.parametrize("every", [0.009, 3.01, 0, -1, float("nan"), float("inf"), "1"])
def test_auto_renew_interval_out_of_bounds_is_refused(every):
    with pytest.raises(LockUsageError) as info:
        LeaseLock("k", 9, auto_renew=every)
    assert str(info.value) == (
        "auto_renew is True/False or an interval from 0.01 s to ttl/3 = 3 s, well below "
        f"ttl=9 s (a renewal that does not land must be retried in time), got {every!r}"
    )


def test_the_default_owner_is_unique_per_object_and_names_host_and_pid():
    from django_taskclaim.db import default_worker_id

    a, b = LeaseLock("k", 5), LeaseLock("k", 5)
    assert a.owner != b.owner
    assert re.fullmatch(re.escape(default_worker_id()) + r":[0-9a-f]{12}", a.owner)
    assert a.acquire()
    assert holder("k") == (a.owner, 1)
    assert not b.acquire()


@pytest.mark.parametrize("owner", ["", "x" * 256, "a\x00b", 5])
def test_a_bad_owner_is_refused(owner):
    with pytest.raises(LockUsageError) as info:
        LeaseLock("k", 5, owner=owner)
    assert str(info.value) == "owner must be a non-empty string of at most 255 characters"


def test_an_owner_of_255_characters_holds_the_row():
    lock = LeaseLock("k", 5, owner="o" * 255)
    assert lock.acquire()
    assert holder("k") == ("o" * 255, 1)


class ElsewhereRouter:
    def db_for_write(self, model, **hints):
        return "elsewhere" if model is Lease else None


def test_the_database_given_wins_over_the_router():
    with override_settings(DATABASE_ROUTERS=[f"{__name__}.ElsewhereRouter"]):
        assert LeaseLock("k", 5).using == "elsewhere"
        lock = LeaseLock("k", 5, using="default")
    assert lock.using == "default"
    assert LeaseLock("k", 5).using == "default"


def test_repr_names_key_owner_and_token():
    lock = LeaseLock("rep", 5, owner="me")
    assert repr(lock) == "<LeaseLock key='rep' owner='me' token=None>"
    assert lock.acquire()
    assert repr(lock) == "<LeaseLock key='rep' owner='me' token=1>"


# -- the local deadline ---------------------------------------------------------------------


def test_the_deadline_is_the_send_plus_ttl_less_the_margin(clock):
    lock = LeaseLock("dl", 5, owner="a")
    assert lock.seconds_left == 0.0  # not held
    assert lock.acquire()
    assert lock.state.deadline == 1000.0 + 5 - 0.5
    assert lock.seconds_left == 4.5
    clock.now += 4.4
    assert lock.held
    assert lock.seconds_left == pytest.approx(0.1)
    assert not lock.lost
    clock.now += 0.1  # exactly at the deadline: over
    assert not lock.held
    assert lock.lost
    assert lock.seconds_left == 0.0
    assert lock.cancel_flag.is_set()


def test_a_long_ttl_has_a_margin_of_one_second(clock):
    lock = LeaseLock("dl", 60, owner="a")
    assert lock.acquire()
    assert lock.state.deadline == 1000.0 + 59


def test_lost_marks_the_lease_lost_for_good(clock, caplog):
    lock = LeaseLock("dl", 5, owner="a")
    assert not lock.lost  # never taken
    assert lock.acquire()
    clock.now += 10
    with caplog.at_level(logging.WARNING, logger="django_taskclaim.locks"):
        assert lock.lost
        assert lock.lost
    assert lock.state.lost
    assert lock.cancel_flag.is_set()
    lost = [r.getMessage() for r in caplog.records if "lease lost" in r.getMessage()]
    assert lost == [
        "lease lost key=dl owner=a token=1: its deadline passed before a renewal landed"
    ]
    clock.now -= 10  # a clock going back changes nothing: lost stays lost
    assert lock.lost
    assert not lock.held


def test_held_past_the_deadline_marks_lost_and_sets_the_flag(clock):
    lock = LeaseLock("dl", 5, owner="a")
    assert not lock.held
    assert not lock.cancel_flag.is_set()
    assert lock.acquire()
    clock.now += 5
    assert not lock.held
    assert lock.state.lost
    assert lock.cancel_flag.is_set()


def test_a_renewal_moves_the_deadline_from_its_own_send(clock):
    lock = LeaseLock("dl", 5, owner="a")
    assert lock.acquire()
    clock.now += 2
    assert lock.renew() is True
    assert lock.state.deadline == 1002.0 + 4.5
    assert lock.renew(50) is True
    assert lock.state.deadline == 1002.0 + 50 - 1
    assert 45 < seconds_to_end("dl") <= 50
    assert holder("dl") == ("a", 1)  # a renewal keeps the token


def test_a_renewal_past_the_deadline_is_refused_and_writes_nothing(clock):
    lock = LeaseLock("dl", 5, owner="a")
    assert lock.acquire()
    before = Lease.objects.values("locked_until").get(key="dl")
    clock.now += 6
    assert lock.renew() is False
    assert lock.lost
    assert Lease.objects.values("locked_until").get(key="dl") == before


def test_a_renewal_that_returns_after_the_deadline_does_not_revive_the_lease(
    clock, monkeypatch, caplog
):
    lock = LeaseLock("dl", 5, owner="a")
    assert lock.acquire()
    real = LeaseLock._statement

    def slow(self, step):
        out = real(self, step)
        clock.now += 10  # the statement took longer than the lease
        return out

    monkeypatch.setattr(LeaseLock, "_statement", slow)
    with caplog.at_level(logging.WARNING, logger="django_taskclaim.locks"):
        assert lock.renew() is False
    assert lock.lost
    assert lock.cancel_flag.is_set()
    assert [r.getMessage() for r in caplog.records if "lease lost" in r.getMessage()] == [
        "lease lost key=dl owner=a token=1: its renewal returned after its deadline"
    ]


def test_a_renewal_that_returns_exactly_at_the_deadline_does_not_land(clock, monkeypatch):
    lock = LeaseLock("dl", 5, owner="a")
    assert lock.acquire()
    real = LeaseLock._statement

    def slow(self, step):
        out = real(self, step)
        clock.now = lock.state.deadline
        return out

    monkeypatch.setattr(LeaseLock, "_statement", slow)
    assert lock.renew() is False
    assert lock.lost


def test_a_renewal_whose_acquisition_was_replaced_meanwhile_is_not_ours(monkeypatch):
    """The holder's thread released (or took anew) the lease while its renewer's statement
    was out: the renewal answers for the acquisition it was sent for, and never marks the
    new one."""
    lock = LeaseLock("swap", 30, owner="a")
    assert lock.acquire()
    real = LeaseLock._statement

    def replaced(answer):
        def step(self, run):
            out = real(self, run)
            self._lease = LeaseState(token=7, deadline=lock.state.deadline)
            return answer if answer is not None else out

        return step

    monkeypatch.setattr(LeaseLock, "_statement", replaced(None))
    assert lock.renew() is False  # it landed, for token 1: not this acquisition's
    assert (lock.token, lock.lost) == (7, False)
    monkeypatch.undo()
    other = LeaseLock("swap-too", 30, owner="a")
    assert other.acquire()
    lock = other
    monkeypatch.setattr(LeaseLock, "_statement", replaced(False))
    assert other.renew() is False  # token 1 matched nothing: token 7 is not lost for it
    assert (other.token, other.lost) == (7, False)
    assert not other.cancel_flag.is_set()


def test_an_acquire_that_returns_after_the_deadline_gives_the_lease_back(
    clock, monkeypatch, caplog
):
    lock = LeaseLock("late", 5, owner="a")
    real = LeaseLock._statement
    calls = []

    def slow(self, step):
        out = real(self, step)
        calls.append(out)
        if len(calls) == 1:
            clock.now += 4.5  # exactly at the deadline: too late
        return out

    monkeypatch.setattr(LeaseLock, "_statement", slow)
    with caplog.at_level(logging.WARNING, logger="django_taskclaim.locks"):
        assert lock.acquire() is False
    assert lock.token is None
    assert not lock.held
    assert any(
        r.getMessage()
        == "lease acquired too late key=late owner=a token=1: its statement took longer "
        "than ttl=5s; released"
        for r in caplog.records
    )
    # Released in the database too (a second, fenced statement), not left to its ttl:
    # another owner takes it at once, and a `with` says why it was refused.
    assert calls == [1, True]
    monkeypatch.undo()
    assert LeaseLock("late", 5, owner="b").acquire() is True
    late = LeaseLock("late-with", 5, owner="a")
    monkeypatch.setattr(LeaseLock, "_good_until", lambda self, sent, ttl=None: sent)
    with pytest.raises(LockNotAcquired) as info, late:
        pass
    assert str(info.value) == (
        "lease 'late-with' was taken too late (its statement took longer than ttl=5s: a "
        "slow or contended database) and given back"
    )


def test_an_acquire_just_in_time_holds(clock, monkeypatch):
    lock = LeaseLock("late", 5, owner="a")
    real = LeaseLock._statement

    def slow(self, step):
        out = real(self, step)
        clock.now += 4.4
        return out

    monkeypatch.setattr(LeaseLock, "_statement", slow)
    assert lock.acquire() is True
    assert lock.token == 1
    assert holder("late") == ("a", 1)


# -- acquire, renew, release ----------------------------------------------------------------


def test_acquire_while_held_renews_the_same_token():
    lock = LeaseLock("again", 5, owner="a")
    assert lock.acquire()
    assert lock.renew(100)
    assert seconds_to_end("again") > 90
    assert lock.acquire() is True  # renews with the lock's own ttl
    assert lock.token == 1
    assert holder("again") == ("a", 1)
    assert seconds_to_end("again") <= 5


def test_acquire_after_a_loss_takes_a_new_token_and_a_new_flag(clock):
    lock = LeaseLock("again", 5, owner="a")
    assert lock.acquire()
    first = lock.cancel_flag
    Lease.objects.filter(key="again").update(token=7)  # broken by an operator
    assert lock.renew() is False
    assert first.is_set()
    # the row is still leased (to nobody the lock knows): acquire waits for its end
    Lease.objects.filter(key="again").update(locked_until=Lease.objects.get().acquired_at)
    assert lock.acquire() is True
    assert lock.token == 8
    assert lock.cancel_flag is not first
    assert not lock.cancel_flag.is_set()
    assert lock.held


def test_a_busy_acquire_leaves_the_lock_empty_and_logs(caplog):
    a = LeaseLock("busy", 5, owner="a")
    b = LeaseLock("busy", 5, owner="b")
    assert a.acquire()
    with caplog.at_level(logging.DEBUG, logger="django_taskclaim.locks"):
        assert b.acquire() is False
    assert (b.token, b.held, b.lost) == (None, False, False)
    assert "lease busy key=busy owner=b" in [r.getMessage() for r in caplog.records]
    assert holder("busy") == ("a", 1)


def test_renew_of_a_lock_never_taken_or_released_is_false():
    lock = LeaseLock("r", 5, owner="a")
    assert lock.renew() is False
    assert not Lease.objects.exists()
    assert lock.acquire()
    assert lock.release() is True
    assert lock.renew() is False
    assert not lock.held


def test_renew_after_a_takeover_marks_lost_and_changes_nothing(caplog):
    lock = LeaseLock("r", 5, owner="a")
    assert lock.acquire()
    Lease.objects.filter(key="r").update(owner="thief", token=2)
    with caplog.at_level(logging.WARNING, logger="django_taskclaim.locks"):
        assert lock.renew() is False
    assert lock.lost
    assert lock.cancel_flag.is_set()
    assert holder("r") == ("thief", 2)
    assert [r.getMessage() for r in caplog.records if "lease lost" in r.getMessage()] == [
        "lease lost key=r owner=a token=1: taken over: the renewal matched nothing"
    ]
    assert lock.renew() is False  # lost stays lost; no second warning
    assert len([r for r in caplog.records if "lease lost" in r.getMessage()]) == 1


def test_a_bounded_renewal_writes_the_lease_and_keeps_the_token():
    lock = LeaseLock("b", 5, owner="a")
    assert lock.acquire()
    assert lock._renew(lock_wait=1.0, ttl=60) is True
    assert 50 < seconds_to_end("b") <= 60
    assert lock.seconds_left > 50
    assert holder("b") == ("a", 1)
    Lease.objects.filter(key="b").update(token=5)
    assert lock._renew(lock_wait=1.0) is False
    assert lock.lost


def test_renew_with_a_bad_ttl_is_refused():
    lock = LeaseLock("b", 5, owner="a")
    assert lock.acquire()
    with pytest.raises(LockUsageError):
        lock.renew(0)
    assert lock.held


def test_release_frees_the_row_at_once_and_keeps_the_token_count():
    a = LeaseLock("rel", 60, owner="a")
    assert a.acquire()
    assert a.release() is True
    assert a.token is None
    assert seconds_to_end("rel") <= 0
    assert a.release() is False  # nothing held
    b = LeaseLock("rel", 60, owner="b")
    assert b.acquire()
    assert holder("rel") == ("b", 2)


def test_release_after_a_takeover_releases_nothing_and_marks_lost(caplog):
    lock = LeaseLock("rel", 60, owner="a")
    assert lock.acquire()
    Lease.objects.filter(key="rel").update(owner="thief", token=2)
    with caplog.at_level(logging.WARNING, logger="django_taskclaim.locks"):
        assert lock.release() is False
    assert holder("rel") == ("thief", 2)
    assert seconds_to_end("rel") > 50
    assert lock.token is None
    assert lock.cancel_flag.is_set()
    assert any(
        r.getMessage() == "lease lost key=rel owner=a token=1: taken over before release"
        for r in caplog.records
    )


def test_a_lease_past_its_deadline_sends_no_release(clock, monkeypatch):
    lock = LeaseLock("rel", 5, owner="a")
    assert lock.acquire()
    clock.now += 5
    sent = []
    monkeypatch.setattr(LeaseLock, "_statement", lambda self, step: sent.append(step))
    assert lock.release() is False
    assert sent == []
    assert lock.token is None


def test_a_release_that_fails_is_logged_and_resets_the_connection(monkeypatch, caplog):
    lock = LeaseLock("rel", 5, owner="a")
    assert lock.acquire()

    def broken(self, step):
        raise DatabaseError("server closed the connection\nmore detail")

    monkeypatch.setattr(LeaseLock, "_statement", broken)
    connection.ensure_connection()
    with caplog.at_level(logging.WARNING, logger="django_taskclaim.locks"):
        assert lock.release() is False
    assert connection.connection is None  # closed: the next statement reconnects
    assert lock.token is None
    assert [r.getMessage() for r in caplog.records] == [
        "lease release failed key=rel owner=a token=1 error=server closed the connection: "
        "it ends at its ttl"
    ]


def test_a_release_that_fails_without_text_names_the_error(monkeypatch, caplog):
    lock = LeaseLock("rel", 5, owner="a")
    assert lock.acquire()

    def broken(self, step):
        raise DatabaseError("  ")

    monkeypatch.setattr(LeaseLock, "_statement", broken)
    with caplog.at_level(logging.WARNING, logger="django_taskclaim.locks"):
        assert lock.release() is False
    assert [r.getMessage() for r in caplog.records] == [
        "lease release failed key=rel owner=a token=1 error=DatabaseError: it ends at its ttl"
    ]


def test_a_release_that_fails_inside_a_transaction_keeps_the_connection(monkeypatch):
    lock = LeaseLock("rel", 5, owner="a")
    assert lock.acquire()

    def broken(self, step):
        raise DatabaseError("boom")

    monkeypatch.setattr(LeaseLock, "_statement", broken)
    with transaction.atomic():
        assert lock.release() is False
        assert connection.connection is not None
        assert Lease.objects.filter(key="rel").exists()  # the transaction still works


NOT_HELD = "lease 'chk' is not held (never taken, or released)"
WAS_LOST = "lease 'chk' was lost (taken over, broken, or its deadline passed without a renewal)"
NESTED = (
    "lease 'ctx' is already held by this object: nested `with` on one LeaseLock is "
    "refused (the inner exit would release the outer block's lock)"
)
IN_ATOMIC = (
    "a LeaseLock with auto_renew (and @singleton) cannot be taken inside an atomic() "
    "block: the renewer's own connection cannot see the uncommitted lease row. Take it "
    "outside the transaction, or without auto_renew."
)


# -- check() --------------------------------------------------------------------------------


def test_check_asks_the_database_without_a_renewer():
    lock = LeaseLock("chk", 30, owner="a")
    with pytest.raises(LockLost, match=rf"^{re.escape(NOT_HELD)}$"):
        lock.check()
    assert lock.acquire()
    lock.check()  # held: nothing raised
    assert lock.held
    Lease.objects.filter(key="chk").delete()  # broken by an operator
    with pytest.raises(LockLost, match=rf"^{re.escape(WAS_LOST)}$"):
        lock.check()
    assert lock.lost
    assert lock.cancel_flag.is_set()


def test_check_of_a_lease_past_its_deadline_raises(clock):
    lock = LeaseLock("chk", 5, owner="a")
    assert lock.acquire()
    clock.now += 5
    with pytest.raises(LockLost, match=rf"^{re.escape(WAS_LOST)}$"):
        lock.check()


def test_check_with_a_renewer_trusts_its_last_answer():
    with LeaseLock("chk", 30, owner="a", auto_renew=True) as lock:
        Lease.objects.filter(key="chk").update(token=9)
        lock.check()  # no query: the renewer has not been told yet
        assert not lock.lost
        lock._stop_renewer()
        with pytest.raises(LockLost):
            lock.check()
        Lease.objects.filter(key="chk").update(token=1)
        lock._lease = lease.replace(lock._lease, lost=False)  # let the exit release


def test_mark_lost_of_an_older_acquisition_leaves_the_new_one_alone():
    lock = LeaseLock("ml", 30, owner="a")
    assert lock.acquire()
    lock._mark_lost("old news", token=0)
    assert lock.held
    assert not lock.cancel_flag.is_set()
    lock._mark_lost("this one", token=1)
    assert lock.lost
    assert lock.cancel_flag.is_set()


def test_mark_lost_without_a_token_marks_the_current_one(caplog):
    lock = LeaseLock("ml", 30, owner="a")
    assert lock.acquire()
    with caplog.at_level(logging.WARNING, logger="django_taskclaim.locks"):
        lock._mark_lost("because")
    assert lock.lost
    assert [r.getMessage() for r in caplog.records] == [
        "lease lost key=ml owner=a token=1: because"
    ]


LOST_IN_BLOCK = (
    "lease 'ctx' was lost before the block ended (taken over, or its deadline passed "
    "without a renewal); the block ran partly without the lock"
)


# -- the context manager --------------------------------------------------------------------


def test_a_nested_with_is_refused_and_the_outer_block_keeps_the_lock():
    lock = LeaseLock("ctx", 30, owner="a")
    with lock:
        with pytest.raises(LockUsageError, match=rf"^{re.escape(NESTED)}$"), lock:
            pass  # pragma: no cover - never entered
        assert lock.held
        assert holder("ctx") == ("a", 1)
    assert lock.token is None
    assert seconds_to_end("ctx") <= 0


def test_a_lost_lock_may_be_entered_again(clock):
    lock = LeaseLock("ctx", 5, owner="a")
    assert lock.acquire()
    clock.now += 5
    assert lock.lost
    Lease.objects.filter(key="ctx").update(locked_until=Lease.objects.get().acquired_at)
    with lock:
        assert lock.token == 2


def test_auto_renew_is_refused_inside_a_transaction_and_plain_is_not():
    with transaction.atomic():
        with (
            pytest.raises(LockUsageError, match=rf"^{re.escape(IN_ATOMIC)}$"),
            LeaseLock("ctx", 30, auto_renew=True),
        ):
            pass  # pragma: no cover - never entered
        assert not Lease.objects.exists()
        with LeaseLock("ctx", 30, owner="plain") as lock:
            assert holder("ctx") == ("plain", 1)
            assert lock._renewer is None


def test_the_renewer_runs_only_while_the_block_runs():
    lock = LeaseLock("ctx", 30, owner="a", auto_renew=True)
    assert lock._renewer is None
    with lock:
        renewer = lock._renewer
        assert renewer is not None
        assert renewer.is_alive()
    assert lock._renewer is None
    assert not renewer.is_alive()
    assert seconds_to_end("ctx") <= 0


def test_an_error_of_the_block_is_never_replaced_by_the_loss(clock):
    lock = LeaseLock("ctx", 5, owner="a")
    with pytest.raises(ValueError, match="the block's own"), lock:  # noqa: PT012
        clock.now += 5
        raise ValueError("the block's own")
    assert lock.token is None


def test_a_block_that_outlived_its_deadline_raises_lock_lost(clock):
    lock = LeaseLock("ctx", 5, owner="a")
    with pytest.raises(LockLost) as info, lock:
        clock.now += 5
    assert str(info.value) == LOST_IN_BLOCK
    assert lock.token is None


def test_a_block_whose_release_finds_the_lease_taken_raises_lock_lost():
    lock = LeaseLock("ctx", 30, owner="a")
    with pytest.raises(LockLost) as info, lock:
        Lease.objects.filter(key="ctx").update(owner="thief", token=2)
    assert str(info.value) == LOST_IN_BLOCK
    assert holder("ctx") == ("thief", 2)


def test_a_lock_held_elsewhere_is_not_entered():
    other = LeaseLock("ctx", 30, owner="b")
    with LeaseLock("ctx", 30, owner="a"):
        with pytest.raises(LockNotAcquired) as info, other:
            pass  # pragma: no cover - never entered
        assert str(info.value) == "lease 'ctx' is held by another owner"
    assert other.token is None
    assert other._renewer is None


def test_a_block_that_kept_its_lease_raises_nothing():
    with LeaseLock("ctx", 30, owner="a") as lock:
        assert holder("ctx") == ("a", 1)
    assert lock.token is None
    assert not lock.lost


def test_each_step_of_a_lease_is_logged_with_its_key_owner_and_token(caplog):
    lock = LeaseLock("log", 30, owner="a")
    with caplog.at_level(logging.DEBUG, logger="django_taskclaim.locks"):
        assert lock.acquire()
        assert lock.renew()
        assert lock.release()
    assert [r.getMessage() for r in caplog.records if r.name == "django_taskclaim.locks"] == [
        "lease acquired key=log owner=a token=1",
        "lease renewed key=log owner=a token=1",
        "lease released key=log owner=a token=1",
    ]


def test_a_lease_broken_in_the_database_is_logged_once(caplog):
    lock = LeaseLock("chk", 30, owner="a")
    assert lock.acquire()
    Lease.objects.filter(key="chk").delete()
    with caplog.at_level(logging.WARNING, logger="django_taskclaim.locks"):
        with pytest.raises(LockLost):
            lock.check()
        lock._mark_lost("again")  # already lost: not logged again
    assert [r.getMessage() for r in caplog.records] == [
        "lease lost key=chk owner=a token=1: taken over or broken (checked against the database)"
    ]
