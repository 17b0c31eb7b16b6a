"""What django-taskclaim sends to SQLite."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from django_taskclaim.backends.base import DatabaseSQL
from django_taskclaim.backends.base_locks import LeaseTable
from django_taskclaim.backends.statement import Statement


class SQLite(DatabaseSQL):
    """SQLite: ``INSERT … ON CONFLICT … DO UPDATE … WHERE … RETURNING`` leases (SQLite ≥
    3.35); no advisory locks. Times are Django's SQLite text format; ``'now'`` is fixed for
    one statement (one writer at a time, so no statement waits on a row lock)."""

    vendor = "sqlite"
    engine_marker = "sqlite"

    #: Django's SQLite datetime text, in UTC (``%`` not doubled: see ``now_sql``).
    clock_sql: ClassVar[str] = "STRFTIME('%Y-%m-%d %H:%M:%f', 'NOW')"
    clock_known = True
    claim_strategies: ClassVar[frozenset[str]] = frozenset({"cas"})
    one_writer_at_a_time = True
    clock_in_process = True
    partial_unique_constraints = True

    def private_to_one_connection(self, settings_dict: Any) -> bool:
        """An in-memory database (``:memory:``, ``mode=memory`` or no name)."""
        name = str(settings_dict.get("NAME") or "")
        return name in ("", ":memory:") or "mode=memory" in name

    def is_transient(self, error: BaseException) -> bool:
        """``database is locked`` / ``database table is locked`` (a busy database)."""
        text = str(error).lower()
        return "database is locked" in text or "database table is locked" in text

    def is_unique_violation(
        self, error: BaseException, *, table: str, constraint: str, columns: Sequence[str]
    ) -> bool:
        """``SQLITE_CONSTRAINT_UNIQUE`` naming exactly ``table.column`` for each of
        ``columns`` (SQLite names a constraint's columns, not the constraint; an index
        on expressions is named ``index 'name'``)."""
        if getattr(error, "sqlite_errorname", "SQLITE_CONSTRAINT_UNIQUE") != (
            "SQLITE_CONSTRAINT_UNIQUE"
        ):
            return False
        text = str(error)
        prefix = "UNIQUE constraint failed: "
        if not text.startswith(prefix):
            return False
        named = text[len(prefix) :].strip()
        if named == f"index '{constraint}'":
            return True
        return [part.strip() for part in named.split(",")] == [f"{table}.{c}" for c in columns]

    # --------------------------------------------------------------------- lease locks

    supports_lease_locks = True
    lease_now: ClassVar[str] = "strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')"
    #: The clock shifted by a parameter (:meth:`shift`).
    lease_later: ClassVar[str] = "strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', %s)"

    @staticmethod
    def shift(ttl: float) -> str:
        """The ``strftime`` modifier adding ``ttl`` seconds (the :attr:`lease_later`
        parameter)."""
        return f"+{ttl:.6f} seconds"

    def lease_acquire_sql(self, t: LeaseTable) -> str:
        """One upsert that takes a free or ended lease and returns its new token (no row
        when the lease is held). Parameters: key, owner, :meth:`shift` of the ttl."""
        return (
            f"INSERT INTO {t.table} ({t.key}, {t.owner}, {t.token}, {t.until}, "
            f"{t.acquired_at}) VALUES (%s, %s, 1, {self.lease_later}, {self.lease_now}) "
            f"ON CONFLICT ({t.key}) DO UPDATE SET {t.owner} = excluded.{t.owner}, "
            f"{t.token} = {t.token} + 1, {t.until} = excluded.{t.until}, "
            f"{t.acquired_at} = excluded.{t.acquired_at} WHERE {t.until} <= {self.lease_now} "
            f"RETURNING {t.token}"
        )

    def lease_acquire(
        self, cursor: Any, t: LeaseTable, key: str, owner: str, ttl: float
    ) -> int | None:
        """See :meth:`DatabaseSQL.lease_acquire`: :meth:`lease_acquire_sql`."""
        cursor.execute(self.lease_acquire_sql(t), (key, owner, self.shift(ttl)))
        rows = cursor.fetchall()
        return int(rows[0][0]) if rows else None

    def lease_renew_sql(self, t: LeaseTable) -> str:
        """Move the end of the fenced lease. Parameters: :meth:`shift` of the ttl, key,
        owner, token."""
        return (
            f"UPDATE {t.table} SET {t.until} = {self.lease_later} "
            f"WHERE {t.key} = %s AND {t.owner} = %s AND {t.token} = %s"
        )

    def lease_renew(
        self, cursor: Any, t: LeaseTable, key: str, owner: str, token: int, ttl: float
    ) -> bool:
        """See :meth:`DatabaseSQL.lease_renew`: :meth:`lease_renew_sql`."""
        cursor.execute(self.lease_renew_sql(t), (self.shift(ttl), key, owner, token))
        return bool(cursor.rowcount == 1)

    def lease_release_sql(self, t: LeaseTable) -> str:
        """As the base statement, with SQLite's two-argument ``MIN`` for ``LEAST``."""
        return (
            f"UPDATE {t.table} SET {t.until} = MIN({t.until}, {self.lease_now}) "
            f"WHERE {t.key} = %s AND {t.owner} = %s AND {t.token} = %s"
        )

    # --------------------------------------------------------------------- diagnostics

    explains_plans = True

    def explain(self, sql: str, params: Sequence[Any] = ()) -> Statement:
        """``EXPLAIN QUERY PLAN <sql>``: one row per step, described in ``detail``."""
        return Statement(f"EXPLAIN QUERY PLAN {sql}", tuple(params))

    def plan_uses_index(self, plan: Sequence[Mapping[str, Any]], index: str) -> bool:
        """A step reads ``… USING [COVERING] INDEX <index>``."""
        step = re.compile(rf"USING (?:COVERING )?INDEX {re.escape(index)}(?:\s|$)")
        return any(step.search(str(row.get("detail") or "")) for row in plan)

    def plan_summary(self, plan: Sequence[Mapping[str, Any]]) -> str:
        """The steps' ``detail``, joined by ``/``."""
        return " / ".join(str(row.get("detail") or "") for row in plan)

    def analyze_sql(self, quoted: str) -> str:
        """``ANALYZE <table>``."""
        return f"ANALYZE {quoted}"

    # table_size: SQLite keeps no per-table size outside the optional ``dbstat`` table.
