"""Connection helpers: the database clock (`DbNow`, `db_now`), transaction state, transient-error
detection and bounded retry.

Database errors are classified through :func:`is_transient` and :func:`is_lock_timeout`
and nowhere else; they ask the vendor's class in :mod:`django_taskclaim.backends`, which
holds the error codes.
"""

from __future__ import annotations

import logging
import os
import random
import socket
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.db import DatabaseError, connections
from django.db.models.functions import Now
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from django_taskclaim.backends import for_alias, for_connection
from django_taskclaim.config.settings import taskclaim_settings

logger = logging.getLogger("django_taskclaim.db")


def now_sql(connection: Any) -> str:
    """The SQL of the database clock on ``connection`` (the vendor's
    :meth:`~django_taskclaim.backends.base.DatabaseSQL.now_sql`).

    For raw SQL: ``%`` is not escaped here; on SQLite double it when the string goes
    through a DB-API ``execute`` with parameters.
    """
    return for_connection(connection).now_sql(use_tz=settings.USE_TZ)


class DbNow(Now):
    """The database's clock, zone-proof: every lease, schedule and timestamp the library
    writes or compares uses it (never a worker's clock, never a session-zone clock).

    Same as Django's ``Now()`` except on MySQL/MariaDB, where it is ``UTC_TIMESTAMP(6)``
    (with ``USE_TZ = True``): correct whatever ``time_zone`` a session has set.
    """

    def as_mysql(self, compiler: Any, connection: Any, **extra_context: Any) -> Any:
        return self.as_sql(compiler, connection, template=now_sql(connection), **extra_context)


def execute_kept(conn: Any, sql: str, params: Any, *, fetch: bool, constant: bool = False) -> Any:
    """Run a statement a worker sends over and over (the kept claim, the complete-many)
    through the vendor's :meth:`~django_taskclaim.backends.base.DatabaseSQL.execute_kept`:
    prepared on the server where the connection may prepare statements and no pooler in
    transaction mode is declared (``TASKCLAIM_POOLER_MODE``, read only then)."""
    backend = for_connection(conn)
    conn.ensure_connection()
    prepare = backend.prepares(conn) and taskclaim_settings.POOLER_MODE != "transaction"
    return backend.execute_kept(conn, sql, params, fetch=fetch, constant=constant, prepare=prepare)


def in_user_atomic(using: str) -> bool:
    """Whether the caller has an open ``atomic()`` block on ``using``.

    The atomic blocks Django's ``TestCase`` wraps around each test do not count, so
    claims work inside ordinary Django tests.
    """
    conn = connections[using]
    if not conn.in_atomic_block:
        return False
    return any(not getattr(block, "_from_testcase", False) for block in conn.atomic_blocks)


def is_transient(exc: BaseException, using: str) -> bool:
    """Whether ``exc`` is a deadlock / serialization failure / busy database worth retrying."""
    if not isinstance(exc, DatabaseError):
        return False
    return for_alias(using).is_transient(exc.__cause__ or exc)


def is_lock_timeout(exc: BaseException, using: str) -> bool:
    """Whether ``exc`` is a statement's lock wait ended by the session's lock timeout
    (PostgreSQL ``lock_timeout``: SQLSTATE ``lock_not_available``)."""
    if not isinstance(exc, DatabaseError):
        return False
    return for_alias(using).is_lock_timeout(exc.__cause__ or exc)


def retry_transient[T](fn: Callable[[], T], using: str, *, what: str) -> T:
    """Run ``fn``, retrying deadlocks / serialization failures / SQLite busy errors.

    Retries only when no outer transaction is open (an aborted outer transaction
    cannot be retried from inside). Bounded by ``TASKCLAIM_DB_RETRIES``; the last
    error is re-raised.
    """
    retries = int(taskclaim_settings.DB_RETRIES)
    attempt = 0
    while True:
        try:
            return fn()
        except DatabaseError as exc:
            if attempt >= retries or not is_transient(exc, using) or in_user_atomic(using):
                raise
            attempt += 1
            pause = min(0.2, 0.002 * (2**attempt)) * random.uniform(0.5, 1.5)
            logger.debug("retrying what=%s attempt=%s error=%s", what, attempt, exc)
            time.sleep(pause)


def default_worker_id(pid: int | None = None) -> str:
    """``host:pid`` — what ``locked_by`` records when no worker id is given (``pid``
    defaults to this process's)."""
    return f"{socket.gethostname()}:{os.getpid() if pid is None else pid}"


def db_now(using: str = "default") -> datetime:
    """The database server's current time (aware when ``USE_TZ``), one cheap query.

    Lease and age figures are differences against this value, so a web server with a
    skewed clock still shows what the database (and therefore the reaper) sees.
    """
    conn = connections[using]
    statement = for_connection(conn).read_clock(use_tz=settings.USE_TZ)
    if statement is None:  # pragma: no cover - other vendors
        return timezone.now()
    with conn.cursor() as cursor:
        cursor.execute(statement.sql, statement.params or None)  # no params: % stays literal
        value = cursor.fetchone()[0]
    if isinstance(value, str):
        value = parse_datetime(value)
    if value is None:  # pragma: no cover - defensive
        return timezone.now()
    if timezone.is_naive(value):
        value = timezone.make_aware(value, UTC)
    return value
