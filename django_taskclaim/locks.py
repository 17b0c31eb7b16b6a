"""Locks coordinated by the database: lease locks, advisory locks and singletons.

- :class:`LeaseLock` — a row of the ``taskclaim.Lease`` table held by an owner until a
  time on the database clock, with a fencing token. Works on every supported database
  and through any connection pooler. Acquire, renew and release are one atomic
  statement each.
- :func:`advisory` — PostgreSQL advisory locks (MySQL / MariaDB ``GET_LOCK``), as a
  context manager or a decorator; transaction scope by default.
- :func:`singleton` — run a function only where the lock was won; skip elsewhere.
- :func:`advisory_key` — the stable string → signed int64 hash used for string keys.

See ``docs/locks.md`` for which lock fits which job.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import math
import threading
import time
import uuid
from collections.abc import Callable
from types import TracebackType
from typing import Any, Literal, TypeVar, cast

from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections, router, transaction

from .conf import taskclaim_settings
from .db import NOW_SQL, default_worker_id, in_user_atomic, retry_transient
from .exceptions import ConfigurationError, LockNotAcquired, TaskClaimError

logger = logging.getLogger("django_taskclaim.locks")

F = TypeVar("F", bound=Callable[..., Any])

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
#: Longest lease key (the ``Lease.key`` column is ``varchar(255)``).
MAX_LEASE_KEY = 255

OnFail = Literal["raise", "return", "skip"]
Key = int | str | tuple[int, int]


class LockUsageError(ConfigurationError, ValueError):
    """A lock was asked for with an invalid key, timeout or mode, or one the database
    (or the declared connection pooler) cannot honour. Nothing was locked."""


class LockLost(TaskClaimError):
    """A lock was held but is not any more: a lease taken over after it expired, or a
    session advisory lock that vanished with its connection. The protected block ran
    (at least in part) without the lock."""


class _Skipped:
    """The value a :func:`singleton` function returns where it did not run."""

    _instance: _Skipped | None = None

    def __new__(cls) -> _Skipped:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "SKIPPED"


#: Returned by a :func:`singleton` function that was skipped (falsy; compare with ``is``).
SKIPPED = _Skipped()


# --------------------------------------------------------------------------- keys


def advisory_key(name: str) -> int:
    """Return the signed 64-bit lock key of the string ``name``.

    Stable across processes, machines and Python versions: the first 8 bytes of the MD5
    digest of the UTF-8 encoded name, read as a big-endian signed integer. The same
    number is computed in PostgreSQL by
    ``SELECT ('x' || substr(md5(name), 1, 16))::bit(64)::bigint`` (database encoding
    UTF8), so a lock taken with ``advisory("name")`` can be found in ``pg_locks``.
    """
    if not isinstance(name, str):
        raise LockUsageError(f"advisory_key() needs a string, got {type(name).__name__}")
    if not name:
        raise LockUsageError("a lock key must not be empty")
    digest = hashlib.md5(name.encode("utf-8"), usedforsecurity=False).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def normalize_key(key: object) -> tuple[int] | tuple[int, int]:
    """Validate ``key`` and return it as ``(int64,)`` or ``(int32, int32)``.

    Strings are hashed with :func:`advisory_key`. Raises :class:`LockUsageError` for an
    empty string, a number out of range or any other type.
    """
    if isinstance(key, str):
        return (advisory_key(key),)
    if isinstance(key, bool):
        raise LockUsageError("a lock key cannot be a bool")
    if isinstance(key, int):
        if not INT64_MIN <= key <= INT64_MAX:
            raise LockUsageError(
                f"integer lock key {key} is out of the signed 64-bit range "
                f"[{INT64_MIN}, {INT64_MAX}]"
            )
        return (key,)
    if isinstance(key, tuple | list) and len(key) == 2:
        pair = []
        for part in key:
            if isinstance(part, bool) or not isinstance(part, int):
                raise LockUsageError(f"a key pair holds two integers, got {key!r}")
            if not INT32_MIN <= part <= INT32_MAX:
                raise LockUsageError(
                    f"each half of a key pair must fit a signed 32-bit integer, got {key!r}"
                )
            pair.append(part)
        return (pair[0], pair[1])
    raise LockUsageError(
        f"a lock key is an int, a pair of int32 or a non-empty string, got {key!r}"
    )


def _dotted_path(func: Callable[..., Any]) -> str:
    return f"{func.__module__}.{func.__qualname__}"


#: Shortest and longest lease a :class:`LeaseLock` takes (a shorter one would end before
#: its own statement returned; a longer one is a typo that would wedge the key for ages).
MIN_TTL, MAX_TTL = 0.05, 30 * 24 * 3600.0
#: Shortest auto-renewal interval (anything shorter is a busy loop on the database).
MIN_RENEW_EVERY = 0.01


def _validate_ttl(ttl: Any) -> float:
    if ttl is None:
        ttl = taskclaim_settings.LEASE
    if hasattr(ttl, "total_seconds"):
        ttl = ttl.total_seconds()
    if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not ttl > 0:
        raise LockUsageError(f"ttl must be a positive number of seconds, got {ttl!r}")
    if not math.isfinite(ttl) or not MIN_TTL <= ttl <= MAX_TTL:
        raise LockUsageError(f"ttl must be from {MIN_TTL:g} to {MAX_TTL:g} seconds, got {ttl!r}")
    return float(ttl)


def safety_margin(ttl: float) -> float:
    """How long before ``ttl`` (counted from the *send* of the statement that took or
    renewed the lease) a holder considers its lease over: 10 % of the ttl, at most 1 s.

    The database wrote the lease's end after it received the statement, so the lease
    ends no earlier than send + ttl; the margin covers the rate difference of two
    clocks over one ttl, and the time to act on :attr:`LeaseLock.held`."""
    return min(1.0, ttl * 0.1)


def _validate_lease_key(key: Any) -> str:
    if not isinstance(key, str):
        raise LockUsageError(f"a lease key is a string, got {type(key).__name__}")
    if not key:
        raise LockUsageError("a lock key must not be empty")
    if len(key) > MAX_LEASE_KEY:
        raise LockUsageError(f"a lease key has at most {MAX_LEASE_KEY} characters")
    if "\x00" in key:
        raise LockUsageError("a lease key cannot contain a NUL character")
    return key


def _flag(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        raise LockUsageError(f"{name} is True or False, got {value!r}")
    return value


# --------------------------------------------------------------------- lease SQL


class _LeaseSQL:
    """The three lease statements for one database vendor (one place per vendor)."""

    NOW = ""  # the vendor's SQL for the database clock

    def __init__(self, using: str) -> None:
        from .models import Lease

        conn = connections[using]
        qn = conn.ops.quote_name
        meta = Lease._meta
        self.using = using
        self.t = qn(meta.db_table)
        self.key, self.owner, self.token, self.until, self.acq = (
            qn(cast(Any, meta.get_field(name)).column)
            for name in ("key", "owner", "token", "locked_until", "acquired_at")
        )

    def _run(self, sql: str, params: tuple[Any, ...], *, rows: bool) -> Any:
        def go() -> Any:
            with connections[self.using].cursor() as cursor:
                cursor.execute(sql, params)
                return cursor.fetchall() if rows else cursor.rowcount

        return retry_transient(go, self.using, what="lease lock")

    def acquire(self, key: str, owner: str, ttl: float) -> int | None:
        raise NotImplementedError

    def renew(self, key: str, owner: str, token: int, ttl: float) -> bool:
        raise NotImplementedError

    def verify(self, key: str, owner: str, token: int) -> bool:
        """Whether (key, owner, token) holds a lease that has not ended."""
        sql = (
            f"SELECT 1 FROM {self.t} WHERE {self.key} = %s AND {self.owner} = %s "
            f"AND {self.token} = %s AND {self.until} > {self.NOW}"
        )
        return bool(self._run(sql, (key, owner, token), rows=True))

    def release(self, key: str, owner: str, token: int) -> bool:
        """End the lease now (never extend it); PostgreSQL and MySQL share this one."""
        sql = (
            f"UPDATE {self.t} SET {self.until} = LEAST({self.until}, {self.NOW}) "
            f"WHERE {self.key} = %s AND {self.owner} = %s AND {self.token} = %s"
        )
        return bool(self._run(sql, (key, owner, token), rows=False) == 1)


class _PostgresLeaseSQL(_LeaseSQL):
    # clock_timestamp(), not statement_timestamp(): a statement that waited on the row's
    # lock must count the lease from when it writes, and judge expiry at that moment.
    NOW = "clock_timestamp()"

    def acquire(self, key: str, owner: str, ttl: float) -> int | None:
        t, n = self.t, self.NOW
        sql = (
            f"INSERT INTO {t} ({self.key}, {self.owner}, {self.token}, {self.until}, "
            f"{self.acq}) VALUES (%s, %s, 1, {n} + %s * interval '1 second', {n}) "
            f"ON CONFLICT ({self.key}) DO UPDATE SET {self.owner} = EXCLUDED.{self.owner}, "
            f"{self.token} = {t}.{self.token} + 1, {self.until} = EXCLUDED.{self.until}, "
            f"{self.acq} = EXCLUDED.{self.acq} WHERE {t}.{self.until} <= {n} "
            f"RETURNING {self.token}"
        )
        rows = self._run(sql, (key, owner, ttl), rows=True)
        return int(rows[0][0]) if rows else None

    def renew(self, key: str, owner: str, token: int, ttl: float) -> bool:
        sql = (
            f"UPDATE {self.t} SET {self.until} = {self.NOW} + %s * interval '1 second' "
            f"WHERE {self.key} = %s AND {self.owner} = %s AND {self.token} = %s"
        )
        return bool(self._run(sql, (ttl, key, owner, token), rows=False) == 1)


class _MySQLLeaseSQL(_LeaseSQL):
    """``INSERT … ON DUPLICATE KEY UPDATE`` with conditional assignments.

    MySQL has no ``RETURNING`` here, so the statement stamps ``acquired_at`` with a
    database timestamp taken just before it, and a read-back by (key, owner, that
    timestamp) tells whether this very statement won. The assignments run left to
    right, so ``locked_until`` (the condition) is assigned last.
    """

    NOW = NOW_SQL["mysql"]  # UTC: zone-proof whatever time_zone a session set

    def acquire(self, key: str, owner: str, ttl: float) -> int | None:
        t = self.t
        cond = f"{self.until} <= @taskclaim_lease_now"
        upsert = (
            f"INSERT INTO {t} ({self.key}, {self.owner}, {self.token}, {self.until}, "
            f"{self.acq}) VALUES (%s, %s, 1, @taskclaim_lease_now + INTERVAL %s MICROSECOND, "
            f"@taskclaim_lease_now) ON DUPLICATE KEY UPDATE "
            f"{self.owner} = IF({cond}, VALUES({self.owner}), {self.owner}), "
            f"{self.token} = IF({cond}, {self.token} + 1, {self.token}), "
            f"{self.acq} = IF({cond}, VALUES({self.acq}), {self.acq}), "
            f"{self.until} = IF({cond}, VALUES({self.until}), {self.until})"
        )
        # MySQL's clock is fixed at the statement's start, and the upsert may have waited
        # on the row's lock: the read-back only counts a lease still in the future.
        readback = (
            f"SELECT {self.token} FROM {t} WHERE {self.key} = %s AND {self.owner} = %s "
            f"AND {self.acq} = @taskclaim_lease_now AND {self.until} > {self.NOW}"
        )

        def go() -> Any:
            with connections[self.using].cursor() as cursor:
                cursor.execute(f"SET @taskclaim_lease_now = {self.NOW}")
                cursor.execute(upsert, (key, owner, round(ttl * 1_000_000)))
                cursor.execute(readback, (key, owner))
                return cursor.fetchall()

        rows = retry_transient(go, self.using, what="lease lock")
        return int(rows[0][0]) if rows else None

    def renew(self, key: str, owner: str, token: int, ttl: float) -> bool:
        update = (
            f"UPDATE {self.t} SET {self.until} = {self.NOW} + INTERVAL %s MICROSECOND "
            f"WHERE {self.key} = %s AND {self.owner} = %s AND {self.token} = %s"
        )
        check = (
            f"SELECT 1 FROM {self.t} WHERE {self.key} = %s AND {self.owner} = %s "
            f"AND {self.token} = %s AND {self.until} > {self.NOW}"
        )

        def go() -> bool:
            with connections[self.using].cursor() as cursor:
                cursor.execute(update, (round(ttl * 1_000_000), key, owner, token))
                if cursor.rowcount != 1:
                    return False
                cursor.execute(check, (key, owner, token))  # still in the future now?
                return bool(cursor.fetchall())

        return bool(retry_transient(go, self.using, what="lease lock"))

    # release(): the base class's UPDATE; Django connects to MySQL with CLIENT_FOUND_ROWS,
    # so its rowcount counts matched rows there too.


class _SQLiteLeaseSQL(_LeaseSQL):
    """``INSERT … ON CONFLICT … DO UPDATE … WHERE … RETURNING`` (SQLite ≥ 3.35).

    Times are Django's SQLite text format; ``'now'`` is fixed for one statement.
    """

    NOW = "strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')"
    LATER = "strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', %s)"

    @staticmethod
    def _shift(ttl: float) -> str:
        return f"+{ttl:.6f} seconds"

    def acquire(self, key: str, owner: str, ttl: float) -> int | None:
        sql = (
            f"INSERT INTO {self.t} ({self.key}, {self.owner}, {self.token}, {self.until}, "
            f"{self.acq}) VALUES (%s, %s, 1, {self.LATER}, {self.NOW}) "
            f"ON CONFLICT ({self.key}) DO UPDATE SET {self.owner} = excluded.{self.owner}, "
            f"{self.token} = {self.token} + 1, {self.until} = excluded.{self.until}, "
            f"{self.acq} = excluded.{self.acq} WHERE {self.until} <= {self.NOW} "
            f"RETURNING {self.token}"
        )
        rows = self._run(sql, (key, owner, self._shift(ttl)), rows=True)
        return int(rows[0][0]) if rows else None

    def renew(self, key: str, owner: str, token: int, ttl: float) -> bool:
        sql = (
            f"UPDATE {self.t} SET {self.until} = {self.LATER} "
            f"WHERE {self.key} = %s AND {self.owner} = %s AND {self.token} = %s"
        )
        params = (self._shift(ttl), key, owner, token)
        return bool(self._run(sql, params, rows=False) == 1)

    def release(self, key: str, owner: str, token: int) -> bool:
        sql = (
            f"UPDATE {self.t} SET {self.until} = MIN({self.until}, {self.NOW}) "
            f"WHERE {self.key} = %s AND {self.owner} = %s AND {self.token} = %s"
        )
        return bool(self._run(sql, (key, owner, token), rows=False) == 1)


_LEASE_SQL: dict[str, type[_LeaseSQL]] = {
    "postgresql": _PostgresLeaseSQL,
    "mysql": _MySQLLeaseSQL,
    "sqlite": _SQLiteLeaseSQL,
}


def _lease_sql(using: str) -> _LeaseSQL:
    vendor = connections[using].vendor
    try:
        return _LEASE_SQL[vendor](using)
    except KeyError:
        raise LockUsageError(f"lease locks do not support the {vendor} database") from None


# ------------------------------------------------------------------- lease locks


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
    :func:`safety_margin`. The database cannot end the lease before that, so
    :attr:`held` turns ``False`` (and :meth:`check` raises) before anyone else can take
    it over — whatever the renewer thread is doing, even if its connection hangs.

    As a context manager it raises :class:`LockNotAcquired` on enter when the lock is
    held elsewhere, releases on exit and raises :class:`LockLost` on exit if the lease
    was lost (or its deadline passed) before the block ended; an exception from the
    block is never replaced. Not re-entrant: entering a held lock again raises
    :class:`LockUsageError`. ``auto_renew=True`` (or an interval in seconds) renews it
    from a background thread on its own database connection every ``ttl / 3`` seconds
    (or that interval) while the block runs; that is refused inside the caller's
    ``atomic()`` block (the renewer's connection could not see the uncommitted lease).

    ``owner`` identifies the holder (default ``host:pid:<random>``, unique per
    object); it must not be shared by two holders. One object is for one thread.
    """

    def __init__(
        self,
        key: str,
        ttl: float | None = None,
        *,
        owner: str | None = None,
        using: str | None = None,
        auto_renew: bool | float = False,
    ) -> None:
        from .models import Lease

        self.key = _validate_lease_key(key)
        self.ttl = _validate_ttl(ttl)
        if owner is None:
            owner = f"{default_worker_id()}:{uuid.uuid4().hex[:12]}"
        if not isinstance(owner, str) or not owner or len(owner) > 255 or "\x00" in owner:
            raise LockUsageError("owner must be a non-empty string of at most 255 characters")
        self.owner = owner
        self.using = using or router.db_for_write(Lease)
        if isinstance(auto_renew, bool):
            self.renew_every: float | None = self.ttl / 3 if auto_renew else None
        elif (
            isinstance(auto_renew, int | float)
            and math.isfinite(auto_renew)
            and MIN_RENEW_EVERY <= auto_renew < self.ttl
        ):
            self.renew_every = float(auto_renew)
        else:
            raise LockUsageError(
                f"auto_renew is True/False or an interval from {MIN_RENEW_EVERY:g} s to "
                f"below ttl={self.ttl:g} s, got {auto_renew!r}"
            )
        #: Fencing token of the held lease, ``None`` when not held.
        self.token: int | None = None
        self._lost = False
        self._deadline = 0.0  # monotonic; meaningful while token is not None
        self._state = threading.Lock()
        self._renewer: _Renewer | None = None

    def __repr__(self) -> str:
        return f"<LeaseLock key={self.key!r} owner={self.owner!r} token={self.token}>"

    @property
    def held(self) -> bool:
        """Whether this object holds the lease: taken, not found lost, and its local
        deadline (see the class docstring) not passed."""
        return self.token is not None and not self._lost and time.monotonic() < self._deadline

    @property
    def lost(self) -> bool:
        """Whether the lease was found taken over, or its local deadline passed."""
        return self._lost or (self.token is not None and time.monotonic() >= self._deadline)

    @property
    def seconds_left(self) -> float:
        """Seconds until the local deadline (0 when not held)."""
        if self.token is None or self._lost:
            return 0.0
        return max(0.0, self._deadline - time.monotonic())

    def _good_until(self, sent: float) -> float:
        return sent + self.ttl - safety_margin(self.ttl)

    def acquire(self) -> bool:
        """Take the lease if it is free or expired; ``True`` if this call holds it.

        Already held by this object: renews instead. On success :attr:`token` is the
        new fencing token (one more than the previous holder's).
        """
        if self.token is not None and not self._lost:
            return self.renew()
        sent = time.monotonic()
        token = _lease_sql(self.using).acquire(self.key, self.owner, self.ttl)
        with self._state:
            self.token = token
            self._lost = False
            self._deadline = self._good_until(sent)
        if token is None:
            logger.debug("lease busy key=%s owner=%s", self.key, self.owner)
            return False
        if time.monotonic() >= self._deadline:
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
            self.release()
            return False
        logger.debug("lease acquired key=%s owner=%s token=%s", self.key, self.owner, token)
        return True

    def renew(self) -> bool:
        """Extend the lease to ``now() + ttl``; ``False`` (and :attr:`lost`) if it was lost.

        Fenced on (key, owner, token): after a takeover it changes nothing. A lease whose
        local deadline already passed is not renewed (someone may hold it already).
        """
        token = self.token
        if token is None or self._lost:
            return False
        if time.monotonic() >= self._deadline:
            self._mark_lost("its deadline passed before it was renewed")
            return False
        sent = time.monotonic()
        ok = _lease_sql(self.using).renew(self.key, self.owner, token, self.ttl)
        if not ok:
            self._mark_lost("taken over: the renewal matched nothing")
        else:
            with self._state:
                if self.token == token and not self._lost:
                    self._deadline = self._good_until(sent)
            if time.monotonic() >= self._deadline:
                self._mark_lost("its renewal took longer than the lease")
                return False
        return ok

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
        with self._state:
            self.token = None
        if expired:
            return False
        try:
            ok = _lease_sql(self.using).release(self.key, self.owner, token)
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
            return False
        if not ok:
            self._mark_lost("taken over before release", token=token)
        else:
            logger.debug("lease released key=%s owner=%s token=%s", self.key, self.owner, token)
        return ok

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
            and not _lease_sql(self.using).verify(self.key, self.owner, token)
        ):
            self._mark_lost("taken over or broken (checked against the database)")
        if self.token is None:
            raise LockLost(f"lease {self.key!r} is not held (never taken, or released)")
        if not self.held:
            raise LockLost(
                f"lease {self.key!r} was lost (taken over, broken, or its deadline passed "
                "without a renewal)"
            )

    def _mark_lost(self, why: str, *, token: int | None = None) -> None:
        with self._state:
            already = self._lost
            self._lost = True
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
            self._renewer = _Renewer(self, self.renew_every)
            self._renewer.start()

    def _stop_renewer(self) -> None:
        renewer, self._renewer = self._renewer, None
        if renewer is not None:
            renewer.stop(timeout=max(1.0, self.seconds_left))

    def __enter__(self) -> LeaseLock:
        if self.token is not None and not self._lost:
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
            raise LockNotAcquired(f"lease {self.key!r} is held by another owner")
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
        if (lost or self._lost) and exc_type is None:
            raise LockLost(
                f"lease {self.key!r} was lost before the block ended (taken over, or its "
                "deadline passed without a renewal); the block ran partly without the lock"
            )


