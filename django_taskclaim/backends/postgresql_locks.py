"""What django-taskclaim sends to PostgreSQL for its locks: the lease statements
(``INSERT … ON CONFLICT … RETURNING``), ``pg_advisory_*`` locks, ``lock_timeout`` and the
server port. :class:`PostgreSQLLocks` is a part of
:class:`~django_taskclaim.backends.postgresql.PostgreSQL` (see ``base_locks.py`` for what
each statement must do)."""

from __future__ import annotations

from typing import Any, ClassVar

from django_taskclaim.backends.base_locks import AdvisoryKind, LeaseTable, LockSQL
from django_taskclaim.backends.statement import Statement


def advisory_function(*, xact: bool, shared: bool, try_: bool) -> str:
    """``pg_[try_]advisory_[xact_]lock[_shared]``."""
    return (
        f"pg_{'try_' if try_ else ''}advisory_{'xact_' if xact else ''}"
        f"lock{'_shared' if shared else ''}"
    )


def advisory_args(arity: int) -> str:
    """The placeholders of a key: one ``bigint`` or two ``integer`` halves."""
    return "CAST(%s AS bigint)" if arity == 1 else "CAST(%s AS integer), CAST(%s AS integer)"


class PostgreSQLLocks(LockSQL):
    """PostgreSQL's lease and advisory lock statements."""

    # --------------------------------------------------------------------- lease locks

    supports_lease_locks = True
    # clock_timestamp(), not statement_timestamp(): a statement that waited on the row's
    # lock must count the lease from when it writes, and judge expiry at that moment.
    lease_now: ClassVar[str] = "clock_timestamp()"

    def lease_acquire_sql(self, t: LeaseTable) -> str:
        """One upsert that takes a free or ended lease and returns its new token (no row
        when the lease is held). Parameters: key, owner, ttl in seconds."""
        n = self.lease_now
        return (
            f"INSERT INTO {t.table} ({t.key}, {t.owner}, {t.token}, {t.until}, "
            f"{t.acquired_at}) VALUES (%s, %s, 1, {n} + %s * interval '1 second', {n}) "
            f"ON CONFLICT ({t.key}) DO UPDATE SET {t.owner} = EXCLUDED.{t.owner}, "
            f"{t.token} = {t.table}.{t.token} + 1, {t.until} = EXCLUDED.{t.until}, "
            f"{t.acquired_at} = EXCLUDED.{t.acquired_at} WHERE {t.table}.{t.until} <= {n} "
            f"RETURNING {t.token}"
        )

    def lease_acquire(
        self, cursor: Any, t: LeaseTable, key: str, owner: str, ttl: float
    ) -> int | None:
        """See :meth:`DatabaseSQL.lease_acquire`: :meth:`lease_acquire_sql`."""
        cursor.execute(self.lease_acquire_sql(t), (key, owner, ttl))
        rows = cursor.fetchall()
        return int(rows[0][0]) if rows else None

    def lease_renew_sql(self, t: LeaseTable) -> str:
        """Move the end of the fenced lease. Parameters: ttl in seconds, key, owner, token."""
        return (
            f"UPDATE {t.table} SET {t.until} = {self.lease_now} + %s * interval '1 second' "
            f"WHERE {t.key} = %s AND {t.owner} = %s AND {t.token} = %s"
        )

    def lease_renew(
        self, cursor: Any, t: LeaseTable, key: str, owner: str, token: int, ttl: float
    ) -> bool:
        """See :meth:`DatabaseSQL.lease_renew`: :meth:`lease_renew_sql`."""
        cursor.execute(self.lease_renew_sql(t), (ttl, key, owner, token))
        return bool(cursor.rowcount == 1)

    # lease_verify / lease_release: the base class's statements.

    # ------------------------------------------------------------------ advisory locks

    advisory_kind: ClassVar[AdvisoryKind] = "keyed"

    def advisory_lock_id(self, key: tuple[int, ...], database: str) -> tuple[Any, ...]:
        """The key itself: advisory locks belong to the database already."""
        return key

    def advisory_lock(
        self,
        lock_id: tuple[Any, ...],
        *,
        xact: bool,
        shared: bool,
        try_: bool,
        timeout: float | None,
    ) -> Statement:
        """``SELECT pg_[try_]advisory_[xact_]lock[_shared](key)``; ``timeout`` is not part
        of it (see :meth:`set_lock_timeout`)."""
        func = advisory_function(xact=xact, shared=shared, try_=try_)
        return Statement(f"SELECT {func}({advisory_args(len(lock_id))})", lock_id)

    def advisory_acquired(self, value: Any, lock_id: tuple[Any, ...], *, try_: bool) -> bool:
        """The ``try`` forms return whether they took it; the waiting forms return void
        once they have."""
        return bool(value) if try_ else True

    def advisory_unlock(self, lock_id: tuple[Any, ...], *, shared: bool) -> Statement:
        """``SELECT pg_advisory_unlock[_shared](key)``."""
        func = "pg_advisory_unlock_shared" if shared else "pg_advisory_unlock"
        return Statement(f"SELECT {func}({advisory_args(len(lock_id))})", lock_id)

    def get_lock_timeout(self) -> Statement:
        """``current_setting('lock_timeout')``."""
        return Statement("SELECT current_setting('lock_timeout')")

    def set_lock_timeout(self, value: str) -> Statement:
        """``set_config('lock_timeout', value, true)``: local to the transaction."""
        return Statement("SELECT set_config('lock_timeout', %s, true)", (value,))

    def server_port(self) -> Statement:
        """``inet_server_port()`` (``NULL`` over a Unix socket)."""
        return Statement("SELECT inet_server_port()")
