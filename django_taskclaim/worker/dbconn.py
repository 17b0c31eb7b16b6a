"""Connection handling shared by the worker's threads: the process-wide side of an outage.

Each thread has its own connection per database alias (Django's connections are
thread-local). A broken connection is closed and replaced on the next query, after a
jittered backoff, instead of reconnecting around every task.

An outage is known to the whole process. The first thread that finds a connection broken
marks its database down (:func:`close`, :func:`trouble`); the first thread that connects
again, whichever it is (claimer, heartbeat, registry, the listener: :func:`back`), ends
every backoff wait on that database at once (:func:`pause`), so work resumes as soon as
the database accepts connections, not when the longest backoff runs out. Backoffs stay
short while an outage is short and grow only with a long one (:func:`backoff`). A
connection that may have died unnoticed — opened before an outage another thread saw, or
one whose server hung up while it sat idle — is replaced before its next use
(:func:`drop_stale`), without a round trip.

Each loop's own run of failures (how many, since when, what it logs) is an
:class:`~django_taskclaim.worker.service.Outage`, and its retry waits go through
:class:`~django_taskclaim.worker.service.Service` — both built on this module.
"""

from __future__ import annotations

import logging
import random
import select
import threading
import time
from typing import Any

from django.db import InterfaceError, OperationalError, connections
from django.db.backends.signals import connection_created

logger = logging.getLogger("django_taskclaim.worker")

#: Backoffs are capped at this many seconds while an outage is younger than
#: :data:`SHORT_OUTAGE`; after that the cap is a thirtieth of the outage, up to
#: :data:`MAX_BACKOFF`.
SHORT_BACKOFF = 1.0
SHORT_OUTAGE = 30.0
MAX_BACKOFF = 15.0

_lock = threading.Lock()
_down_since: dict[str, float] = {}  # alias -> monotonic time its outage was first seen
_revivals: dict[str, int] = {}  # alias -> how many times it came back
_waiting: dict[str, set[threading.Event]] = {}  # alias -> events of pause() calls
_epoch = 0  # bumped whenever a connection is found broken; stamped on new connections
_STAMP = "_taskclaim_epoch"
_POLLER = "_taskclaim_poller"
_seen = threading.local()  # per thread: alias -> revivals count at its last failure
_mine = threading.local()  # per thread: alias -> its connection, once it connected


def connection_trouble(exc: BaseException) -> bool:
    """Whether ``exc`` means the connection (not the statement) failed: worth a retry."""
    return isinstance(exc, OperationalError | InterfaceError)


def trouble(using: str) -> None:
    """Record that this thread found ``using`` unreachable or its connection broken.

    Every connection opened before now counts as stale (:func:`drop_stale`), and the
    outage's length, which :func:`backoff` grows with, is counted from the first report."""
    global _epoch
    with _lock:
        _epoch += 1
        _down_since.setdefault(using, time.monotonic())
        revivals = _revivals.get(using, 0)
    if not hasattr(_seen, "revivals"):
        _seen.revivals = {}
    _seen.revivals[using] = revivals


def back(using: str) -> None:
    """A connection to ``using`` succeeded: end its outage and wake every :func:`pause`
    on it. Costs a dictionary lookup when there was no outage."""
    if using not in _down_since:
        return
    with _lock:
        if _down_since.pop(using, None) is None:
            return
        _revivals[using] = _revivals.get(using, 0) + 1
        waiters = list(_waiting.get(using, ()))
    logger.debug("database accepting connections again database=%s", using)
    for event in waiters:
        event.set()


def outage(using: str | None = None) -> float:
    """Seconds since ``using`` (by default: any database) was first found unreachable in
    this outage; 0.0 when it is not known to be down."""
    with _lock:
        since = _down_since.get(using) if using else min(_down_since.values(), default=None)
    return 0.0 if since is None else max(0.0, time.monotonic() - since)