#: Alias of :class:`LeaseLock`.
lease_lock = LeaseLock


class _Renewer(threading.Thread):
    """Renews a lease every ``interval`` seconds on the thread's own connection.

    Never renews past the lease's local deadline; a statement that hangs (a black-holed
    network) does not keep :attr:`LeaseLock.held` true, and ``stop()`` does not wait for
    it beyond its timeout (the thread is a daemon)."""

    def __init__(self, lock: LeaseLock, interval: float) -> None:
        super().__init__(name=f"taskclaim-lease-{lock.key}", daemon=True)
        self.lock = lock
        self.interval = interval
        self._stop_event = threading.Event()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop_event.set()
        if self is not threading.current_thread():
            self.join(timeout)

    def run(self) -> None:
        lock = self.lock
        try:
            while not self._stop_event.wait(self.interval):
                if not lock.held:
                    if lock.token is not None and not lock._lost:
                        lock._mark_lost("its deadline passed: the database did not answer in time")
                    return
                try:
                    ok = lock.renew()
                except DatabaseError as exc:
                    logger.warning(
                        "lease renewal failed key=%s error=%s (held for %.1fs more at most)",
                        lock.key,
                        str(exc).strip().splitlines()[0] if str(exc).strip() else exc,
                        lock.seconds_left,
                    )
                    connections[lock.using].close()
                    continue
                if not ok:
                    return
        finally:
            connections[lock.using].close()


