"""Advisory locks: PostgreSQL advisory locks and MySQL / MariaDB ``GET_LOCK``, as a
context manager or a decorator (:func:`advisory`). The statements are the vendor's, in
:mod:`django_taskclaim.backends`."""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable
from types import TracebackType
from typing import Any, Literal, TypeVar, cast

from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections, transaction

from django_taskclaim.backends import DatabaseSQL, for_connection
from django_taskclaim.backends.mysql import lock_name
from django_taskclaim.config.settings import taskclaim_settings
from django_taskclaim.db import in_user_atomic, is_lock_timeout
from django_taskclaim.exceptions import LockLost, LockNotAcquired, LockUsageError
from django_taskclaim.locks.keys import dotted_path, normalize_key
from django_taskclaim.locks.state import Entered, EntryStack

logger = logging.getLogger("django_taskclaim.locks")

F = TypeVar("F", bound=Callable[..., Any])

OnFail = Literal["raise", "return", "skip"]

#: PostgreSQL's ``lock_timeout`` is an int32 of milliseconds.
PG_MAX_TIMEOUT = (2**31 - 1) / 1000


def _flag(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        raise LockUsageError(f"{name} is True or False, got {value!r}")
    return value


def mysql_lock_name(key: object, using: str | None = None) -> str:
    """The ``GET_LOCK`` name used on MySQL / MariaDB for ``key`` on database ``using``.

    ``GET_LOCK`` names are server-wide while PostgreSQL advisory locks belong to one
    database, so the name carries the database name: ``tc:<database>:<int64>``
    (``tc:<database>:<a>,<b>`` for a pair). A database name that would push it past
    MySQL's 64 characters is replaced by the first 12 hex digits of its MD5.
    """
    database = str(connections[using or DEFAULT_DB_ALIAS].settings_dict["NAME"])
    return lock_name(normalize_key(key), database)


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
        self._entries = EntryStack()

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
        key = self.key if self.key is not None else dotted_path(func)
        template = self._copy(key)

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            lock = template._copy(key)
            with lock as acquired:
                if not acquired:
                    logger.info(
                        "advisory lock not acquired, call skipped key=%s func=%s",
                        key,
                        dotted_path(func),
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
        sql = for_connection(conn)
        self._refuse_unfit(conn, sql)
        lock_id = sql.advisory_lock_id(key, str(conn.settings_dict["NAME"]))
        entered = self._take(conn, sql, lock_id)
        if entered.acquired:
            self._entries.stack.append(entered)
            logger.debug("advisory lock acquired key=%s using=%s", self.key, self.using)
            return True
        if self.on_fail == "raise":
            entered.end_transaction()
            what = "timed out" if self.timeout else "is held elsewhere"
            raise LockNotAcquired(f"advisory lock {self.key!r} {what}")
        self._entries.stack.append(entered)
        return False

    def _refuse_unfit(self, conn: Any, sql: DatabaseSQL) -> None:
        """Raise :class:`LockUsageError` where this lock cannot do what it says: a
        database without advisory locks, a session lock behind a transaction pooler, a
        shared or in-transaction MySQL/MariaDB named lock."""
        if sql.advisory_kind is None:
            raise LockUsageError(
                f"advisory locks need PostgreSQL or MySQL/MariaDB; {sql.vendor} has none. "
                "Use a lease lock instead: LeaseLock(key, ttl) or "
                'singleton(key, backend="lease").'
            )
        if not self.xact and sql.pooler_mode_applies:
            if taskclaim_settings.POOLER_MODE is None:
                refuse_if_proxied(conn, sql)
            if taskclaim_settings.POOLER_MODE == "transaction":
                raise LockUsageError(
                    "session-scope advisory locks (xact=False) are refused because "
                    'TASKCLAIM_POOLER_MODE = "transaction": behind a transaction pooler '
                    "each transaction may run on another server connection, so a session "
                    "lock would be held by a connection other clients then use (and would "
                    "not exclude them). Use xact=True (the default) or a LeaseLock."
                )
        # Named locks (GET_LOCK) are exclusive and session-scope only.
        named = sql.advisory_kind == "named"
        if named and self.shared:
            raise LockUsageError(
                "MySQL/MariaDB named locks (GET_LOCK) have no shared mode; use "
                "shared=False, or PostgreSQL for shared advisory locks"
            )
        if named and self.xact and in_user_atomic(self.using):
            raise LockUsageError(
                "MySQL/MariaDB have no transaction-scoped named locks: advisory(xact=True) "
                "opens its own transaction around the block and releases the lock after "
                "it commits, so it cannot run inside an atomic() block. Enter it outside "
                "the transaction, or use xact=False (released when the block ends)."
            )

    def _take(self, conn: Any, sql: DatabaseSQL, lock_id: tuple[Any, ...]) -> Entered:
        """Ask for the lock (in a transaction of the block's own where its scope needs
        one; rolled back if asking raises) and say what the exit will need."""
        named = sql.advisory_kind == "named"
        atomic: transaction.Atomic | None = None
        try:
            # Transaction scope: the lock lives as long as the transaction. Open one
            # unless the caller has (then it is held until the caller's commit/rollback).
            # A named lock is released after the commit of a transaction of its own.
            if self.xact and (not conn.in_atomic_block or named):
                atomic = transaction.atomic(using=self.using)
                atomic.__enter__()
            acquired = self._acquire(conn, sql, lock_id)
        except BaseException as exc:
            if atomic is not None:
                atomic.__exit__(type(exc), exc, exc.__traceback__)
            raise
        return Entered(
            lock_id=lock_id,
            session=not self.xact or named,
            atomic=atomic,
            acquired=acquired,
            raw=conn.connection if acquired else None,
        )

    def _acquire(self, conn: Any, sql: DatabaseSQL, lock_id: tuple[Any, ...]) -> bool:
        try_ = not self.wait or self.timeout == 0
        lock = sql.advisory_lock(
            lock_id, xact=self.xact, shared=self.shared, try_=try_, timeout=self.timeout
        )
        if try_ or self.timeout is None or sql.advisory_kind == "named":
            with conn.cursor() as cursor:
                cursor.execute(*lock)
                (got,) = cursor.fetchone()
            return sql.advisory_acquired(got, lock_id, try_=try_)
        millis = max(1, math.ceil(self.timeout * 1000))
        try:
            # A savepoint: a lock_timeout error rolls back to it and leaves the
            # caller's transaction usable; lock_timeout is restored afterwards.
            with transaction.atomic(using=self.using), conn.cursor() as cursor:
                cursor.execute(*sql.get_lock_timeout())
                (previous,) = cursor.fetchone()
                cursor.execute(*sql.set_lock_timeout(f"{millis}ms"))
                cursor.execute(*lock)
                cursor.execute(*sql.set_lock_timeout(previous))
        except DatabaseError as exc:
            if is_lock_timeout(exc, self.using):
                return False
            raise
        return True

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        entered = self._entries.stack.pop()
        conn = connections[self.using]
        lost: str | None = None
        try:
            # end the transaction first; a named lock is released after it (below)
            if entered.atomic is not None:
                entered.atomic.__exit__(exc_type, exc, tb)
        finally:
            if entered.acquired and entered.session:
                lost = self._release_session(conn, entered)
        if lost and exc_type is None:
            raise LockLost(lost)
        if lost:
            logger.error("advisory lock lost key=%s: %s", self.key, lost)

    def _release_session(self, conn: Any, entered: Entered) -> str | None:
        """Release a session-level lock; return why it was lost, or None."""
        if conn.connection is None or conn.connection is not entered.raw:
            return (
                f"session advisory lock {self.key!r} was lost with its connection "
                "(closed or replaced while the block ran)"
            )
        unlock = for_connection(conn).advisory_unlock(entered.lock_id, shared=self.shared)
        try:
            with conn.cursor() as cursor:
                cursor.execute(*unlock)
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


def refuse_if_proxied(conn: Any, sql: DatabaseSQL) -> None:
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
    configured = conn.settings_dict.get("PORT") or sql.default_port
    if configured is None:
        return  # nothing to compare the server's port with
    host = str(conn.settings_dict.get("HOST") or "")
    with conn.cursor() as cursor:
        cursor.execute(*sql.server_port())
        (server_port,) = cursor.fetchone()
    # Django dials TCP (a host that is not a socket directory) but the server saw a Unix
    # socket (no port): something accepted the TCP connection and reached the server
    # through its socket, as pgBouncer beside an embedded or socket-only PostgreSQL does.
    dialled_tcp = bool(host) and not host.startswith("/")
    other_port = server_port is not None and not host.startswith("/")
    if (other_port and int(configured) != server_port) or (dialled_tcp and server_port is None):
        raise LockUsageError(
            f"session-scope advisory locks (xact=False) are refused: Django connects to port "
            f"{configured} but PostgreSQL accepted the connection "
            + (f"on port {server_port}" if server_port is not None else "on a Unix socket")
            + ", so a pooler or proxy sits between. Behind pgBouncer in transaction mode a session "
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
