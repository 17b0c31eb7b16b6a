"""The insert of unique enqueue: :func:`insert_unique` inserts a row unless an active one
(``ready`` / ``processing``) holds the same key, and then returns that row.

The key and its constraint are declared with the model (:mod:`.unique`: ``ActiveKeyField``
and a unique constraint on it); this module is what ``enqueue_unique()`` runs. Inside the
caller's transaction on MySQL / MariaDB, callers of one key take turns (a named lock), so
two of them never wait for each other's commit for ever. See ``docs/unique.md``.
"""

from __future__ import annotations

import contextlib
import logging
import random
import time
from collections.abc import Callable, Iterator
from typing import Any

from django.db import IntegrityError, OperationalError, models, transaction

from django_taskclaim.backends import for_alias, for_connection
from django_taskclaim.db import is_transient, retry_transient
from django_taskclaim.exceptions import TaskClaimError
from django_taskclaim.model.unique import UniqueKey, unique_key

logger = logging.getLogger("django_taskclaim.model.unique")

#: How many times :func:`insert_unique` inserts when the row holding the key keeps
#: finishing between its failed insert and its read.
INSERT_ATTEMPTS = 5


class UniqueKeyRaceError(TaskClaimError):
    """The row holding a key kept leaving the active states (or stayed invisible to this
    transaction) between a refused insert and the read of that row, every time."""


def is_unique_violation(exc: BaseException, key: UniqueKey, using: str) -> bool:
    """Whether ``exc`` is a violation of ``key``'s unique constraint and of nothing else
    (the vendor's error codes, in :mod:`django_taskclaim.backends`)."""
    if not isinstance(exc, IntegrityError):
        return False
    return for_alias(using).is_unique_violation(
        exc.__cause__ or exc, table=key.table, constraint=key.constraint, columns=[key.column]
    )


#: Longest time, in seconds, a caller inside a transaction on MySQL / MariaDB tries its
#: insert again while another transaction's uncommitted row of the same key is pending.
KEY_WAIT_TIMEOUT = 10.0


@contextlib.contextmanager
def _key_turn(conn: Any, key: UniqueKey, value: Any) -> Iterator[None]:
    """One caller at a time tries to insert (``key``, ``value``) inside a transaction on
    MySQL / MariaDB: a named lock (``GET_LOCK``, the session's, not a row lock) held
    around the caller's attempts. Two callers that each hold the share locks of a
    refused duplicate check would otherwise each wait for the other's commit, for ever;
    taken in turn, the second one waits only for the first one's transaction."""
    from django_taskclaim.locks.keys import normalize_key  # deferred: the locks import the models

    sql = for_connection(conn)
    name = f"taskclaim-unique:{key.table}:{key.constraint}:{value!r}"
    lock_id = sql.advisory_lock_id(normalize_key(name), str(conn.settings_dict["NAME"]))
    lock = sql.advisory_lock(
        lock_id, xact=False, shared=False, try_=False, timeout=KEY_WAIT_TIMEOUT
    )
    with conn.cursor() as cursor:
        cursor.execute(*lock)
        (got,) = cursor.fetchone()
    if not sql.advisory_acquired(got, lock_id, try_=False):
        raise UniqueKeyRaceError(
            f"enqueue_unique() on {key.model._meta.label}: another transaction kept its "
            f"turn to insert {key.key_field}={value!r} for over {KEY_WAIT_TIMEOUT:g} s"
        )
    try:
        yield
    finally:
        raw = conn.connection.cursor()  # the caller's block may refuse statements now
        try:
            raw.execute(*sql.advisory_unlock(lock_id, shared=False))
        finally:
            raw.close()


def _insert_without_lock_waits(conn: Any, save: Callable[[], None]) -> None:
    """``save()`` with the session's row-lock wait set to none (MySQL / MariaDB) and then
    restored. InnoDB checks a duplicate by share-locking the index records equal to the
    key (a finished row's delete-marked one and its gap included); two transactions
    holding such locks and each waiting for the other deadlock, and the victim's whole
    transaction is rolled back: nothing a savepoint could retry. An insert that never
    waits never closes such a cycle; its lock wait timeout (error 1205) rolls back only
    the statement, and the caller reads and tries again."""
    sql = for_connection(conn)
    with conn.cursor() as cursor:
        cursor.execute(*sql.get_lock_timeout())
        (previous,) = cursor.fetchone()
        cursor.execute(*sql.set_lock_timeout("0ms"))
    try:
        save()
    finally:
        raw = conn.connection.cursor()  # the caller's block may refuse statements now
        try:
            raw.execute(*sql.set_lock_timeout(str(previous)))
        finally:
            raw.close()