# ---------------------------------------------------------------- advisory locks


def _pg_func(*, xact: bool, shared: bool, try_: bool) -> str:
    """``pg_[try_]advisory_[xact_]lock[_shared]``."""
    return (
        f"pg_{'try_' if try_ else ''}advisory_{'xact_' if xact else ''}"
        f"lock{'_shared' if shared else ''}"
    )


_PG_LOCK_NOT_AVAILABLE = "55P03"
# GET_LOCK waits forever with a negative timeout on MySQL but fails on MariaDB.
_FOREVER = 365 * 24 * 3600


def _pg_args(key: tuple[int, ...]) -> str:
    return "CAST(%s AS bigint)" if len(key) == 1 else "CAST(%s AS integer), CAST(%s AS integer)"


def mysql_lock_name(key: object, using: str | None = None) -> str:
    """The ``GET_LOCK`` name used on MySQL / MariaDB for ``key`` on database ``using``.

    ``GET_LOCK`` names are server-wide while PostgreSQL advisory locks belong to one
    database, so the name carries the database name: ``tc:<database>:<int64>``
    (``tc:<database>:<a>,<b>`` for a pair). A database name that would push it past
    MySQL's 64 characters is replaced by the first 12 hex digits of its MD5.
    """
    norm = ",".join(str(part) for part in normalize_key(key))
    database = str(connections[using or DEFAULT_DB_ALIAS].settings_dict["NAME"])
    name = f"tc:{database}:{norm}"
    if len(name) > 64:
        short = hashlib.md5(database.encode(), usedforsecurity=False).hexdigest()[:12]
        name = f"tc:{short}:{norm}"
    return name


