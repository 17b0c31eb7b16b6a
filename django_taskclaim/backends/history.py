"""The statements of the per-minute history (the ``taskclaim.TaskHistory`` table) and
of the planner's row estimates the dashboard shows for large tables.

- :meth:`HistorySQL.add`: add counts to ``(model, queue, minute)`` rows, creating the
  missing ones, in one statement (``ON CONFLICT … DO UPDATE`` on PostgreSQL and SQLite,
  ``ON DUPLICATE KEY UPDATE`` on MySQL / MariaDB). The rows are sent in key order, so
  two workers adding to the same minutes lock them in the same order (no deadlock
  between them); the counts are added to what is there, never overwritten, so
  concurrent writers never lose each other's counts.
- :meth:`HistorySQL.prune`: delete the rows older than some days, on the database clock.
- :func:`stored_queue`: a queue name as the ``queue`` column holds it (a name longer than
  the column is cut and ends with a digest of the whole, the same on write and read).
- :meth:`HistorySQL.state_estimate`: the planner's statistics of a status column
  (PostgreSQL: ``pg_class.reltuples`` and ``pg_stats``' most common values), ``None``
  elsewhere.

One class per vendor, :func:`history_sql` picks it; the table is found through the app
registry (the models sit above the backends).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from typing import Any, ClassVar, cast

from django.apps import apps
from django.conf import settings

from django_taskclaim.backends import for_connection

#: Days of history kept: older rows are deleted by the workers (hourly) and by
#: ``taskclaim_prune`` (docs/admin.md, "Charts").
KEEP_DAYS = 7


@dataclass(frozen=True, slots=True)
class HistoryTable:
    """The ``taskclaim.TaskHistory`` table and its columns, quoted for one connection."""

    table: str
    model: str
    queue: str
    minute: str
    done: str
    failed: str

    @classmethod
    def of(cls, connection: Any) -> HistoryTable:
        qn = connection.ops.quote_name
        meta = apps.get_model("taskclaim", "TaskHistory")._meta
        col = {
            name: qn(cast(Any, meta.get_field(name)).column)
            for name in ("model", "queue", "minute", "done", "failed")
        }
        return cls(table=qn(meta.db_table), **col)


#: One row of :meth:`HistorySQL.add`: model label, queue, minute, done, failed.
HistoryRow = tuple[str, str, datetime, int, int]

#: Hex digits of the SHA-256 that end a queue name too long for the history's column.
_DIGEST = 16


@cache
def queue_length() -> int:
    """Characters the history's ``queue`` column holds (its ``max_length``)."""
    field = apps.get_model("taskclaim", "TaskHistory")._meta.get_field("queue")
    return int(cast(Any, field).max_length)


def stored_queue(queue: str) -> str:
    """``queue`` as the history stores it: itself when it fits the column, else its first
    characters, ``~`` and 16 hex digits of its SHA-256, exactly the column's length. The
    same name always gives the same key (written by every worker, and looked up by the
    readers with this function too); two long names that share their beginning stay
    apart. A queue name of any length is counted, never an error for the whole flush."""
    length = queue_length()
    if len(queue) <= length:
        return queue
    digest = hashlib.sha256(queue.encode("utf-8", "surrogatepass")).hexdigest()[:_DIGEST]
    return f"{queue[: length - _DIGEST - 1]}~{digest}"


def is_cut(stored: str) -> bool:
    """Whether ``stored`` (a ``queue`` of the history) is a name :func:`stored_queue` cut:
    it stands for a queue it does not spell out (a reader cannot offer it as a name)."""
    length = queue_length()
    return (
        len(stored) == length
        and stored[length - _DIGEST - 1] == "~"
        and all(c in "0123456789abcdef" for c in stored[length - _DIGEST :])
    )


@dataclass(frozen=True)
class StateEstimate:
    """The planner's statistics of a table: its estimated row count; per most common
    status value (as text), the estimated fraction of rows holding it; and the fraction
    of rows left to the other values (``others_fraction``, the rounding of the stored
    frequencies when there are none) with how many distinct values the planner thinks
    share it (``others``, 0 when the most common values are all it saw)."""

    rows: float
    fractions: dict[str, float]
    others_fraction: float
    others: int


