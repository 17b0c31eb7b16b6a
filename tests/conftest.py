from __future__ import annotations

import os
import socket
import threading

import pytest
from django.conf import settings


def _mariadb_down_reason() -> str | None:
    if settings.DB_VENDOR != "mysql":
        return None
    conf = settings.DATABASES["default"]
    host, port = conf.get("HOST") or "127.0.0.1", int(conf.get("PORT") or 3306)
    try:
        with socket.create_connection((host, port), timeout=1):
            pass
    except OSError:
        return f"MariaDB/MySQL not reachable at {host}:{port} (start it or unset TASKCLAIM_TEST_DB)"
    try:
        import MySQLdb  # noqa: F401
    except ImportError:
        return "mysqlclient is not installed (apt-get install libmariadb-dev pkg-config)"
    return None


def pytest_report_header(config):
    conf = settings.DATABASES["default"]
    return f"taskclaim test database: {settings.DB_VENDOR} {conf.get('HOST') or conf['NAME']}"


def pytest_collection_modifyitems(config, items):
    reason = _mariadb_down_reason()
    if reason:
        print(f"\nSKIPPING ALL TESTS: {reason}")
        for item in items:
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture
def vendor() -> str:
    return settings.DB_VENDOR


def pytest_configure(config):
    os.environ.setdefault("TASKCLAIM_TESTING", "1")
    _flush_postgresql_touched_tables()
    _flush_keeps_what_migrate_made()


#: Tables only ``post_migrate`` writes (content types, permissions): kept by the flush.
KEPT_TABLES = frozenset({"django_content_type", "auth_permission"})


def _flush_keeps_what_migrate_made() -> None:
    """After each transactional test Django flushes every table, then sends
    ``post_migrate``, whose receivers write back what the flush took: every app's content
    types and permissions (a hundred rows), and this app's notify triggers are
    re-checked. That was most of a test's time (0.17 s of 0.22 s per test on PostgreSQL,
    the same share on SQLite and MariaDB). Here the flush keeps the tables only
    ``post_migrate`` writes (:data:`KEPT_TABLES`) and sends no ``post_migrate``: a table
    emptied by ``TRUNCATE`` or ``DELETE`` keeps its triggers, and the content types keep
    their ids, so every test still starts from what ``migrate`` left plus empty tables."""
    from django.core.management.commands import flush

    def sql_flush(style, connection, reset_sequences=True, allow_cascade=False):
        tables = [
            t
            for t in connection.introspection.django_table_names(
                only_existing=True, include_views=False
            )
            if t not in KEPT_TABLES
        ]
        return connection.ops.sql_flush(
            style, tables, reset_sequences=reset_sequences, allow_cascade=allow_cascade
        )

    handle = flush.Command.handle

    def handle_without_post_migrate(self, **options):
        return handle(self, **{**options, "inhibit_post_migrate": True})

    flush.sql_flush = sql_flush
    flush.Command.handle = handle_without_post_migrate


def _flush_postgresql_touched_tables() -> None:
    """After each transactional test Django empties every table. On PostgreSQL it sends one
    ``TRUNCATE`` of all of them, which gives every table and index new files: 0.2 s per test
    on a quiet machine, over a second under the suite's own load, and most tests here are
    transactional (claims refuse to run inside the test's transaction). Here the flush
    truncates only the tables whose file is not empty (written since their last
    ``TRUNCATE``), with ``CASCADE`` for the tables that reference them: the same end state
    (every table empty, fresh files, so the planner sees what it saw after Django's flush;
    a ``DELETE`` would leave dead pages behind and change plans), in a few milliseconds.
    A flush that resets sequences keeps Django's statement."""
    try:
        from django.db.backends.postgresql.operations import DatabaseOperations
    except ImportError:  # no PostgreSQL driver: no PostgreSQL tests either
        return

    truncate_all = DatabaseOperations.sql_flush

    def sql_flush(self, style, tables, *, reset_sequences=False, allow_cascade=False):
        if reset_sequences or not tables:
            return truncate_all(
                self, style, tables, reset_sequences=reset_sequences, allow_cascade=allow_cascade
            )
        with self.connection.cursor() as cursor:
            cursor.execute(
                "SELECT c.relname FROM pg_class c WHERE c.relname = ANY(%s) "
                "AND c.relnamespace = to_regnamespace(current_schema())::oid "
                "AND (c.relkind = 'p' OR pg_relation_size(c.oid) > 0)",
                [list(tables)],
            )
            touched = sorted(name for (name,) in cursor.fetchall())
        if not touched:
            return []
        return [
            "{} {} {};".format(
                style.SQL_KEYWORD("TRUNCATE"),
                ", ".join(style.SQL_FIELD(self.quote_name(t)) for t in touched),
                style.SQL_KEYWORD("CASCADE"),
            )
        ]

    DatabaseOperations.sql_flush = sql_flush


@pytest.fixture(autouse=True)
def fresh_claim_caches():
    """Every test starts and ends with this process's snapshot of the pauses and its
    memory of rate-limit rings dropped: a flushed or rolled-back pause table must not be
    remembered as paused by the next test, nor a flushed ring as made. The claim
    statements a process keeps are dropped too, so each test builds its own: a fault in
    building one (a lost ``SKIP LOCKED``) shows in every test that claims, not only in
    the first of a process (mutmut runs each mutant in a fork of a process that ran
    every test once: a kept statement hid such mutants)."""
    from django_taskclaim.claim import paused, rate, statements

    paused.invalidate()
    rate._ENSURED.clear()
    statements._CLAIMS.clear()
    statements._COMPILED.clear()
    yield
    paused.invalidate()
    rate._ENSURED.clear()


@pytest.fixture(autouse=True)
def no_leaked_lease_renewers():
    """A test must not leave a lease renewer running: it would renew into the next test's
    database and fail there, far from its cause. One left behind is stopped and reported
    here, on the test that started it."""
    yield
    from django_taskclaim.locks.renewer import Renewer

    leaked = [t for t in threading.enumerate() if isinstance(t, Renewer) and t.is_alive()]
    for renewer in leaked:
        renewer.stop(timeout=5)
    assert not leaked, f"lease renewer threads left running: {[t.name for t in leaked]}"
