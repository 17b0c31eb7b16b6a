"""The statements of the rate limits' slot rings (the ``taskclaim.RateSlot`` table).

A ring is ``N`` rows ``(model, scope, slot = 0 … N-1, last_start)``. The claim
(:mod:`django_taskclaim.claim.rate`) runs, in its own transaction:

- :meth:`RateSlotSQL.take`: lock up to ``k`` slots of a ring whose ``last_start`` is
  more than one window before the database clock (``FOR UPDATE SKIP LOCKED`` on
  PostgreSQL and MySQL/MariaDB; SQLite has one writer at a time, the transaction's write
  lock);
- :meth:`RateSlotSQL.charge`: write a claim time into locked slots, re-checking that
  each is still more than one window older than that time;

and outside it :meth:`RateSlotSQL.ensure` (create a ring's missing slots, idempotent)
and :meth:`RateSlotSQL.wait` (seconds until a ring's earliest slot frees, database
clock). One class per vendor, :func:`rate_sql` picks it; the table is found through the
app registry (the models sit above the backends).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar, cast

from django.apps import apps
from django.conf import settings

from django_taskclaim.backends import for_connection

#: The ``last_start`` of a slot never used.
NEVER = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class SlotTable:
    """The ``taskclaim.RateSlot`` table and its columns, quoted for one connection."""

    table: str
    id: str
    model: str
    scope: str
    slot: str
    last_start: str

    @classmethod
    def of(cls, connection: Any) -> SlotTable:
        qn = connection.ops.quote_name
        meta = apps.get_model("taskclaim", "RateSlot")._meta
        col = {
            name: qn(cast(Any, meta.get_field(name)).column)
            for name in ("id", "model", "scope", "slot", "last_start")
        }
        return cls(table=qn(meta.db_table), **col)


class RateSlotSQL:
    """PostgreSQL's statements; the other vendors override the clock arithmetic."""

    #: ``FOR UPDATE SKIP LOCKED`` after the ``LIMIT`` of :meth:`take` ("" on SQLite).
    lock_clause: ClassVar[str] = " FOR UPDATE SKIP LOCKED"
    #: ``INSERT`` / conflict clause of :meth:`ensure`.
    insert_head: ClassVar[str] = "INSERT INTO"
    insert_tail: ClassVar[str] = " ON CONFLICT DO NOTHING"
    #: Rows per ``INSERT`` of :meth:`ensure`.
    chunk: ClassVar[int] = 500

    def clock(self, connection: Any) -> str:
        """The database clock of claims (the vendor's ``now_sql``; ``%`` doubled)."""
        return for_connection(connection).now_sql(use_tz=settings.USE_TZ).replace("%", "%%")

    def before(self, connection: Any) -> str:
        """The clock minus a window given as a parameter (seconds)."""
        return f"{self.clock(connection)} - %s * INTERVAL '1 second'"

    def window_param(self, window: float) -> Any:
        """The parameter of :meth:`before` for ``window`` seconds."""
        return window

    def stamp(self, connection: Any, value: datetime) -> Any:
        """``value`` as the parameter of a ``last_start`` (the ORM's own adaptation)."""
        return connection.ops.adapt_datetimefield_value(value)

    def wait_param(self, window: float) -> Any:
        """The parameter of :meth:`wait_sql` for ``window`` seconds."""
        return self.window_param(window)

    def wait_sql(self, t: SlotTable, connection: Any) -> str:
        """Seconds from the clock to the earliest ``last_start`` + window (parameter)."""
        return (
            f"SELECT EXTRACT(EPOCH FROM (MIN({t.last_start}) + %s * INTERVAL '1 second' "
            f"- {self.clock(connection)}))"
        )

    # ---------------------------------------------------------------- statements

    def ensure(self, cursor: Any, model: str, scope: str, count: int) -> None:
        """Create the slots ``0 … count-1`` of the ring ``(model, scope)`` that do not
        exist yet (never used: ``last_start`` = 1970). Idempotent; run outside the
        claim's transaction (in autocommit), so it holds no lock for long."""
        conn = cursor.db
        t = SlotTable.of(conn)
        never = self.stamp(conn, NEVER)
        for low in range(0, count, self.chunk):
            slots = range(low, min(count, low + self.chunk))
            values = ", ".join(["(%s, %s, %s, %s)"] * len(slots))
            params: list[Any] = []
            for slot in slots:
                params += [model, scope, slot, never]
            cursor.execute(
                f"{self.insert_head} {t.table} ({t.model}, {t.scope}, {t.slot}, "
                f"{t.last_start}) VALUES {values}{self.insert_tail}",
                params,
            )

    def take(
        self, cursor: Any, model: str, scope: str, count: int, window: float, k: int
    ) -> list[int]:
        """Lock (until the transaction ends) at most ``k`` free slots of the ring: slot
        number below ``count``, ``last_start`` more than ``window`` seconds before the
        database clock, not locked by another claim (skipped, never waited for). Their
        ids."""
        conn = cursor.db
        t = SlotTable.of(conn)
        cursor.execute(
            f"SELECT {t.id} FROM {t.table} WHERE {t.model} = %s AND {t.scope} = %s "
            f"AND {t.slot} < %s AND {t.last_start} < {self.before(conn)} "
            f"LIMIT %s{self.lock_clause}",
            (model, scope, count, self.window_param(window), k),
        )
        return [int(row[0]) for row in cursor.fetchall()]

    def charge(self, cursor: Any, ids: Sequence[int], start: datetime, window: float) -> bool:
        """Write the claim time ``start`` into the slots ``ids`` (locked by this
        transaction), each only if its ``last_start`` is still more than ``window``
        seconds before ``start``. ``True`` when every one was written."""
        conn = cursor.db
        t = SlotTable.of(conn)
        marks = ", ".join(["%s"] * len(ids))
        earliest = start - timedelta(seconds=window)
        cursor.execute(
            f"UPDATE {t.table} SET {t.last_start} = %s WHERE {t.id} IN ({marks}) "
            f"AND {t.last_start} < %s",
            (self.stamp(conn, start), *ids, self.stamp(conn, earliest)),
        )
        return bool(cursor.rowcount == len(ids))

    def wait(self, cursor: Any, model: str, scope: str, count: int, window: float) -> float | None:
        """Seconds (database clock) until the earliest slot of the ring frees: ``<= 0``
        when one is free already, ``None`` when the ring has no slot (not created yet,
        or its table was emptied)."""
        conn = cursor.db
        t = SlotTable.of(conn)
        cursor.execute(
            f"{self.wait_sql(t, conn)} FROM {t.table} WHERE {t.model} = %s "
            f"AND {t.scope} = %s AND {t.slot} < %s",
            (self.wait_param(window), model, scope, count),
        )
        row = cursor.fetchone()
        return None if row is None or row[0] is None else float(row[0])


