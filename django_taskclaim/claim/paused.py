"""What is paused, as the claims of this process see it: a snapshot of the
``taskclaim.QueuePause`` table per database, read at most once per refresh interval.

:func:`paused_queues` is what :mod:`.scope` asks on every claim: a dictionary lookup
while the snapshot is younger than ``TASKCLAIM_POLL_INTERVAL`` (a worker keeps it younger
than its own ``--poll``, :func:`keep_fresh`), else one ``SELECT`` of the (small) pause
table first. Nothing in the claim statement changes while nothing is paused.

The bound, in database-clock terms: a snapshot reflects every pause committed before
its ``SELECT`` started, and is used for at most ``max_age`` seconds after the moment
that ``SELECT`` was sent; so a claim decided more than ``max_age`` seconds after a
pause's commit excludes the paused rows (the claim statement itself then reaches the
database one round trip later). A pause or resume made by this process drops the
snapshot at once (:func:`invalidate`), and so does the worker's ``LISTEN`` thread on a
pause notification (:data:`NOTICE_PREFIX`), so on PostgreSQL the fleet usually sees it
within milliseconds. On SQLite the claims do not use the snapshot: they read the table
inside their own write transaction (``paused_queues(exact=True)``, see
:func:`~.scope.pauses_read_in_claim`), which makes the bound exact there.

The statement is the backends' (:meth:`~django_taskclaim.backends.base.DatabaseSQL.paused_queues`);
the pause API that writes the table is :mod:`django_taskclaim.flow.pause`, above.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass

from django.db import DatabaseError, connections

from django_taskclaim.backends import for_connection
from django_taskclaim.config.settings import taskclaim_settings
from django_taskclaim.exceptions import ConfigurationError

__all__ = [
    "NOTICE_PREFIX",
    "invalidate",
    "keep_fresh",
    "notice_label",
    "paused_queues",
    "snapshot",
]

#: The payload of a pause / resume notification on ``TASKCLAIM_NOTIFY_CHANNEL`` is this
#: prefix and the model label (a model label holds no ``:``).
NOTICE_PREFIX = "pause:"

_NONE: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class _Snapshot:
    #: ``time.monotonic()`` when its SELECT was sent (its age is counted from there)
    taken: float
    #: ``taken`` + ``TASKCLAIM_POLL_INTERVAL`` as it was then (the setting is not read
    #: on every claim: a live read costs more than the rest of this check)
    expires: float
    #: model label -> the paused queue values (``""``: every queue of the model)
    by_model: dict[str, frozenset[str]]


_SNAPSHOTS: dict[str, _Snapshot] = {}
#: database alias -> ``time.monotonic()`` of its last :func:`invalidate` (a snapshot
#: whose SELECT was sent before it is not kept)
_DROPPED: dict[str, float] = {}
_LOCK = threading.Lock()


def _after_fork() -> None:
    """A forked child (the worker's ``--processes``) starts with its own lock and no
    snapshot: the parent's lock may have been held by another thread at the fork."""
    global _LOCK
    _LOCK = threading.Lock()
    _SNAPSHOTS.clear()


os.register_at_fork(after_in_child=_after_fork)


def _read(using: str) -> _Snapshot:
    taken = time.monotonic()
    conn = connections[using]
    statement = for_connection(conn).paused_queues(conn)
    try:
        with conn.cursor() as cursor:
            cursor.execute(statement.sql, statement.params)
            rows = cursor.fetchall()
    except DatabaseError as exc:
        if _table_present(using):
            raise
        raise ConfigurationError(
            f"claims read the pause table, which database {using!r} lacks: run python "
            f"manage.py migrate taskclaim{'' if using == 'default' else ' --database ' + using}"
        ) from exc
    found: dict[str, set[str]] = {}
    for model, queue in rows:
        found.setdefault(str(model), set()).add(str(queue or ""))
    expires = taken + float(taskclaim_settings.POLL_INTERVAL)
    return _Snapshot(taken, expires, {k: frozenset(v) for k, v in found.items()})


def _table_present(using: str) -> bool:
    """Whether the pause table exists on ``using``, asked on a fresh connection (the
    failed read may have aborted the current transaction)."""
    from django.apps import apps

    table = apps.get_model("taskclaim", "QueuePause")._meta.db_table
    conn = connections.create_connection(using)
    try:
        with conn.cursor() as cursor:
            return table.lower() in {t.lower() for t in conn.introspection.table_names(cursor)}
    except DatabaseError:
        return True  # cannot tell: let the original error through
    finally:
        conn.close()


def snapshot(using: str, max_age: float | None = None) -> dict[str, frozenset[str]]:
    """Every paused queue of database ``using`` by model label, from a snapshot at most
    ``max_age`` seconds old (default ``TASKCLAIM_POLL_INTERVAL``, as it was when the
    snapshot was read), read again first if it is older. Raises the database's error if
    the pause table cannot be read."""
    found = _SNAPSHOTS.get(using)
    if found is not None:
        now = time.monotonic()
        if now < found.expires if max_age is None else now - found.taken < max_age:
            return found.by_model
    found = _read(using)
    with _LOCK:
        current = _SNAPSHOTS.get(using)
        newer = current is None or current.taken <= found.taken
        if newer and found.taken > _DROPPED.get(using, float("-inf")):
            _SNAPSHOTS[using] = found
    return found.by_model


def paused_queues(label: str, using: str, *, exact: bool = False) -> frozenset[str]:
    """The paused queues of the model ``label`` on ``using`` (``""`` among them: the
    whole model is paused), from a snapshot at most ``TASKCLAIM_POLL_INTERVAL`` old;
    with ``exact``, from the table read now (in the caller's transaction, if any; the
    snapshot is left as it is)."""
    if exact:
        return _read(using).by_model.get(label, _NONE)
    return snapshot(using).get(label, _NONE)


def keep_fresh(using: str, max_age: float) -> None:
    """Read the snapshot of ``using`` again if it is ``max_age`` seconds old or more
    (the worker calls it with its ``--poll`` before each claim)."""
    snapshot(using, max_age)


def invalidate(using: str | None = None) -> None:
    """Drop the snapshot of ``using`` (every database: ``None``): the next claim reads
    the pause table again."""
    now = time.monotonic()
    with _LOCK:
        for alias in {*_SNAPSHOTS, *connections} if using is None else {using}:
            _SNAPSHOTS.pop(alias, None)
            _DROPPED[alias] = now


def notice_label(payload: str | None) -> str | None:
    """The model label of a pause notification's ``payload``, ``None`` for any other."""
    if payload and payload.startswith(NOTICE_PREFIX):
        return payload[len(NOTICE_PREFIX) :]
    return None
