"""The lock statements every vendor class has: lease locks and advisory locks.

:class:`LockSQL` is the part of :class:`~django_taskclaim.backends.base.DatabaseSQL`
(which subclasses it) that :mod:`django_taskclaim.locks` asks: the ``taskclaim.Lease``
statements (``lease_*``, on a :class:`LeaseTable`), advisory locks (``advisory_*``, what
they are: :data:`AdvisoryKind`), the lock wait timeout and the server port. The defaults
here say "not supported"; ``postgresql_locks.py``, ``mysql.py`` and ``sqlite.py`` implement
them. The conventions are those of ``base.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal, cast

from django.apps import apps

from django_taskclaim.backends.statement import Statement

#: What a vendor's advisory locks are: ``"keyed"`` (PostgreSQL: int64 or int32-pair keys,
#: transaction or session scope, shared or exclusive), ``"named"`` (MySQL / MariaDB
#: ``GET_LOCK``: a string name, session scope, exclusive only), or ``None`` (none).
AdvisoryKind = Literal["keyed", "named"] | None


@dataclass(frozen=True)
class LeaseTable:
    """The ``taskclaim.Lease`` table and its columns, quoted for one connection."""

    table: str
    key: str
    owner: str
    token: str
    until: str
    acquired_at: str

    @classmethod
    def of(cls, connection: Any) -> LeaseTable:
        """The quoted names on ``connection`` (its ``ops.quote_name``)."""
        # Looked up in the app registry, not imported: the models sit above the backends.
        qn = connection.ops.quote_name
        meta = apps.get_model("taskclaim", "Lease")._meta
        key, owner, token, until, acquired_at = (
            qn(cast(Any, meta.get_field(name)).column)
            for name in ("key", "owner", "token", "locked_until", "acquired_at")
        )
        return cls(qn(meta.db_table), key, owner, token, until, acquired_at)


class LockSQL:
    """The lock statements of one database vendor (see the module docstring)."""

    #: Django's ``connection.vendor`` this class speaks to (set by ``DatabaseSQL``).
    vendor: str

    # --------------------------------------------------------------------- lease locks

    #: Whether lease locks work here (the lease statements below are implemented).
    supports_lease_locks: ClassVar[bool] = False
    #: The database clock in the lease statements (``%`` doubled where it has one). It must
    #: advance while a statement waits on a row lock, or be read once the row is locked.
    lease_now: ClassVar[str] = ""

    def lease_acquire(
        self, cursor: Any, t: LeaseTable, key: str, owner: str, ttl: float
    ) -> int | None:
        """Take the lease of ``key`` for ``owner`` until the database clock + ``ttl``
        seconds, if the key is free or its lease has ended; return the new fencing token
        (the previous one plus 1; 1 for a new key), or ``None`` when it is held. One atomic
        decision: two racing calls never both get a token."""
        raise NotImplementedError(f"lease locks do not support the {self.vendor} database")

    def lease_renew(
        self, cursor: Any, t: LeaseTable, key: str, owner: str, token: int, ttl: float
    ) -> bool:
        """Move the end of the lease held by (``key``, ``owner``, ``token``) to the database
        clock + ``ttl`` seconds; ``False`` when that lease is not there any more (taken
        over: the token moved on)."""
        raise NotImplementedError(f"lease locks do not support the {self.vendor} database")

    def lease_verify_sql(self, t: LeaseTable) -> str:
        """``SELECT 1`` where (key, owner, token) holds a lease that has not ended.

        Parameters: key, owner, token."""
        return (
            f"SELECT 1 FROM {t.table} WHERE {t.key} = %s AND {t.owner} = %s "
            f"AND {t.token} = %s AND {t.until} > {self.lease_now}"
        )

    def lease_verify(self, cursor: Any, t: LeaseTable, key: str, owner: str, token: int) -> bool:
        """Whether (``key``, ``owner``, ``token``) holds a lease that has not ended."""
        cursor.execute(self.lease_verify_sql(t), (key, owner, token))
        return bool(cursor.fetchall())

    def lease_release_sql(self, t: LeaseTable) -> str:
        """End the lease of (key, owner, token) now, never later than it would have ended;
        the row stays, so the next holder's token keeps growing.

        Parameters: key, owner, token."""
        return (
            f"UPDATE {t.table} SET {t.until} = LEAST({t.until}, {self.lease_now}) "
            f"WHERE {t.key} = %s AND {t.owner} = %s AND {t.token} = %s"
        )

    def lease_release(self, cursor: Any, t: LeaseTable, key: str, owner: str, token: int) -> bool:
        """End the lease of (``key``, ``owner``, ``token``) now; ``False`` when that lease
        is not there any more (a stale holder releases nothing)."""
        cursor.execute(self.lease_release_sql(t), (key, owner, token))
        return bool(cursor.rowcount == 1)

    # ------------------------------------------------------------------ advisory locks

    #: What this vendor's advisory locks are (see :data:`AdvisoryKind`).
    advisory_kind: ClassVar[AdvisoryKind] = None

    def advisory_lock_id(self, key: tuple[int, ...], database: str) -> tuple[Any, ...]:
        """The parameters naming the lock of the normalized ``key`` (``(int64,)`` or
        ``(int32, int32)``) on the database called ``database``."""
        raise NotImplementedError(f"{self.vendor} has no advisory locks")

    def advisory_lock(
        self,
        lock_id: tuple[Any, ...],
        *,
        xact: bool,
        shared: bool,
        try_: bool,
        timeout: float | None,
    ) -> Statement:
        """Take the lock ``lock_id`` (from :meth:`advisory_lock_id`); the statement returns
        one value, read by :meth:`advisory_acquired`.

        ``try_``: do not wait. Otherwise wait at most ``timeout`` seconds (``None``: no
        limit) where the statement itself can be bounded; a ``"keyed"`` vendor waits
        without limit here and is bounded by :meth:`set_lock_timeout` instead.
        """
        raise NotImplementedError(f"{self.vendor} has no advisory locks")

    def advisory_acquired(self, value: Any, lock_id: tuple[Any, ...], *, try_: bool) -> bool:
        """Whether the value the :meth:`advisory_lock` statement returned means taken;
        raises :class:`~django.db.DatabaseError` when it means the statement failed."""
        raise NotImplementedError(f"{self.vendor} has no advisory locks")

    def advisory_unlock(self, lock_id: tuple[Any, ...], *, shared: bool) -> Statement:
        """Release one hold of the session-scope lock ``lock_id``; the statement returns a
        value that is true when the session held it."""
        raise NotImplementedError(f"{self.vendor} has no advisory locks")

    def get_lock_timeout(self) -> Statement:
        """Read the session's lock wait timeout (returns one text value)."""
        raise NotImplementedError(f"{self.vendor} has no lock timeout setting")

    def set_lock_timeout(self, value: str) -> Statement:
        """Set the lock wait timeout to ``value`` (as :meth:`get_lock_timeout` returns it, or
        ``"<n>ms"``) until the end of the current transaction."""
        raise NotImplementedError(f"{self.vendor} has no lock timeout setting")

    def server_port(self) -> Statement:
        """The port the server accepted this connection on (returns one integer or
        ``NULL``): compared with the configured one, it tells a pooler or proxy is between."""
        raise NotImplementedError(f"{self.vendor} does not report its server port")
