"""Exit codes of ``manage.py worker`` (and of each supervised process)."""

from __future__ import annotations

import signal

EXIT_OK = 0
EXIT_CONFIG = 1
EXIT_USAGE = 2
EXIT_GRACE_EXPIRED = 3
EXIT_FORCED = 4
EXIT_BROKEN = 5
EXIT_UNAVAILABLE = 6

#: What each exit code means.
EXIT_CODES = {
    EXIT_OK: "stopped cleanly (signal, --burst drained, --max-tasks or --max-runtime reached)",
    EXIT_CONFIG: "configuration or command-line value refused before starting",
    EXIT_USAGE: "unknown option (argument parser error)",
    EXIT_GRACE_EXPIRED: "stopped with tasks still running after --grace (they were requeued)",
    EXIT_FORCED: "second signal: exited at once; leases recover the held rows",
    EXIT_BROKEN: "executors kept crashing (logged): the worker cannot run tasks; restart it",
    EXIT_UNAVAILABLE: "--burst: the database kept failing (unreachable, or every claim "
    "failing) for 30 s; nothing held was lost",
}

#: Executor crashes tolerated within :data:`CRASH_WINDOW` seconds before the worker
#: gives up with :data:`EXIT_BROKEN`.
MAX_CRASHES = 5
CRASH_WINDOW = 60.0


def describe_exit(code: int) -> str:
    """``signal SIGKILL`` or ``exit code 5``, from :func:`os.waitstatus_to_exitcode`."""
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"