def _on_connection_created(sender: Any, connection: Any, **kwargs: Any) -> None:
    # Sent by the thread that connected, which owns ``connection``.
    setattr(connection, _STAMP, _epoch)
    mine: dict[str, Any] | None = getattr(_mine, "connections", None)
    if mine is None:
        mine = _mine.connections = {}
    mine[connection.alias] = connection
    back(connection.alias)


connection_created.connect(_on_connection_created, dispatch_uid="django_taskclaim.worker.dbconn")


def close(using: str) -> None:
    """Drop this thread's connection to ``using`` so the next query reconnects; if it
    had failed, record the :func:`trouble`."""
    conn = connections[using]
    if conn.errors_occurred:
        trouble(using)
    try:
        conn.close()
    except Exception:  # already broken: closing is best effort
        pass


def backoff(failures: int, using: str | None = None) -> float:
    """Seconds to wait after ``failures`` consecutive failures: 0.5 s, then 1 s while the
    outage of ``using`` (by default: of any database) is under :data:`SHORT_OUTAGE`
    seconds, then a thirtieth of the outage up to :data:`MAX_BACKOFF` (2 s after a
    minute, 15 s after 7.5 minutes); spread by ±50 % so that many workers do not
    reconnect in step."""
    cap = min(MAX_BACKOFF, max(SHORT_BACKOFF, outage(using) / SHORT_OUTAGE))
    return min(cap, 0.25 * 2 ** min(failures, 8)) * random.uniform(0.5, 1.5)


def pause(seconds: float, wake: threading.Event, using: str) -> bool:
    """Wait up to ``seconds`` for ``wake``, which is also set as soon as any thread of
    the process connects to ``using`` again; return at once if that happened since this
    thread's last :func:`trouble`. Returns whether the wait was cut short; ``wake`` is
    cleared."""
    seen: dict[str, int] = getattr(_seen, "revivals", {})
    with _lock:
        revivals = _revivals.get(using, 0)
        revived = seen.get(using, revivals) != revivals
        _waiting.setdefault(using, set()).add(wake)
    if revived:  # once per revival: a later failure waits again
        seen[using] = revivals
    try:
        woken = revived or wake.wait(seconds)
    finally:
        with _lock:
            _waiting[using].discard(wake)
    wake.clear()
    return woken


def _hung_up(conn: Any, raw: Any) -> bool:
    """Whether an idle connection's socket is readable: the server closed it or sent a
    termination notice (an idle client connection receives nothing else). One system
    call, no round trip; False where there is no socket (SQLite)."""
    fileno = getattr(raw, "fileno", None)
    if fileno is None:
        return False
    try:
        fd = fileno()
        if fd < 0:
            return True
        cached = getattr(conn, _POLLER, None)
        if cached is None or cached[0] != fd:
            cached = (fd, select.poll())
            cached[1].register(fd, select.POLLIN)
            setattr(conn, _POLLER, cached)
        return bool(cached[1].poll(0))
    except AttributeError:  # no poll() on this platform: the outage epoch still applies
        return False
    except Exception:  # the driver knows it is closed
        return True


def epoch() -> int:
    """How many times a thread of this process found a connection broken: a caller that
    saw the same number at its last :func:`drop_stale` has no connection opened before
    an outage it has not checked."""
    return _epoch


def drop_stale() -> int:
    """Close this thread's connections that may be dead although they never failed here:
    those opened before another thread found a database unreachable, and those whose
    server hung up while they were idle. Their next query opens a fresh connection
    instead of failing once. No round trip: a number comparison and one ``poll()`` per
    open connection. Connections inside a transaction are left alone. Returns how many
    were closed."""
    mine: dict[str, Any] | None = getattr(_mine, "connections", None)
    if not mine:
        return 0
    dropped = 0
    for conn in mine.values():
        raw = conn.connection
        if raw is None or conn.in_atomic_block or not conn.autocommit:  # a transaction
            continue
        if getattr(conn, _STAMP, _epoch) < _epoch or _hung_up(conn, raw):
            try:
                conn.close()
            except Exception:  # already broken: closing is best effort
                pass
            dropped += 1
            logger.debug("stale connection replaced database=%s", conn.alias)
    return dropped
