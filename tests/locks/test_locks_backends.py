"""The per-vendor SQL classes of ``django_taskclaim.backends`` that the locks use: lookup,
error classification, statement shapes, and that the locks write no SQL of their own."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from django.db import DatabaseError, connection

from django_taskclaim import db
from django_taskclaim.backends import (
    DatabaseSQL,
    LeaseTable,
    MySQL,
    PostgreSQL,
    SQLite,
    for_alias,
    for_connection,
    for_engine,
    for_vendor,
)
from django_taskclaim.backends.mysql import MAX_LOCK_NAME, lock_name
from django_taskclaim.locks import advisory_key, mysql_lock_name, normalize_key

PACKAGE = Path(__file__).resolve().parents[2] / "django_taskclaim"
CLASSES = {"postgresql": PostgreSQL, "mysql": MySQL, "sqlite": SQLite}


class Driver(Exception):
    """A driver error as the database drivers raise them (what Django wraps)."""

    def __init__(self, *args, sqlstate=None, pgcode=None):
        super().__init__(*args)
        self.sqlstate = sqlstate
        self.pgcode = pgcode


def wrapped(driver_error: BaseException) -> DatabaseError:
    """Django's ``DatabaseError`` with the driver's error as its cause."""
    try:
        raise DatabaseError(str(driver_error)) from driver_error
    except DatabaseError as exc:
        return exc


# ------------------------------------------------------------------------------ lookup


def test_one_shared_instance_per_vendor():
    sql = for_connection(connection)
    assert type(sql) is CLASSES[connection.vendor]
    assert sql.vendor == connection.vendor
    assert for_alias("default") is sql
    assert for_vendor(connection.vendor) is sql


def test_a_vendor_without_a_class_supports_nothing():
    sql = for_vendor("oracle")
    assert type(sql) is DatabaseSQL
    assert sql.vendor == "oracle"
    assert sql.advisory_kind is None
    assert not sql.supports_lease_locks
    assert not sql.pooler_mode_applies
    assert not sql.is_transient(Driver("ORA-00060: deadlock detected"))
    with pytest.raises(NotImplementedError, match="oracle"):
        sql.advisory_lock((1,), xact=True, shared=False, try_=True, timeout=None)


def test_engines_are_judged_from_settings_alone():
    assert type(for_engine({"ENGINE": "django.db.backends.postgresql"})) is PostgreSQL
    assert type(for_engine({"ENGINE": "django_prometheus.db.backends.postgresql"})) is PostgreSQL
    assert type(for_engine({"ENGINE": "django.db.backends.mysql"})) is MySQL
    assert type(for_engine({"ENGINE": "django.db.backends.sqlite3"})) is SQLite
    assert for_engine({"ENGINE": "django.db.backends.oracle"}) is None
    assert for_engine({}) is None
    assert [cls.vendor for cls in CLASSES.values() if cls.pooler_mode_applies] == ["postgresql"]


# ---------------------------------------------------------------- error classification


@pytest.mark.parametrize(
    ("vendor", "error", "transient", "lock_timeout"),
    [
        ("postgresql", Driver(sqlstate="40001"), True, False),
        ("postgresql", Driver(pgcode="40P01"), True, False),
        ("postgresql", Driver(sqlstate="55P03"), False, True),
        ("postgresql", Driver(pgcode="55P03"), False, True),
        ("postgresql", Driver(sqlstate="23505"), False, False),
        ("mysql", Driver(1213, "Deadlock found"), True, False),
        ("mysql", Driver(1205, "Lock wait timeout exceeded"), True, False),
        ("mysql", Driver(1062, "Duplicate entry"), False, False),
        ("mysql", Driver(), False, False),
        ("sqlite", Driver("database is locked"), True, False),
        ("sqlite", Driver("Database table is locked"), True, False),
        ("sqlite", Driver("UNIQUE constraint failed"), False, False),
    ],
)
def test_driver_errors_are_classified_per_vendor(vendor, error, transient, lock_timeout):
    sql = for_vendor(vendor)
    assert sql.is_transient(error) is transient
    assert sql.is_lock_timeout(error) is lock_timeout


def test_db_asks_the_connections_vendor():
    deadlock = {
        "postgresql": Driver(sqlstate="40P01"),
        "mysql": Driver(1213, "Deadlock found"),
        "sqlite": Driver("database is locked"),
    }[connection.vendor]
    assert db.is_transient(wrapped(deadlock), "default")
    assert not db.is_transient(deadlock, "default")  # not a Django DatabaseError
    assert not db.is_transient(wrapped(Driver("no such table")), "default")
    timeout = wrapped(Driver(sqlstate="55P03"))
    assert db.is_lock_timeout(timeout, "default") is (connection.vendor == "postgresql")


# ---------------------------------------------------------------------------- statements


TABLE = LeaseTable(*(f"<{name}>" for name in ("t", "key", "owner", "token", "until", "acq")))


@pytest.mark.parametrize("vendor", list(CLASSES))
def test_lease_statements_take_values_as_parameters(vendor):
    sql = for_vendor(vendor)
    texts = [sql.lease_verify_sql(TABLE), sql.lease_release_sql(TABLE)]
    texts += [sql.lease_acquire_sql(TABLE), sql.lease_renew_sql(TABLE)]
    for text in texts:
        assert "<t>" in text
        assert "<key> = %s" in text or "VALUES (%s, %s" in text
        # every identifier came from the table: no bare column name was written
        assert not re.search(r"\b(key|owner|token|locked_until|acquired_at)\b(?![>])", text)


def test_lease_table_quotes_with_the_connection():
    t = LeaseTable.of(connection)
    assert t.table == connection.ops.quote_name("taskclaim_lease")
    assert t.until == connection.ops.quote_name("locked_until")


def test_advisory_statements():
    pg, my = for_vendor("postgresql"), for_vendor("mysql")
    lock = pg.advisory_lock((7,), xact=True, shared=True, try_=True, timeout=None)
    assert lock == ("SELECT pg_try_advisory_xact_lock_shared(CAST(%s AS bigint))", (7,))
    lock = pg.advisory_lock((1, 2), xact=False, shared=False, try_=False, timeout=3)
    assert lock.sql == "SELECT pg_advisory_lock(CAST(%s AS integer), CAST(%s AS integer))"
    assert pg.advisory_unlock((1, 2), shared=True).params == (1, 2)
    assert pg.advisory_acquired(None, (7,), try_=False) is True  # the waiting forms: void
    assert pg.set_lock_timeout("5ms").params == ("5ms",)

    (name,) = my.advisory_lock_id((7,), "app")
    assert name == "tc:app:7"
    assert my.advisory_lock((name,), xact=True, shared=False, try_=True, timeout=9).params == (
        name,
        0,
    )
    waits = my.advisory_lock((name,), xact=True, shared=False, try_=False, timeout=None)
    assert waits.params[1] > 300 * 24 * 3600  # MariaDB refuses a negative timeout
    assert my.advisory_unlock((name,), shared=False) == ("SELECT RELEASE_LOCK(%s)", (name,))
    with pytest.raises(DatabaseError, match="GET_LOCK"):
        my.advisory_acquired(None, (name,), try_=False)
    # Whole seconds only (innodb_lock_wait_timeout), rounded down; session-wide.
    assert my.set_lock_timeout("5ms").params == (0,)
    assert my.set_lock_timeout("2500ms").params == (2,)
    assert my.get_lock_timeout().sql == "SELECT @@SESSION.innodb_lock_wait_timeout"


def test_mysql_lock_names_fit_and_stay_scoped():
    key = normalize_key("daily-report")
    assert lock_name(key, "app") == f"tc:app:{advisory_key('daily-report')}"
    long_db = "d" * 80
    for other in (key, normalize_key((-(2**31), -(2**31)))):
        name = lock_name(other, long_db)
        assert len(name) <= MAX_LOCK_NAME
        assert name != lock_name(other, long_db + "x")
    assert mysql_lock_name("daily-report") == lock_name(key, str(connection.settings_dict["NAME"]))


# ------------------------------------------------------- no SQL outside the backends


#: How every statement starts (a message may name a function, never start like this).
STATEMENT = re.compile(r"\s*(SELECT|INSERT|UPDATE|DELETE|SET|WITH|LISTEN|NOTIFY)\s")


@pytest.mark.parametrize(
    "path",
    [*sorted((PACKAGE / "locks").glob("*.py")), PACKAGE / "checks" / "locks.py"],
    ids=lambda p: str(p.relative_to(PACKAGE)),
)
def test_locks_neither_read_the_vendor_nor_write_sql(path):
    """The locks ask the backends (``sql.vendor`` is the backend's own name, for messages)."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and node.attr == "vendor":
            assert isinstance(node.value, ast.Name), ast.unparse(node)
            assert node.value.id == "sql", ast.unparse(node)
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            assert not STATEMENT.match(node.value), (path.name, node.value)
