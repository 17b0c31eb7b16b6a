"""Lease locks: a row of the ``taskclaim.Lease`` table held until a time on the database
clock, fenced by a token (:class:`LeaseLock`). The statements are the vendor's, in
:mod:`django_taskclaim.backends`."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from types import TracebackType
from typing import Any

from django.db import DatabaseError, connections, router

from django_taskclaim.backends import DatabaseSQL, LeaseTable
from django_taskclaim.config import bounds
from django_taskclaim.config.settings import taskclaim_settings
from django_taskclaim.db import default_worker_id, in_user_atomic
from django_taskclaim.exceptions import LockLost, LockNotAcquired, LockUsageError
from django_taskclaim.locks.keys import validate_lease_key
from django_taskclaim.locks.lease_sql import bounded_lease_statement, lease_statement
from django_taskclaim.locks.renewer import ScheduledRenewer, renew_interval, safety_margin
from django_taskclaim.locks.state import LeaseState

logger = logging.getLogger("django_taskclaim.locks")

#: Shortest and longest lease a :class:`LeaseLock` takes (a shorter one would end before
#: its own statement returned; a longer one is a typo that would wedge the key for ages).
MIN_TTL, MAX_TTL = bounds.LOCK_TTL.low, bounds.LOCK_TTL.high


def validate_ttl(ttl: Any) -> float:
    """``ttl`` as seconds (a number or a ``timedelta``; ``None``: ``TASKCLAIM_LEASE``)
    within :data:`~django_taskclaim.config.bounds.LOCK_TTL` (:data:`MIN_TTL` to :data:`MAX_TTL`);
    raise :class:`LockUsageError` otherwise."""
    if ttl is None:
        ttl = taskclaim_settings.LEASE
    return float(bounds.number(ttl, "ttl", bounds.LOCK_TTL, seconds=True, error=LockUsageError))


class LeaseLock:
    """A named lock held until a time on the database clock, fenced by a token.

    ``acquire()`` wins when the key is free or its lease has ended
    (``locked_until <= now()`` on the database, judged when the row is written); each win
    bumps ``token`` by one, so a holder whose lease was taken over is fenced: its
    ``renew()`` / ``release()`` match nothing and return ``False``. Each is one atomic
    statement (PostgreSQL and SQLite ``INSERT … ON CONFLICT … DO UPDATE … WHERE …
    RETURNING``, MySQL/MariaDB ``INSERT … ON DUPLICATE KEY UPDATE`` with conditions and a
    read-back). Works on every database and through any connection pooler.

    **The holder is told first.** Each successful acquire or renew sets a local deadline
    on the monotonic clock: the moment the statement was *sent*, plus ``ttl``, minus a
    :func:`~.renewer.safety_margin`. The database cannot end the lease before that, so
    :attr:`held` turns ``False`` (and :meth:`check` raises) before anyone else can take
    it over — whatever the renewer thread is doing, even if its connection hangs.

    As a context manager it raises :class:`LockNotAcquired` on enter when the lock is
    held elsewhere, releases on exit and raises :class:`LockLost` on exit if the lease
    was lost (or its deadline passed) before the block ended; an exception from the
    block is never replaced. Not re-entrant: entering a held lock again raises
    :class:`LockUsageError`. ``auto_renew=True`` (or an interval in seconds, at most
    ``ttl / 3``) renews it from a background thread on its own database connection every
    ``ttl / 4`` seconds (or that interval) while the block runs, each renewal's row-lock
    wait bounded below the time left; if none lands before the local deadline the lease
    is marked lost then (:attr:`lost`, :attr:`cancel_flag`, :meth:`check`). That is
    refused inside the caller's ``atomic()`` block (the renewer's connection could not
    see the uncommitted lease).

    ``owner`` identifies the holder (default ``host:pid:<random>``, unique per
    object); it must not be shared by two holders. One object is for one thread.
    """

    #: Why the last acquire() did not take the lease (the ``with`` statement's error);
    #: set by every acquire() that returns ``False``.
    _refused: str

    def __init__(
        self,
        key: str,
        ttl: float | None = None,
        *,
        owner: str | None = None,
        using: str | None = None,
        auto_renew: bool | float = False,
    ) -> None:
        # Late: the locks are importable before the app registry is ready; models are not.
        from django_taskclaim.models import Lease  # deferred: models need the app registry

        self.key = validate_lease_key(key)
        self.ttl = validate_ttl(ttl)
        if owner is None:
            owner = f"{default_worker_id()}:{uuid.uuid4().hex[:12]}"
        if not isinstance(owner, str) or not owner or len(owner) > 255 or "\x00" in owner:
            raise LockUsageError("owner must be a non-empty string of at most 255 characters")
        self.owner = owner
        self.using = using or router.db_for_write(Lease)
        self.renew_every = renew_interval(auto_renew, self.ttl)
        self._lease = LeaseState()
        self._guard = threading.Lock()  # serialises the read-modify-replace of _lease
        self._lost_flag = threading.Event()  # this acquisition's; set once it is lost
        self._renewer: ScheduledRenewer | None = None

    def __repr__(self) -> str:
        return f"<LeaseLock key={self.key!r} owner={self.owner!r} token={self.token}>"

    @property
    def token(self) -> int | None:
        """Fencing token of the held lease, ``None`` when not held."""
        return self._lease.token

    @property
    def state(self) -> LeaseState:
        """What this object knows of its lease, as one consistent snapshot."""
        return self._lease

    @property
    def held(self) -> bool:
        """Whether this object holds the lease: taken, not found lost, and its local
        deadline (see the class docstring) not passed. Once ``False`` for a lost lease it
        stays ``False`` for this acquisition."""
        lease = self._lease
        if lease.held(time.monotonic()):
            return True
        if lease.token is not None and not lease.lost:
            self._mark_lost("its deadline passed before a renewal landed", token=lease.token)
        return False

    @property
    def lost(self) -> bool:
        """Whether the lease was found taken over, or its local deadline passed. Sticky:
        once ``True`` it stays ``True`` for this acquisition, even if a renewal that was
        in flight returns afterwards."""
        lease = self._lease
        if not lease.over(time.monotonic()):
            return False
        if not lease.lost:
            self._mark_lost("its deadline passed before a renewal landed", token=lease.token)
        return True

    @property
    def cancel_flag(self) -> threading.Event:
        """This acquisition's cancel flag: set as soon as the lease is known lost (taken
        over, or no renewal landed before the local deadline), by the renewer when there
        is one, before anyone else can take the lease. A long body may
        ``cancel_flag.wait(…)`` or test ``cancel_flag.is_set()`` between steps."""
        return self._lost_flag

    @property
    def seconds_left(self) -> float:
        """Seconds until the local deadline (0 when not held)."""
        lease = self._lease
        if lease.token is None or lease.lost:
            return 0.0
        return max(0.0, lease.deadline - time.monotonic())

    def _good_until(self, sent: float, ttl: float | None = None) -> float:
        ttl = self.ttl if ttl is None else ttl
        return sent + ttl - safety_margin(ttl)

    def acquire(self) -> bool:
        """Take the lease if it is free or expired; ``True`` if this call holds it.

        Already held by this object: renews instead. On success :attr:`token` is the
        new fencing token (one more than the previous holder's).
        """
        if self._lease.token is not None and not self.lost:
            return self.renew()
        sent = time.monotonic()
        token = self._statement(
            lambda sql, cursor, t: sql.lease_acquire(cursor, t, self.key, self.owner, self.ttl),
        )
        with self._guard:
            self._lease = LeaseState(token=token, deadline=self._good_until(sent))
            self._lost_flag = threading.Event()
        if token is None:
            logger.debug("lease busy key=%s owner=%s", self.key, self.owner)
            self._refused = "is held by another owner"
            return False
        if time.monotonic() >= self._lease.deadline:
            # The statement took longer than the lease (it waited on the row's lock): the
            # lease may end before the caller could use it. Give it back; not acquired.
            logger.warning(
                "lease acquired too late key=%s owner=%s token=%s: its statement took "
                "longer than ttl=%gs; released",
                self.key,
                self.owner,
                token,
                self.ttl,
            )
            with self._guard:
                self._lease = replace(self._lease, token=None)
            # Past the local deadline release() sends nothing; this acquisition's row is
            # still ours in the database (fenced on its token): end it now, not at its ttl.
            self._send_release(token)
            self._refused = (
                f"was taken too late (its statement took longer than ttl={self.ttl:g}s: a "
                "slow or contended database) and given back"
            )
            return False
        logger.debug("lease acquired key=%s owner=%s token=%s", self.key, self.owner, token)
        return True

    def renew(self, ttl: float | None = None) -> bool:
        """Extend the lease to ``now() + ttl``; ``False`` (and :attr:`lost`) if it was lost.
        ``ttl`` (seconds, within the constructor's bounds) is this renewal's only; by
        default the lock's own.

        Fenced on (key, owner, token): after a takeover it changes nothing. A lease whose
        local deadline already passed is not renewed (someone may hold it already), and
        a renewal that returns after the deadline does not revive it: lost stays lost.
        """
        return self._renew(lock_wait=None, ttl=None if ttl is None else validate_ttl(ttl))

    def _renew(self, *, lock_wait: float | None, ttl: float | None = None) -> bool:
        """:meth:`renew`; with ``lock_wait`` its statement waits on the row's lock for
        at most that many seconds (then raises the vendor's lock timeout error)."""
        seconds = self.ttl if ttl is None else ttl
        lease = self._lease
        token = lease.token
        if token is None or lease.lost:
            return False
        if not self.held:
            return False
        sent = time.monotonic()

        def step(sql: DatabaseSQL, cursor: Any, t: LeaseTable) -> bool:
            return sql.lease_renew(cursor, t, self.key, self.owner, token, seconds)

        if lock_wait is None:
            ok = self._statement(step)
        else:
            ok = bounded_lease_statement(self.using, step, lock_wait)
        if not ok:
            self._mark_lost("taken over: the renewal matched nothing", token=token)
            return False
        with self._guard:
            current = self._lease
            if current.token != token:
                return False  # released (or taken anew) meanwhile
            landed = not current.lost and time.monotonic() < current.deadline
            if landed:
                self._lease = replace(current, deadline=self._good_until(sent, seconds))
        if not landed:
            self._mark_lost("its renewal returned after its deadline", token=token)
            return False
        logger.debug("lease renewed key=%s owner=%s token=%s", self.key, self.owner, token)
        return True

    def _statement[T](self, step: Callable[[DatabaseSQL, Any, LeaseTable], T]) -> T:
        """Run one lease ``step`` on this lock's database (see
        :func:`~.lease_sql.lease_statement`)."""
        return lease_statement(self.using, step)

    def release(self) -> bool:
        """Give the lease up now; ``True`` if it was still ours, ``False`` if it was lost.

        Fenced on (key, owner, token): a stale holder releases nothing. The row stays
        (ending now) so the next holder's token keeps growing. A lease past its deadline
        is not sent a release (it ends by itself). A database error is logged and the
        connection reset (the lease then ends at its ttl); it returns ``False``.
        """
        self._stop_renewer()
        token = self.token
        if token is None:
            return False
        expired = self.lost
        with self._guard:
            self._lease = replace(self._lease, token=None)
        if expired:
            return False
        ok = self._send_release(token)
        if ok is False:
            self._mark_lost("taken over before release", token=token)
        elif ok:
            logger.debug("lease released key=%s owner=%s token=%s", self.key, self.owner, token)
        return bool(ok)

    def _send_release(self, token: int) -> bool | None:
        """The fenced release statement of acquisition ``token``: whether it was still
        ours; ``None`` when the database failed (logged, the connection reset: the lease
        then ends at its ttl)."""
        try:
            return bool(
                self._statement(
                    lambda sql, cursor, t: sql.lease_release(
                        cursor, t, self.key, self.owner, token
                    ),
                )
            )
        except DatabaseError as exc:
            logger.warning(
                "lease release failed key=%s owner=%s token=%s error=%s: it ends at its ttl",
                self.key,
                self.owner,
                token,
                str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__,
            )
            if not in_user_atomic(self.using):
                connections[self.using].close()  # the next statement reconnects
            return None

    def check(self) -> None:
        """Raise :class:`LockLost` unless the lease is held.

        Without a renewer thread it also asks the database (one short query), so a
        lease broken by an operator is noticed; with one, the renewer's last answer and
        the local deadline decide.
        """
        token = self.token
        if (
            token is not None
            and not self.lost
            and self._renewer is None
            and not self._statement(
                lambda sql, cursor, t: sql.lease_verify(cursor, t, self.key, self.owner, token),
            )
        ):
            self._mark_lost("taken over or broken (checked against the database)", token=token)
        if self.token is None:
            raise LockLost(f"lease {self.key!r} is not held (never taken, or released)")
        if not self.held:
            raise LockLost(
                f"lease {self.key!r} was lost (taken over, broken, or its deadline passed "
                "without a renewal)"
            )

    def _mark_lost(self, why: str, *, token: int | None = None) -> None:
        """Mark the acquisition of ``token`` (default: the current one) lost, for good, and
        set its cancel flag; nothing when a newer acquisition replaced it meanwhile."""
        with self._guard:
            current = self._lease
            if token is not None and current.token not in (None, token):
                return
            already = current.lost
            self._lease = replace(current, lost=True)
            flag = self._lost_flag
        flag.set()
        if not already:
            logger.warning(
                "lease lost key=%s owner=%s token=%s: %s",
                self.key,
                self.owner,
                token if token is not None else self.token,
                why,
            )

    def _start_renewer(self) -> None:
        if self.renew_every is not None and self._renewer is None:
            self._renewer = ScheduledRenewer(self, self.renew_every)
            self._renewer.start()

    def _stop_renewer(self) -> None:
        renewer, self._renewer = self._renewer, None
        if renewer is not None:
            renewer.stop(timeout=max(1.0, self.seconds_left))

    def __enter__(self) -> LeaseLock:
        if self._lease.token is not None and not self._lease.lost:
            raise LockUsageError(
                f"lease {self.key!r} is already held by this object: nested `with` on one "
                "LeaseLock is refused (the inner exit would release the outer block's lock)"
            )
        if self.renew_every is not None and in_user_atomic(self.using):
            raise LockUsageError(
                "a LeaseLock with auto_renew (and @singleton) cannot be taken inside an "
                "atomic() block: the renewer's own connection cannot see the uncommitted "
                "lease row. Take it outside the transaction, or without auto_renew."
            )
        if not self.acquire():
            raise LockNotAcquired(f"lease {self.key!r} {self._refused}")
        self._start_renewer()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop_renewer()
        lost = self.lost  # before release: was the block covered to its end?
        self.release()
        if (lost or self._lease.lost) and exc_type is None:
            raise LockLost(
                f"lease {self.key!r} was lost before the block ended (taken over, or its "
                "deadline passed without a renewal); the block ran partly without the lock"
            )


#: Alias of :class:`LeaseLock`.
lease_lock = LeaseLock
