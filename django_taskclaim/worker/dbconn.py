"""Connection handling shared by the worker's threads.

Each thread has its own connection per database alias (Django's connections are
thread-local). A broken connection is closed and replaced on the next query, after a
jittered exponential backoff, instead of reconnecting around every task.
"""

from __future__ import annotations

import random

from django.db import InterfaceError, OperationalError, connections


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
