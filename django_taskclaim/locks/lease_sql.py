"""The statements a lease lock runs, and the admin's break of a lease.

:func:`lease_statement` runs one step of the vendor's lease statements (in
:mod:`django_taskclaim.backends`) on its own cursor, retrying transient errors;
:func:`bounded_lease_statement` runs one with its row-lock wait bounded (by
:func:`lock_wait`, the vendor's bound on a statement's row-lock wait); they serve
:class:`~django_taskclaim.locks.lease.LeaseLock`. :func:`break_lease` expires held leases
at once and bumps their tokens (the ``taskclaim.Lease`` admin's action), so that each
holder is fenced.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.db import connections, models, transaction
from django.db.models import F

from django_taskclaim.backends import DatabaseSQL, LeaseTable, Statement, for_connection
from django_taskclaim.db import DbNow, retry_transient
from django_taskclaim.exceptions import LockUsageError

#: The most leases one :func:`break_lease` breaks.
BREAK_LIMIT = 10_000


def lease_statement[T](using: str, step: Callable[[DatabaseSQL, Any, LeaseTable], T]) -> T:
    """Run one lease ``step`` of the vendor's statements on ``using`` (own cursor), retrying
    transient errors; :class:`LockUsageError` where lease locks are not supported."""
    conn = connections[using]
    sql = for_connection(conn)
    if not sql.supports_lease_locks:
        raise LockUsageError(f"lease locks do not support the {sql.vendor} database")
    table = LeaseTable.of(conn)

    def go() -> T:
        with connections[using].cursor() as cursor:
            return step(sql, cursor, table)

    return retry_transient(go, using, what="lease lock")


def lock_wait(sql: DatabaseSQL, seconds: float) -> Statement | None:
    """The vendor's statement bounding a statement's row-lock wait to ``seconds`` until the
    end of the transaction (PostgreSQL ``lock_timeout``; MySQL / MariaDB
    ``innodb_lock_wait_timeout``, whole seconds, for the session), or ``None`` where a
    vendor has none (SQLite: one writer at a time, bounded by its busy timeout)."""
    try:
        return sql.set_lock_timeout(f"{max(1, int(seconds * 1000))}ms")
    except NotImplementedError:
        return None


def bounded_lease_statement[T](
    using: str, step: Callable[[DatabaseSQL, Any, LeaseTable], T], wait: float
) -> T:
    """Run one lease ``step`` on ``using`` once (no retry), its row-lock waits bounded to
    ``wait`` seconds (in a short transaction of its own where the vendor's bound needs
    one); past the bound it raises the vendor's lock timeout error."""
    conn = connections[using]
    sql = for_connection(conn)
    table = LeaseTable.of(conn)
    bound = lock_wait(sql, wait)
    if bound is None:
        with conn.cursor() as cursor:
            return step(sql, cursor, table)
    with transaction.atomic(using=using), conn.cursor() as cursor:
        cursor.execute(*bound)
        return step(sql, cursor, table)


def break_lease(leases: models.QuerySet) -> int:
    """Break the leases among ``leases`` (rows of ``taskclaim.Lease``) that are still held:
    one UPDATE expires each now and bumps its token, so the holder's ``renew()`` /
    ``release()`` match nothing and the next acquirer wins. Expired ones are left as they
    are; at most :data:`BREAK_LIMIT` at a time. Returns how many were broken."""
    held = leases.filter(locked_until__gt=DbNow())
    pks = list(held.values_list("pk", flat=True)[:BREAK_LIMIT])
    return int(
        leases.model._default_manager.filter(pk__in=pks, locked_until__gt=DbNow()).update(
            locked_until=DbNow(), token=F("token") + 1
        )
    )