class AdvisoryLock:
    """An advisory lock; see :func:`advisory`. Use it through :func:`advisory`."""

    def __init__(
        self,
        key: object = None,
        *,
        shared: bool = False,
        xact: bool = True,
        wait: bool = True,
        timeout: float | None = None,
        using: str | None = None,
        on_fail: OnFail = "raise",
    ) -> None:
        if key is not None:
            normalize_key(key)
        if timeout is not None:
            if hasattr(timeout, "total_seconds"):
                timeout = timeout.total_seconds()
            if isinstance(timeout, bool) or not isinstance(timeout, int | float):
                raise LockUsageError(f"timeout is a number of seconds, got {timeout!r}")
            if not timeout >= 0 or not math.isfinite(timeout):
                raise LockUsageError(f"timeout must be >= 0 seconds, got {timeout!r}")
            if not wait:
                raise LockUsageError("timeout needs wait=True (wait=False never waits)")
            if timeout > PG_MAX_TIMEOUT:
                raise LockUsageError(
                    f"timeout is at most {PG_MAX_TIMEOUT:g} seconds (24 days), got {timeout!r}"
                )
        if on_fail not in ("raise", "return", "skip"):
            raise LockUsageError(f'on_fail is "raise", "return" or "skip", got {on_fail!r}')
        self.key = key
        self.shared = _flag(shared, "shared")
        self.xact = _flag(xact, "xact")
        self.wait = _flag(wait, "wait")
        self.timeout = timeout
        self.using = using or DEFAULT_DB_ALIAS
        self.on_fail = on_fail
        self._decorating = False
        # Per-thread, per-enter state (a stack per thread, so one object may be nested,
        # and one module-level object may be used by many threads at once).
        self._local = threading.local()

    @property
    def _stack(self) -> list[dict[str, Any]]:
        stack = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        return cast(list[dict[str, Any]], stack)

    def __repr__(self) -> str:
        scope = "xact" if self.xact else "session"
        mode = "shared" if self.shared else "exclusive"
        return f"<advisory key={self.key!r} {scope} {mode} using={self.using!r}>"

    def _copy(self, key: object) -> AdvisoryLock:
        lock = AdvisoryLock(
            key,
            shared=self.shared,
            xact=self.xact,
            wait=self.wait,
            timeout=self.timeout,
            using=self.using,
            on_fail=self.on_fail,
        )
        lock._decorating = True
        return lock

    # -- decorator
    def __call__(self, func: F) -> F:
        key = self.key if self.key is not None else _dotted_path(func)
        template = self._copy(key)

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            lock = template._copy(key)
            with lock as acquired:
                if not acquired:
                    logger.info(
                        "advisory lock not acquired, call skipped key=%s func=%s",
                        key,
                        _dotted_path(func),
                    )
                    return None
                return func(*args, **kwargs)

        return cast(F, wrapper)

    # -- context manager
    def __enter__(self) -> bool:
        if self.key is None:
            raise LockUsageError("advisory() needs a key (only a decorator derives one)")
        if self.on_fail == "skip" and not self._decorating:
            raise LockUsageError(
                'on_fail="skip" applies to decorated functions; a with-block cannot be '
                'skipped: use on_fail="return" and test the value'
            )
        key = normalize_key(self.key)
        conn = connections[self.using]
        vendor = conn.vendor
        if vendor == "postgresql":
            if not self.xact and taskclaim_settings.POOLER_MODE is None:
                _refuse_if_proxied(conn)
            if not self.xact and taskclaim_settings.POOLER_MODE == "transaction":
                raise LockUsageError(
                    "session-scope advisory locks (xact=False) are refused because "
                    'TASKCLAIM_POOLER_MODE = "transaction": behind a transaction pooler '
                    "each transaction may run on another server connection, so a session "
                    "lock would be held by a connection other clients then use (and would "
                    "not exclude them). Use xact=True (the default) or a LeaseLock."
                )
        elif vendor == "mysql":
            if self.shared:
                raise LockUsageError(
                    "MySQL/MariaDB named locks (GET_LOCK) have no shared mode; use "
                    "shared=False, or PostgreSQL for shared advisory locks"
                )
            if self.xact and in_user_atomic(self.using):
                raise LockUsageError(
                    "MySQL/MariaDB have no transaction-scoped named locks: advisory(xact=True) "
                    "opens its own transaction around the block and releases the lock after "
                    "it commits, so it cannot run inside an atomic() block. Enter it outside "
                    "the transaction, or use xact=False (released when the block ends)."
                )
        else:
            raise LockUsageError(
                f"advisory locks need PostgreSQL or MySQL/MariaDB; {vendor} has none. "
                "Use a lease lock instead: LeaseLock(key, ttl) or "
                'singleton(key, backend="lease").'
            )
        state: dict[str, Any] = {"key": key, "vendor": vendor, "atomic": None}
        self._stack.append(state)
        try:
            # Transaction scope: the lock lives as long as the transaction. Open one
            # unless the caller has (then it is held until the caller's commit/rollback).
            if self.xact and (not conn.in_atomic_block or vendor == "mysql"):
                state["atomic"] = transaction.atomic(using=self.using)
                state["atomic"].__enter__()
            acquired = self._acquire(conn, key, vendor)
        except BaseException as exc:
            self._abort(state, exc)
            raise
        state["acquired"] = acquired
        if acquired:
            state["raw"] = conn.connection
            logger.debug("advisory lock acquired key=%s using=%s", self.key, self.using)
            return True
        if self.on_fail == "raise":
            self._abort(state)
            what = "timed out" if self.timeout else "is held elsewhere"
            raise LockNotAcquired(f"advisory lock {self.key!r} {what}")
        return False

    def _abort(self, state: dict[str, Any], exc: BaseException | None = None) -> None:
        if self._stack and self._stack[-1] is state:
            self._stack.pop()
        if state["atomic"] is not None:
            exc_type = type(exc) if exc is not None else None
            tb = exc.__traceback__ if exc is not None else None
            state["atomic"].__exit__(exc_type, exc, tb)

    def _acquire(self, conn: Any, key: tuple[int, ...], vendor: str) -> bool:
        if vendor == "mysql":
            timeout = 0 if not self.wait else (_FOREVER if self.timeout is None else self.timeout)
            with conn.cursor() as cursor:
                name = mysql_lock_name(self.key, self.using)
                cursor.execute("SELECT GET_LOCK(%s, %s)", (name, timeout))
                (got,) = cursor.fetchone()
            if got is None:
                raise DatabaseError(f"GET_LOCK({name!r}) failed")
            return bool(got)
        try_ = not self.wait or self.timeout == 0
        func = _pg_func(xact=self.xact, shared=self.shared, try_=try_)
        sql = f"SELECT {func}({_pg_args(key)})"
        if try_ or self.timeout is None:
            with conn.cursor() as cursor:
                cursor.execute(sql, key)
                (got,) = cursor.fetchone()
            return bool(got) if try_ else True  # the waiting forms return void
        millis = max(1, math.ceil(self.timeout * 1000))
        try:
            # A savepoint: a lock_timeout error rolls back to it and leaves the
            # caller's transaction usable; lock_timeout is restored afterwards.
            with transaction.atomic(using=self.using), conn.cursor() as cursor:
                cursor.execute("SELECT current_setting('lock_timeout')")
                (previous,) = cursor.fetchone()
                cursor.execute("SELECT set_config('lock_timeout', %s, true)", (f"{millis}ms",))
                cursor.execute(sql, key)
                cursor.execute("SELECT set_config('lock_timeout', %s, true)", (previous,))
        except DatabaseError as exc:
            cause = exc.__cause__ or exc
            if getattr(cause, "sqlstate", None) == _PG_LOCK_NOT_AVAILABLE:
                return False
            raise
        return True

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        state = self._stack.pop()
        conn = connections[self.using]
        lost: str | None = None
        try:
            if state["vendor"] == "postgresql" and state["atomic"] is not None:
                state["atomic"].__exit__(exc_type, exc, tb)
            elif state["vendor"] == "mysql" and state["atomic"] is not None:
                # commit first, then let the next holder in
                state["atomic"].__exit__(exc_type, exc, tb)
        finally:
            if state.get("acquired") and (not self.xact or state["vendor"] == "mysql"):
                lost = self._release_session(conn, state)
        if lost and exc_type is None:
            raise LockLost(lost)
        if lost:
            logger.error("advisory lock lost key=%s: %s", self.key, lost)

    def _release_session(self, conn: Any, state: dict[str, Any]) -> str | None:
        """Release a session-level lock; return why it was lost, or None."""
        if conn.connection is None or conn.connection is not state["raw"]:
            return (
                f"session advisory lock {self.key!r} was lost with its connection "
                "(closed or replaced while the block ran)"
            )
        key = state["key"]
        try:
            with conn.cursor() as cursor:
                if state["vendor"] == "mysql":
                    name = mysql_lock_name(self.key, self.using)
                    cursor.execute("SELECT RELEASE_LOCK(%s)", (name,))
                else:
                    func = "pg_advisory_unlock_shared" if self.shared else "pg_advisory_unlock"
                    cursor.execute(f"SELECT {func}({_pg_args(key)})", key)
                (released,) = cursor.fetchone()
        except DatabaseError as exc:
            if not conn.in_atomic_block:
                conn.close_if_unusable_or_obsolete()
            return (
                f"session advisory lock {self.key!r} was lost with its connection "
                f"(release failed: {exc})"
            )
        if not released:
            return f"session advisory lock {self.key!r} was no longer held at release"
        return None