class HistorySQL:
    """PostgreSQL's statements; the other vendors override the upsert's tail."""

    #: Rows per ``INSERT`` of :meth:`add`.
    chunk: ClassVar[int] = 500

    def upsert_tail(self, t: HistoryTable) -> str:
        """What adds a row's counts to the existing row of its key."""
        return (
            f" ON CONFLICT ({t.model}, {t.queue}, {t.minute}) DO UPDATE SET "
            f"{t.done} = {t.table}.{t.done} + EXCLUDED.{t.done}, "
            f"{t.failed} = {t.table}.{t.failed} + EXCLUDED.{t.failed}"
        )

    def cutoff(self, connection: Any) -> str:
        """The database clock minus a number of days given as a parameter."""
        now = for_connection(connection).now_sql(use_tz=settings.USE_TZ).replace("%", "%%")
        return f"{now} - %s * INTERVAL '1 day'"

    def add(self, cursor: Any, rows: Sequence[HistoryRow]) -> None:
        """Add ``rows``' counts to the history, creating the rows not there yet. Keys must
        be distinct; they are written in key order (see the module's docstring)."""
        conn = cursor.db
        t = HistoryTable.of(conn)
        ordered = sorted(rows, key=lambda r: (r[0], r[1], r[2]))
        adapt = conn.ops.adapt_datetimefield_value
        for low in range(0, len(ordered), self.chunk):
            part = ordered[low : low + self.chunk]
            values = ", ".join(["(%s, %s, %s, %s, %s)"] * len(part))
            params: list[Any] = []
            for model, queue, minute, done, failed in part:
                params += [model, queue, adapt(minute), done, failed]
            cursor.execute(
                f"INSERT INTO {t.table} ({t.model}, {t.queue}, {t.minute}, {t.done}, "
                f"{t.failed}) VALUES {values}{self.upsert_tail(t)}",
                params,
            )

    def prune(self, cursor: Any, days: float) -> int:
        """Delete the history rows whose minute is more than ``days`` days before the
        database clock; return how many."""
        conn = cursor.db
        t = HistoryTable.of(conn)
        cursor.execute(
            f"DELETE FROM {t.table} WHERE {t.minute} < {self.cutoff(conn)}",
            (self.days_param(days),),
        )
        return int(cursor.rowcount or 0)

    def days_param(self, days: float) -> Any:
        """The parameter of :meth:`cutoff` for ``days``."""
        return days

    def state_estimate(self, cursor: Any, table: str, column: str) -> StateEstimate | None:
        """The planner's statistics of ``table``'s ``column`` (unquoted names, in the
        connection's current schema), or ``None`` when there are none (never analysed, or
        a vendor that keeps no such statistics)."""
        cursor.execute(
            "SELECT c.reltuples, s.most_common_vals::text::text[], s.most_common_freqs, "
            "s.null_frac, s.n_distinct FROM pg_class c "
            "LEFT JOIN pg_stats s ON s.schemaname = current_schema() AND s.tablename = %s "
            "AND s.attname = %s WHERE c.oid = to_regclass(quote_ident(%s))",
            (table, column, table),
        )
        row = cursor.fetchone()
        if row is None or row[0] is None or row[0] < 0 or row[4] is None:
            return None
        rows, values, freqs, null_frac, distinct = row
        values, freqs = list(values or []), [float(f) for f in freqs or []]
        fractions = dict(zip(values, freqs, strict=False))
        distinct = -distinct * rows if distinct < 0 else distinct  # negative: per row
        return StateEstimate(
            rows=float(rows),
            fractions=fractions,
            others_fraction=max(0.0, 1.0 - float(null_frac or 0) - sum(freqs)),
            others=max(0, round(float(distinct)) - len(values)),
        )


class MySQLHistorySQL(HistorySQL):
    """MySQL / MariaDB: ``ON DUPLICATE KEY UPDATE``, ``INTERVAL n MICROSECOND``, and no
    planner statistics per value."""

    def upsert_tail(self, t: HistoryTable) -> str:
        return (
            f" ON DUPLICATE KEY UPDATE {t.done} = {t.done} + VALUES({t.done}), "
            f"{t.failed} = {t.failed} + VALUES({t.failed})"
        )

    def cutoff(self, connection: Any) -> str:
        now = for_connection(connection).now_sql(use_tz=settings.USE_TZ).replace("%", "%%")
        return f"{now} - INTERVAL %s MICROSECOND"

    def days_param(self, days: float) -> Any:
        return round(days * 86_400_000_000)

    def state_estimate(self, cursor: Any, table: str, column: str) -> StateEstimate | None:
        return None


class SQLiteHistorySQL(HistorySQL):
    """SQLite: ``ON CONFLICT … DO UPDATE`` with unqualified columns, ``strftime`` text
    times (Django's format, in UTC), no planner statistics per value."""

    def upsert_tail(self, t: HistoryTable) -> str:
        return (
            f" ON CONFLICT ({t.model}, {t.queue}, {t.minute}) DO UPDATE SET "
            f"{t.done} = {t.done} + excluded.{t.done}, "
            f"{t.failed} = {t.failed} + excluded.{t.failed}"
        )

    def cutoff(self, connection: Any) -> str:
        return "STRFTIME('%%Y-%%m-%%d %%H:%%M:%%S', 'NOW', %s)"

    def days_param(self, days: float) -> Any:
        return f"-{days * 86400:.0f} seconds"

    def state_estimate(self, cursor: Any, table: str, column: str) -> StateEstimate | None:
        return None


_BY_VENDOR: dict[str, HistorySQL] = {
    "postgresql": HistorySQL(),
    "mysql": MySQLHistorySQL(),
    "sqlite": SQLiteHistorySQL(),
}


def history_sql(connection: Any) -> HistorySQL | None:
    """The history statements for ``connection``'s vendor, or ``None`` for a vendor
    without a class here (no history is written or read there)."""
    return _BY_VENDOR.get(for_connection(connection).vendor)
