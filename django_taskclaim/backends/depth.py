"""The statements of the queue depth samples (the ``taskclaim.QueueDepth`` table).

- :meth:`DepthSQL.sample`: count a model's ``ready`` and ``processing`` rows and store
  the counts under the current minute of the database clock, in one ``INSERT … SELECT``
  (a second sample of the same model and minute is dropped: ``ON CONFLICT DO NOTHING``
  on PostgreSQL and SQLite, a no-op ``ON DUPLICATE KEY UPDATE`` on MySQL / MariaDB). The
  count reads only the rows in those two states (``status = ready OR status =
  processing``: PostgreSQL combines the claim and lease partial indexes), never a
  finished row.
- :meth:`DepthSQL.prune`: delete one model's samples older than some hours (database
  clock), through the table's ``(model, minute)`` key.

One class per vendor, :func:`depth_sql` picks it; the table is found through the app
registry (the models sit above the backends).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

from django.apps import apps
from django.conf import settings

from django_taskclaim.backends import for_connection

__all__ = ["DepthSQL", "DepthTable", "SampledTable", "depth_sql"]


@dataclass(frozen=True, slots=True)
class DepthTable:
    """The ``taskclaim.QueueDepth`` table and its columns, quoted for one connection."""

    table: str
    model: str
    minute: str
    ready: str
    processing: str

    @classmethod
    def of(cls, connection: Any) -> DepthTable:
        qn = connection.ops.quote_name
        meta = apps.get_model("taskclaim", "QueueDepth")._meta
        col = {
            name: qn(cast(Any, meta.get_field(name)).column)
            for name in ("model", "minute", "ready", "processing")
        }
        return cls(table=qn(meta.db_table), **col)


@dataclass(frozen=True, slots=True)
class SampledTable:
    """The claimable model a sample counts: its label, quoted table and status column,
    and the stored values of its ``ready`` and ``processing`` states."""

    label: str
    table: str
    status: str
    ready: Any
    processing: Any


class DepthSQL:
    """PostgreSQL's statements; the other vendors override the minute and the tail."""

    def minute_sql(self, connection: Any) -> str:
        """The database clock cut to its minute (``%`` doubled: sent with parameters)."""
        return "DATE_TRUNC('minute', STATEMENT_TIMESTAMP())"

    def ignore_tail(self, t: DepthTable) -> str:
        """What drops a sample whose (model, minute) is already stored."""
        return f" ON CONFLICT ({t.model}, {t.minute}) DO NOTHING"

    def cutoff(self, connection: Any) -> str:
        """The database clock minus a number of hours given as a parameter."""
        now = for_connection(connection).now_sql(use_tz=settings.USE_TZ).replace("%", "%%")
        return f"{now} - %s * INTERVAL '1 hour'"

    def hours_param(self, hours: float) -> Any:
        """The parameter of :meth:`cutoff` for ``hours``."""
        return hours

    def sample(self, cursor: Any, of: SampledTable) -> None:
        """Store the current counts of ``of``'s ``ready`` and ``processing`` rows under
        the current minute (database clock), unless this minute already has a sample of
        the model (then nothing changes). One statement."""
        conn = cursor.db
        t = DepthTable.of(conn)
        cursor.execute(
            f"INSERT INTO {t.table} ({t.model}, {t.minute}, {t.ready}, {t.processing}) "
            f"SELECT %s, {self.minute_sql(conn)}, "
            f"COUNT(CASE WHEN {of.status} = %s THEN 1 END), "
            f"COUNT(CASE WHEN {of.status} = %s THEN 1 END) "
            f"FROM {of.table} WHERE {of.status} = %s OR {of.status} = %s{self.ignore_tail(t)}",
            (of.label, of.ready, of.processing, of.ready, of.processing),
        )

    def prune(self, cursor: Any, label: str, hours: float) -> int:
        """Delete the samples of model ``label`` whose minute is more than ``hours`` hours
        before the database clock; return how many."""
        conn = cursor.db
        t = DepthTable.of(conn)
        cursor.execute(
            f"DELETE FROM {t.table} WHERE {t.model} = %s AND {t.minute} < {self.cutoff(conn)}",
            (label, self.hours_param(hours)),
        )
        return int(cursor.rowcount or 0)


class MySQLDepthSQL(DepthSQL):
    """MySQL / MariaDB: the clock less its seconds, a no-op ``ON DUPLICATE KEY UPDATE``
    (``INSERT IGNORE`` would hide other errors too), ``INTERVAL n MICROSECOND``."""

    def minute_sql(self, connection: Any) -> str:
        # one clock per statement: every call below reads the statement's start
        now = for_connection(connection).now_sql(use_tz=settings.USE_TZ).replace("%", "%%")
        return f"{now} - INTERVAL SECOND({now}) SECOND - INTERVAL MICROSECOND({now}) MICROSECOND"

    def ignore_tail(self, t: DepthTable) -> str:
        return f" ON DUPLICATE KEY UPDATE {t.model} = {t.table}.{t.model}"

    def cutoff(self, connection: Any) -> str:
        now = for_connection(connection).now_sql(use_tz=settings.USE_TZ).replace("%", "%%")
        return f"{now} - INTERVAL %s MICROSECOND"

    def hours_param(self, hours: float) -> Any:
        return round(hours * 3_600_000_000)


class SQLiteDepthSQL(DepthSQL):
    """SQLite: ``strftime`` text times (Django's format, in UTC), ``ON CONFLICT DO
    NOTHING`` (the ``SELECT`` has a ``WHERE``, as SQLite's upsert after a ``SELECT``
    needs)."""

    def minute_sql(self, connection: Any) -> str:
        return "STRFTIME('%%Y-%%m-%%d %%H:%%M:00', 'NOW')"

    def cutoff(self, connection: Any) -> str:
        return "STRFTIME('%%Y-%%m-%%d %%H:%%M:%%S', 'NOW', %s)"

    def hours_param(self, hours: float) -> Any:
        return f"-{hours * 3600:.0f} seconds"


_BY_VENDOR: dict[str, DepthSQL] = {
    "postgresql": DepthSQL(),
    "mysql": MySQLDepthSQL(),
    "sqlite": SQLiteDepthSQL(),
}


def depth_sql(connection: Any) -> DepthSQL | None:
    """The depth statements for ``connection``'s vendor, or ``None`` for a vendor without
    a class here (no sample is taken there)."""
    return _BY_VENDOR.get(for_connection(connection).vendor)
