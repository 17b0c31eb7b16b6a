"""What django-taskclaim sends to MySQL and MariaDB."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from django.db import DatabaseError

from django_taskclaim.backends.base import DatabaseSQL, event_table
from django_taskclaim.backends.base_locks import AdvisoryKind, LeaseTable
from django_taskclaim.backends.statement import Statement

#: Error codes worth a retry: ER_LOCK_DEADLOCK, ER_LOCK_WAIT_TIMEOUT.
TRANSIENT_ERRORS = frozenset({1213, 1205})
#: ER_DUP_ENTRY: an INSERT or UPDATE met an equal value in a unique key.
ER_DUP_ENTRY = 1062
#: ``GET_LOCK`` waits forever with a negative timeout on MySQL but fails on MariaDB: "no
#: limit" is a year.
GET_LOCK_FOREVER = 365 * 24 * 3600
#: Longest ``GET_LOCK`` name.
MAX_LOCK_NAME = 64


def lock_name(key: tuple[int, ...], database: str) -> str:
    """The ``GET_LOCK`` name of the normalized ``key`` on the database ``database``.

    ``GET_LOCK`` names are server-wide, so the name carries the database name:
    ``tc:<database>:<int64>`` (``tc:<database>:<a>,<b>`` for a pair). A database name that
    would push it past :data:`MAX_LOCK_NAME` characters is replaced by the first 12 hex
    digits of its MD5.
    """
    norm = ",".join(str(part) for part in key)
    name = f"tc:{database}:{norm}"
    if len(name) > MAX_LOCK_NAME:
        short = hashlib.md5(database.encode(), usedforsecurity=False).hexdigest()[:12]
        name = f"tc:{short}:{norm}"
    return name


class MySQL(DatabaseSQL):
    """MySQL / MariaDB: ``INSERT … ON DUPLICATE KEY UPDATE`` leases, ``GET_LOCK`` locks."""

    vendor = "mysql"
    engine_marker = "mysql"
    default_port = 3306

    # ------------------------------------------------------------------------- clock

    #: ``UTC_TIMESTAMP(6)``, not ``CURRENT_TIMESTAMP`` / ``NOW()``, which follow each
    #: session's ``time_zone`` and would put two sessions in different zones (or a server
    #: across a daylight-saving change) hours apart on the same ``DATETIME`` columns.
    #: Django stores aware datetimes as naive UTC here.
    clock_sql: ClassVar[str] = "UTC_TIMESTAMP(6)"
    clock_known = True

    def now_sql(self, *, use_tz: bool = True) -> str:
        """:attr:`clock_sql`; without ``USE_TZ`` naive datetimes are stored in the
        session's zone, so the clock is the session's: ``CURRENT_TIMESTAMP(6)``."""
        return self.clock_sql if use_tz else "CURRENT_TIMESTAMP(6)"

    durability_sql: ClassVar[str | None] = "SELECT @@innodb_flush_log_at_trx_commit"

    def commit_durability(self, value: Any) -> tuple[str, str] | None:
        """``innodb_flush_log_at_trx_commit``: ``1`` writes and flushes the log at each
        commit; ``2`` only writes it (an operating-system crash or power loss forgets up
        to a second of commits); ``0`` neither (a crash of the server process does)."""
        setting = str(value)
        if setting == "0":
            return (
                "error",
                "innodb_flush_log_at_trx_commit is 0: a crash of the server forgets up to "
                "a second of commits, claims whose workers already run their tasks included",
            )
        if setting == "2":
            return (
                "warning",
                "innodb_flush_log_at_trx_commit is 2: a crash of the server's machine (not "
                "of the server process) forgets up to a second of commits, claims whose "
                "workers already run their tasks included",
            )
        return None

    def is_transient(self, error: BaseException) -> bool:
        """Deadlocks and lock wait timeouts (:data:`TRANSIENT_ERRORS`)."""
        args: tuple[Any, ...] = getattr(error, "args", ())
        return bool(args) and args[0] in TRANSIENT_ERRORS

    def is_unknown_database(self, error: BaseException) -> bool:
        """``ER_BAD_DB_ERROR`` (1049): ``Unknown database 'x'``."""
        args: tuple[Any, ...] = getattr(error, "args", ())
        return bool(args) and args[0] == 1049

    def is_unique_violation(
        self, error: BaseException, *, table: str, constraint: str, columns: Sequence[str]
    ) -> bool:
        """``ER_DUP_ENTRY`` (1062) whose message names the key ``constraint`` (MariaDB:
        ``… for key 'name'``; MySQL 8: ``… for key 'table.name'``)."""
        args: tuple[Any, ...] = getattr(error, "args", ())
        if len(args) < 2 or args[0] != ER_DUP_ENTRY:
            return False
        message = str(args[1])
        return message.endswith((f"'{constraint}'", f"'{table}.{constraint}'"))

    # --------------------------------------------------------------------- lease locks

    supports_lease_locks = True
    #: UTC: zone-proof whatever ``time_zone`` a session set.
    lease_now: ClassVar[str] = "UTC_TIMESTAMP(6)"

    def lease_stamp_sql(self) -> str:
        """Read the clock once into ``@taskclaim_lease_now`` for the acquire that follows."""
        return f"SET @taskclaim_lease_now = {self.lease_now}"

    def lease_acquire_sql(self, t: LeaseTable) -> str:
        """The upsert that takes a free or ended lease, stamping ``acquired_at`` with
        ``@taskclaim_lease_now``. The assignments run left to right, so ``locked_until``
        (the condition) is assigned last. Parameters: key, owner, ttl in microseconds."""
        cond = f"{t.until} <= @taskclaim_lease_now"
        return (
            f"INSERT INTO {t.table} ({t.key}, {t.owner}, {t.token}, {t.until}, "
            f"{t.acquired_at}) VALUES (%s, %s, 1, @taskclaim_lease_now + INTERVAL %s "
            f"MICROSECOND, @taskclaim_lease_now) ON DUPLICATE KEY UPDATE "
            f"{t.owner} = IF({cond}, VALUES({t.owner}), {t.owner}), "
            f"{t.token} = IF({cond}, {t.token} + 1, {t.token}), "
            f"{t.acquired_at} = IF({cond}, VALUES({t.acquired_at}), {t.acquired_at}), "
            f"{t.until} = IF({cond}, VALUES({t.until}), {t.until})"
        )

    def lease_readback_sql(self, t: LeaseTable) -> str:
        """The token, if this very acquire won: the row is ours with this statement's
        stamp. MySQL's clock is fixed at a statement's start and the upsert may have waited
        on the row's lock, so only a lease still in the future counts.
        Parameters: key, owner."""
        return (
            f"SELECT {t.token} FROM {t.table} WHERE {t.key} = %s AND {t.owner} = %s "
            f"AND {t.acquired_at} = @taskclaim_lease_now AND {t.until} > {self.lease_now}"
        )

    def lease_stamp_busy_sql(self, t: LeaseTable) -> str:
        """Read the clock once into ``@taskclaim_lease_now`` (as :meth:`lease_stamp_sql`)
        and, in the same statement, whether a lease of ``key`` is running, read without
        locking the row (a consistent read). Parameters: key."""
        return (
            f"SELECT @taskclaim_lease_now := {self.lease_now}, EXISTS(SELECT 1 FROM "
            f"{t.table} WHERE {t.key} = %s AND {t.until} > {self.lease_now})"
        )

    def lease_acquire(
        self, cursor: Any, t: LeaseTable, key: str, owner: str, ttl: float
    ) -> int | None:
        """See :meth:`DatabaseSQL.lease_acquire`. No ``RETURNING`` here: stamp, upsert, then
        read back (:meth:`lease_stamp_busy_sql`, :meth:`lease_acquire_sql`,
        :meth:`lease_readback_sql`).

        A lease the stamp sees running (a non-locking read) answers "busy" without the
        upsert: InnoDB's upsert locks the row even when it changes nothing, so contenders
        polling a held lease would queue the holder's renewals behind them (and deadlock
        with them: shared, then exclusive locks on the duplicate key)."""
        cursor.execute(self.lease_stamp_busy_sql(t), (key,))
        if cursor.fetchall()[0][1]:
            return None
        cursor.execute(self.lease_acquire_sql(t), (key, owner, round(ttl * 1_000_000)))
        cursor.execute(self.lease_readback_sql(t), (key, owner))
        rows = cursor.fetchall()
        return int(rows[0][0]) if rows else None

    def lease_renew_sql(self, t: LeaseTable) -> str:
        """Move the end of the fenced lease. Parameters: ttl in microseconds, key, owner,
        token."""
        return (
            f"UPDATE {t.table} SET {t.until} = {self.lease_now} + INTERVAL %s MICROSECOND "
            f"WHERE {t.key} = %s AND {t.owner} = %s AND {t.token} = %s"
        )

    def lease_renew(
        self, cursor: Any, t: LeaseTable, key: str, owner: str, token: int, ttl: float
    ) -> bool:
        """See :meth:`DatabaseSQL.lease_renew`: :meth:`lease_renew_sql`, then
        :meth:`~DatabaseSQL.lease_verify_sql` (is the new end still in the future now?)."""
        cursor.execute(self.lease_renew_sql(t), (round(ttl * 1_000_000), key, owner, token))
        if cursor.rowcount != 1:
            return False
        cursor.execute(self.lease_verify_sql(t), (key, owner, token))
        return bool(cursor.fetchall())

    #: InnoDB checks a duplicate key by share-locking the equal index records (and their
    #: gaps): two inserts that wait on each other there deadlock, and the victim's whole
    #: transaction is rolled back. Unique inserts inside a transaction therefore never
    #: wait here (see :mod:`django_taskclaim.model.unique`).
    duplicate_checks_deadlock: ClassVar[bool] = True

    def event_insert(self, connection: Any, name: str) -> Statement:
        """See :meth:`DatabaseSQL.event_insert`: a no-op ``ON DUPLICATE KEY UPDATE``, which
        takes the exclusive lock of the existing row (waiting for it, as ``FOR UPDATE``
        does). ``INSERT IGNORE`` would take InnoDB's share lock of the duplicate: two
        transactions holding it and each then locking the row ``FOR UPDATE`` deadlock."""
        table, column = event_table(connection)
        return Statement(
            f"INSERT INTO {table} ({column}) VALUES (%s) "
            f"ON DUPLICATE KEY UPDATE {column} = {table}.{column}",
            (name,),
        )

    def get_lock_timeout(self) -> Statement:
        """``@@SESSION.innodb_lock_wait_timeout`` (whole seconds)."""
        return Statement("SELECT @@SESSION.innodb_lock_wait_timeout")

    def set_lock_timeout(self, value: str) -> Statement:
        """``SET SESSION innodb_lock_wait_timeout``: whole seconds, rounded down (``"<n>ms"``
        below 1000 is 0: no wait on MariaDB; MySQL 8 waits at least 1 s). There is no
        transaction-local form: it lasts for the session, so a caller that shares the
        session restores the value :meth:`get_lock_timeout` read. Row-lock waits only
        (``GET_LOCK`` has its own timeout)."""
        seconds = int(value[:-2]) // 1000 if value.endswith("ms") else int(value)
        return Statement("SET SESSION innodb_lock_wait_timeout = %s", (seconds,))

    # lease_verify / lease_release: the base class's statements. Django connects to MySQL
    # with CLIENT_FOUND_ROWS, so the release's rowcount counts matched rows here too.

    # ------------------------------------------------------------------ advisory locks

    advisory_kind: ClassVar[AdvisoryKind] = "named"

    def advisory_lock_id(self, key: tuple[int, ...], database: str) -> tuple[Any, ...]:
        """``(name,)``: the database-scoped :func:`lock_name`."""
        return (lock_name(key, database),)

    def advisory_lock(
        self,
        lock_id: tuple[Any, ...],
        *,
        xact: bool,
        shared: bool,
        try_: bool,
        timeout: float | None,
    ) -> Statement:
        """``SELECT GET_LOCK(name, seconds)``: 0 seconds for ``try_``; ``xact`` and
        ``shared`` do not exist here (named locks are session-scope and exclusive)."""
        seconds = 0 if try_ else (GET_LOCK_FOREVER if timeout is None else timeout)
        return Statement("SELECT GET_LOCK(%s, %s)", (*lock_id, seconds))

    def advisory_acquired(self, value: Any, lock_id: tuple[Any, ...], *, try_: bool) -> bool:
        """1: taken; 0: timed out; ``NULL``: an error (raised as ``DatabaseError``)."""
        if value is None:
            raise DatabaseError(f"GET_LOCK({lock_id[0]!r}) failed")
        return bool(value)

    def advisory_unlock(self, lock_id: tuple[Any, ...], *, shared: bool) -> Statement:
        """``SELECT RELEASE_LOCK(name)`` (1 when this session held it)."""
        return Statement("SELECT RELEASE_LOCK(%s)", lock_id)

    # --------------------------------------------------------------------- diagnostics

    explains_plans = True

    def explain(self, sql: str, params: Sequence[Any] = ()) -> Statement:
        """``EXPLAIN <sql>``: one row per table read, its index in the ``key`` column."""
        return Statement(f"EXPLAIN {sql}", tuple(params))

    def plan_uses_index(self, plan: Sequence[Mapping[str, Any]], index: str) -> bool:
        """A row's ``key`` (comma-separated for an index merge) names ``index``."""
        return any(index in str(row.get("key") or "").split(",") for row in plan if row.get("key"))

    def plan_summary(self, plan: Sequence[Mapping[str, Any]]) -> str:
        """Per table read: the access type, the index and the extra notes."""
        return " / ".join(
            f"{row.get('table')}: type={row.get('type')} key={row.get('key')}"
            + (f" ({row.get('Extra')})" if row.get("Extra") else "")
            for row in plan
        )

    def table_size(self, table: str, quoted: str) -> Statement:
        """``DATA_LENGTH + INDEX_LENGTH`` from ``information_schema.TABLES`` (InnoDB's
        estimate) in the connection's database."""
        return Statement(
            "SELECT DATA_LENGTH + INDEX_LENGTH FROM information_schema.TABLES "
            "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s",
            (table,),
        )

    def analyze_sql(self, quoted: str) -> str:
        """``ANALYZE TABLE <table>``."""
        return f"ANALYZE TABLE {quoted}"