#: PostgreSQL's ``lock_timeout`` is an int32 of milliseconds.
PG_MAX_TIMEOUT = (2**31 - 1) / 1000


def _refuse_if_proxied(conn: Any) -> None:
    """Refuse session locks when something sits between Django and PostgreSQL.

    PostgreSQL reports the port it accepted the connection on (``inet_server_port()``);
    when that is not the port Django connected to, a pooler or proxy is in between. A
    transaction pooler would hand the session lock to a server connection other clients
    then use, so it would exclude nobody: unless ``TASKCLAIM_POOLER_MODE`` says what is
    there, the lock is refused. Checked once per database connection.
    """
    if conn.connection is None:
        conn.ensure_connection()
    raw = conn.connection
    if getattr(conn, "_taskclaim_checked_proxy", None) is raw:
        return
    configured = conn.settings_dict.get("PORT") or 5432
    host = str(conn.settings_dict.get("HOST") or "")
    with conn.cursor() as cursor:
        cursor.execute("SELECT inet_server_port()")
        (server_port,) = cursor.fetchone()
    if server_port is not None and not host.startswith("/") and int(configured) != server_port:
        raise LockUsageError(
            f"session-scope advisory locks (xact=False) are refused: Django connects to port "
            f"{configured} but PostgreSQL accepted the connection on port {server_port}, so "
            "a pooler or proxy sits between. Behind pgBouncer in transaction mode a session "
            "lock would stay on a server connection other clients use and exclude nobody. "
            'Declare TASKCLAIM_POOLER_MODE = "session" if it is a session pooler or a plain '
            'proxy, "transaction" if it pools transactions; or use xact=True / a LeaseLock.'
        )
    conn._taskclaim_checked_proxy = raw


