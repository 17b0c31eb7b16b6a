"""What django-taskclaim sends to PostgreSQL to wake workers: ``NOTIFY`` / ``LISTEN`` and
the notify trigger (:class:`PostgreSQLNotify`, a part of
:class:`~django_taskclaim.backends.postgresql.PostgreSQL`; the defaults, "not supported",
are :class:`~django_taskclaim.backends.base.DatabaseSQL`'s)."""

from __future__ import annotations

from typing import Any

from django_taskclaim.backends.base import DatabaseSQL
from django_taskclaim.backends.statement import Statement


class PostgreSQLNotify(DatabaseSQL):
    """PostgreSQL's wake-up statements."""

    # -------------------------------------------------------------------- wake-ups

    supports_notify = True

    def notify(self, channel: str, payload: str) -> Statement:
        """``SELECT pg_notify(channel, payload)``."""
        return Statement("SELECT pg_notify(%s, %s)", (channel, payload))

    def listen_sql(self, quoted_channel: str) -> str:
        """``LISTEN channel``."""
        return f"LISTEN {quoted_channel}"

    supports_notify_trigger = True
    #: The name of the notify trigger on each table that has one, and of its function.
    NOTIFY_TRIGGER = "taskclaim_notify"

    def notify_trigger_sql(
        self, *, table: str, status: str, ready: str, channel: str, label: str
    ) -> list[str]:
        """One shared function, ``taskclaim_notify()`` (``pg_notify(TG_ARGV[0],
        TG_ARGV[1])``), and a row trigger ``AFTER INSERT OR UPDATE OF <status> … WHEN
        (NEW.<status> = <ready>)`` calling it with the channel and the label. The
        notification goes out when the writing transaction commits, once per transaction
        however many rows it wrote (PostgreSQL folds identical notifications); rows
        written in another state cost one comparison each."""
        name = self.NOTIFY_TRIGGER
        return [
            f"CREATE OR REPLACE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS "
            "$$BEGIN PERFORM pg_notify(TG_ARGV[0], TG_ARGV[1]); RETURN NULL; END$$",
            f"CREATE OR REPLACE TRIGGER {name} AFTER INSERT OR UPDATE OF {status} ON {table} "
            f"FOR EACH ROW WHEN (NEW.{status} = {ready}) "
            f"EXECUTE FUNCTION {name}({channel}, {label})",
        ]

    def notify_trigger_comment_sql(self, table: str, comment: str) -> str:
        """``COMMENT ON TRIGGER taskclaim_notify ON <table> IS <comment>`` (a quoted
        literal): where :meth:`notify_trigger_fingerprint` reads it back."""
        return f"COMMENT ON TRIGGER {self.NOTIFY_TRIGGER} ON {table} IS {comment}"

    def drop_notify_trigger_sql(self, table: str) -> str:
        """``DROP TRIGGER IF EXISTS taskclaim_notify ON <table>`` (the shared function
        stays: other tables may use it)."""
        return f"DROP TRIGGER IF EXISTS {self.NOTIFY_TRIGGER} ON {table}"

    def notify_trigger_fingerprints(self, cursor: Any) -> dict[str, str]:
        """Table name → comment of its ``taskclaim_notify`` trigger (``""`` without one),
        for every table on the ``search_path`` that has one: one query."""
        cursor.execute(
            "SELECT c.relname, coalesce(obj_description(t.oid, 'pg_trigger'), '') "
            "FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid "
            "WHERE t.tgname = %s AND pg_table_is_visible(c.oid)",
            [self.NOTIFY_TRIGGER],
        )
        return {str(name): str(comment) for name, comment in cursor.fetchall()}
