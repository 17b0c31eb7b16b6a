"""Connection handling shared by the worker's threads.

Each thread has its own connection per database alias (Django's connections are
thread-local). A broken connection is closed and replaced on the next query, after a
jittered exponential backoff, instead of reconnecting around every task.
"""

from __future__ import annotations

import logging
import random
import threading

from django.db import DatabaseError, InterfaceError, OperationalError, connections

logger = logging.getLogger("django_taskclaim.worker")


def connection_trouble(exc: BaseException) -> bool:
    """Whether ``exc`` means the connection (not the statement) failed: worth a retry."""
    return isinstance(exc, OperationalError | InterfaceError)


def one_line(exc: BaseException) -> str:
    """``Type: first line of the message``, for log lines."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}".strip()


def close(using: str) -> None:
    """Drop this thread's connection to ``using`` so the next query reconnects."""
    try:
        connections[using].close()
    except Exception:  # already broken: closing is best effort
        pass


def backoff(failures: int) -> float:
    """Seconds to wait after ``failures`` consecutive failures: 0.5 s doubling to 15 s,
    spread by ±50 % so that many workers do not reconnect in step."""
    return min(15.0, 0.25 * 2 ** min(failures, 8)) * random.uniform(0.5, 1.5)


def wait_for_database(
    using: str, stopping: threading.Event, wake: threading.Event, worker_id: str
) -> bool:
    """Connect (retrying with backoff during an outage, one warning per outage); False
    if ``stopping`` is set meanwhile. ``wake`` cuts a backoff short."""
    failures = 0
    while not stopping.is_set():
        try:
            connections[using].ensure_connection()
            if failures:
                logger.info("database reachable worker=%s", worker_id)
            return True
        except DatabaseError as exc:
            failures += 1
            delay = backoff(failures)
            log = logger.warning if failures == 1 else logger.debug
            log(
                "database unreachable worker=%s error=%s retry_in=%.1fs",
                worker_id,
                one_line(exc),
                delay,
            )
            close(using)
            wake.wait(delay)
            wake.clear()
    return False