class MySQLRateSlotSQL(RateSlotSQL):
    """MySQL / MariaDB: ``INTERVAL n MICROSECOND``, ``INSERT IGNORE``."""

    insert_head = "INSERT IGNORE INTO"
    insert_tail = ""

    def before(self, connection: Any) -> str:
        return f"{self.clock(connection)} - INTERVAL %s MICROSECOND"

    def window_param(self, window: float) -> Any:
        return round(window * 1_000_000)

    def wait_sql(self, t: SlotTable, connection: Any) -> str:
        return (
            f"SELECT (TIMESTAMPDIFF(MICROSECOND, {self.clock(connection)}, "
            f"MIN({t.last_start})) + %s) / 1000000.0"
        )


class SQLiteRateSlotSQL(RateSlotSQL):
    """SQLite: ``strftime`` text times (Django's format, in UTC), no row locks (one
    writer at a time: the claim's transaction holds the write lock)."""

    lock_clause = ""

    def before(self, connection: Any) -> str:
        return "STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW', %s)"

    def window_param(self, window: float) -> Any:
        return f"-{window:.6f} seconds"

    def stamp(self, connection: Any, value: datetime) -> Any:
        """Always six fractional digits (``str()`` drops them at a whole second, and a
        shorter text compares as earlier), so text order is time order; in UTC."""
        if value.tzinfo is not None:
            value = value.astimezone(UTC).replace(tzinfo=None)
        return value.strftime("%Y-%m-%d %H:%M:%S.%f")

    def wait_param(self, window: float) -> Any:
        return window

    def wait_sql(self, t: SlotTable, connection: Any) -> str:
        return f"SELECT (JULIANDAY(MIN({t.last_start})) - JULIANDAY('now')) * 86400.0 + %s"


_BY_VENDOR: dict[str, RateSlotSQL] = {
    "postgresql": RateSlotSQL(),
    "mysql": MySQLRateSlotSQL(),
    "sqlite": SQLiteRateSlotSQL(),
}


def rate_sql(connection: Any) -> RateSlotSQL | None:
    """The slot statements for ``connection``'s vendor, or ``None`` where rate limits are
    not supported (a vendor without a class here)."""
    return _BY_VENDOR.get(for_connection(connection).vendor)