def insert_unique[M: models.Model](
    build: Callable[[], M], *, using: str, key_field: str | None = None
) -> tuple[M, bool]:
    """Insert the row ``build()`` returns unless an active row has the same key; return
    ``(row, created)``.

    Guarantees: the INSERT itself decides (the unique constraint over the
    :class:`ActiveKeyField`), so however many connections race on one key, exactly one
    active row holds it and every caller gets that row. ``created`` is ``False`` when
    another active row held the key: that row is returned, nothing is written. Any other
    ``IntegrityError`` (another constraint, a NOT NULL column) is raised unchanged.
    Inside the caller's ``transaction.atomic()`` the insert runs in a savepoint: it
    commits or rolls back with the caller, and a refused insert leaves the caller's
    transaction usable (outside one it is a single autocommit INSERT). There a racing
    caller waits for the first one's commit, then gets the committed row (on MySQL /
    MariaDB its insert never waits on a row lock, so InnoDB's duplicate checks cannot
    deadlock it: it reads and tries again instead, for up to :data:`KEY_WAIT_TIMEOUT`
    seconds). An active row this transaction can already see is returned without an
    insert. If the holder
    leaves the active states between the refused insert and the read, the insert is
    tried again, up to :data:`INSERT_ATTEMPTS` times, then :class:`UniqueKeyRaceError`.
    A row with a ``NULL`` key is refused (``ValueError``).
    """
    first = build()
    model = type(first)
    key = unique_key(model, key_field)
    value = getattr(first, key.key_field)
    if value is None:
        raise ValueError(
            f"enqueue_unique() on {model._meta.label} needs a value for {key.key_field!r}: "
            "a row without a key is never a duplicate"
        )
    base = model._base_manager.using(using)
    conn = transaction.get_connection(using)
    in_atomic = conn.in_atomic_block
    no_waits = in_atomic and for_connection(conn).duplicate_checks_deadlock
    turn = _key_turn(conn, key, value) if no_waits else contextlib.nullcontext()
    with turn:
        return _insert_or_read(build, first, key, value, using, base, in_atomic, no_waits)


def _insert_or_read[M: models.Model](
    build: Callable[[], M],
    first: M,
    key: UniqueKey,
    value: Any,
    using: str,
    base: Any,
    in_atomic: bool,
    no_waits: bool,
) -> tuple[M, bool]:
    """The attempts of :func:`insert_unique`: read (inside a transaction), insert, and on
    a refused insert read the holder."""
    model = type(first)
    conn = transaction.get_connection(using)
    waited_until = time.monotonic() + KEY_WAIT_TIMEOUT
    pause = 0.002
    row: M | None = first
    attempt = 0
    while attempt < INSERT_ATTEMPTS:
        attempt += 1
        if in_atomic:
            # A plain read, no lock: a row already visible (this transaction's own, or
            # committed) is the answer, and no insert is sent to wait on anything.
            seen = base.filter(**{key.field: value}).first()
            if seen is not None:
                return seen, False
        new = row if row is not None else build()
        row = None

        def insert(new: M = new) -> None:
            if not in_atomic:
                new.save(using=using, force_insert=True)  # autocommit: one round trip
                return
            with transaction.atomic(using=using):  # a savepoint in the caller's block
                if no_waits:
                    _insert_without_lock_waits(
                        conn, lambda: new.save(using=using, force_insert=True)
                    )
                else:
                    new.save(using=using, force_insert=True)

        try:
            retry_transient(insert, using, what=f"enqueue {model._meta.label} uniquely")
        except IntegrityError as exc:
            if not is_unique_violation(exc, key, using):
                raise
        except OperationalError as exc:
            if not no_waits or not is_transient(exc, using):
                raise
            if time.monotonic() > waited_until:
                raise UniqueKeyRaceError(
                    f"enqueue_unique() on {model._meta.label}: another transaction's "
                    f"locks on {key.key_field}={value!r} stayed for over "
                    f"{KEY_WAIT_TIMEOUT:g} s"
                ) from exc
            # Another transaction's row lock (an uncommitted row of this key, a row
            # finishing): read again after a pause, as a waiting insert would.
            row, attempt = new, attempt - 1
            time.sleep(pause * random.uniform(0.5, 1.5))
            pause = min(0.05, pause * 2)
            continue
        else:
            return new, True
        holder = base.filter(**{key.field: value}).first()
        if holder is not None:
            return holder, False
        logger.debug(
            "unique key released before read model=%s key=%r attempt=%s",
            model._meta.label,
            value,
            attempt,
        )
    raise UniqueKeyRaceError(
        f"enqueue_unique() on {model._meta.label}: the row holding {key.key_field}={value!r} "
        f"was refused {INSERT_ATTEMPTS} times but could not be read (it kept finishing, or "
        "this transaction's isolation level hides it: use READ COMMITTED)"
    )