def advisory(
    key: object = None,
    *,
    shared: bool = False,
    xact: bool = True,
    wait: bool = True,
    timeout: float | None = None,
    using: str | None = None,
    on_fail: OnFail = "raise",
) -> Any:
    """An advisory lock on ``key``, as a context manager or a decorator.

    ``key``: an int (signed 64-bit), a pair of int32, or a non-empty string (hashed by
    :func:`advisory_key`); omitted on a decorator, the function's dotted path.

    - ``xact=True`` (default): transaction scope. The block runs inside a transaction
      (opened if none is) and the lock is released when that transaction ends — at
      the end of the block, or at the caller's own commit/rollback if the block ran
      inside the caller's ``atomic()``. Works behind pgBouncer in transaction pooling.
      On MySQL/MariaDB the block gets its own transaction and the named lock is
      released right after it commits.
    - ``xact=False``: session scope, released at the end of the block; re-entrant (a
      nested block on the same key keeps it until the outer block ends). Refused when
      ``TASKCLAIM_POOLER_MODE = "transaction"``. If the connection was lost meanwhile
      the exit raises :class:`LockLost`.
    - ``shared=True``: shared mode (PostgreSQL only).
    - ``wait=False``: try once; ``timeout=s``: wait at most ``s`` seconds (PostgreSQL
      ``lock_timeout`` inside a savepoint, so a timeout leaves the caller's transaction
      usable; MySQL ``GET_LOCK`` timeout).
    - ``on_fail`` when not acquired: ``"raise"`` :class:`LockNotAcquired`; ``"return"``
      — the with-statement yields ``False``; a decorated function is not called and
      returns ``None``; ``"skip"`` — decorated functions only: not called, logged.

    As a context manager it yields ``True`` when acquired. SQLite has no advisory locks
    (use :class:`LeaseLock`). Bad keys/options raise :class:`LockUsageError`.
    """
    if callable(key) and not isinstance(key, str | int | tuple | list):
        # bare ``@advisory``
        return AdvisoryLock(
            None,
            shared=shared,
            xact=xact,
            wait=wait,
            timeout=timeout,
            using=using,
            on_fail=on_fail,
        )(key)
    return AdvisoryLock(
        key,
        shared=shared,
        xact=xact,
        wait=wait,
        timeout=timeout,
        using=using,
        on_fail=on_fail,
    )


# --------------------------------------------------------------------- singleton


def singleton(
    key: Any = None,
    *,
    ttl: float | None = None,
    backend: Literal["lease", "advisory"] = "lease",
    using: str | None = None,
    xact: bool = True,
) -> Any:
    """Decorate a function so it runs only where the lock on ``key`` was won.

    Where the lock is held elsewhere the call is skipped: it returns :data:`SKIPPED`
    (falsy) and logs ``singleton skipped key=… backend=…`` at INFO. ``key`` defaults to
    the function's dotted path.

    - ``backend="lease"`` (default, every database, any pooler): a :class:`LeaseLock`
      of ``ttl`` seconds (default ``TASKCLAIM_LEASE``), renewed in the background while
      the function runs, released when it returns. If the lease is lost meanwhile the
      call raises :class:`LockLost` after the function returns.
    - ``backend="advisory"`` (PostgreSQL, MySQL/MariaDB): a non-waiting
      :func:`advisory` lock, transaction scope unless ``xact=False``; ``ttl`` unused.
    """
    if backend not in ("lease", "advisory"):
        raise LockUsageError(f'singleton backend is "lease" or "advisory", got {backend!r}')
    if backend == "lease":
        ttl = _validate_ttl(ttl)
        if key is not None and not callable(key):
            _validate_lease_key(key)
    elif key is not None and not callable(key):
        normalize_key(key)

    def decorate(func: F) -> F:
        name = key if key is not None else _dotted_path(func)

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if backend == "lease":
                lock = LeaseLock(name, ttl, using=using, auto_renew=True)
                try:
                    lock.__enter__()
                except LockNotAcquired:
                    _log_skip(name, backend)
                    return SKIPPED
                try:
                    result = func(*args, **kwargs)
                except BaseException as exc:
                    lock.__exit__(type(exc), exc, exc.__traceback__)
                    raise
                lock.__exit__(None, None, None)
                return result
            with AdvisoryLock(name, xact=xact, wait=False, using=using, on_fail="return") as got:
                if not got:
                    _log_skip(name, backend)
                    return SKIPPED
                return func(*args, **kwargs)

        return cast(F, wrapper)

    if callable(key):  # bare ``@singleton``
        func, key = key, None
        return decorate(func)
    return decorate


def _log_skip(key: Any, backend: str) -> None:
    logger.info("singleton skipped key=%s backend=%s reason=held-elsewhere", key, backend)
