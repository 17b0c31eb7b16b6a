"""One base for the worker's background threads, and the worker's one outage tracker.

- :class:`Service` — a background thread of the worker process (River's start/stop
  service): ``start()`` / :meth:`~Service.stop`, one stop event, :meth:`~Service.wait`
  that returns early on stop, and the outage loop every thread shares: a failure is
  logged as one line (:func:`one_line`), a warning the first time in a run of failures
  and at debug level after, its connections dropped, and the retry waits
  :meth:`~Service.retry_delay` (the one backoff rule, :func:`~.dbconn.backoff`) — a wait
  that a reconnect by any thread of the process ends (:func:`~.dbconn.pause`). Its
  subclasses live in :mod:`.maintenance` (heartbeat, reaping, scheduler, listener).
- :class:`Outage` — a run of failures of one kind of database work, for one worker:
  every thread's loop (through :class:`Service`), the claimer's claims and the
  preflight's connect (which report it every :data:`WARN_EVERY` seconds, and with
  ``--burst`` give up after a while). The process-wide side of an outage (which database
  is down, the waits a reconnect ends, stale connections) is :mod:`.dbconn`'s.
- :func:`one_line` — ``Type: first line of the message``, for every log line of the
  worker that names an error.

Neighbours: :mod:`.dbconn` below it; :mod:`.maintenance`, :mod:`.claimer`,
:mod:`.preflight` and :mod:`.process` (which starts and stops the services) above.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from django.db import DatabaseError

from django_taskclaim.redact import redact
from django_taskclaim.worker.dbconn import backoff, close, pause

logger = logging.getLogger("django_taskclaim.worker")

#: Seconds between two warnings about the same reported outage (the first failure warns
#: at once).
WARN_EVERY = 30.0


def one_line(exc: BaseException) -> str:
    """``Type: first line of the message``, for log lines (any password in it hidden:
    :func:`~django_taskclaim.redact.redact`)."""
    lines = redact(str(exc)).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}".strip()


class Outage:
    """A run of failures of one kind of database work (``what``), for one worker.

    :meth:`failed` counts a failure (``failures``, ``last_error``, the run's start) and
    returns whether it began the run; :meth:`ok` ends the run and returns whether one was
    under way. Thread-safe. ``give_up_after`` (seconds) makes :meth:`exhausted` true once
    the run has lasted that long.

    With ``warn_every`` (seconds, :data:`WARN_EVERY` by default) the outage reports
    itself: a warning at the first failure and then one every ``warn_every`` seconds
    while failures go on (the ones between at debug level), and one line when it ends;
    ``warn_first=False`` leaves the first warning and the end to the caller's own log.
    With ``warn_every=None`` it only counts: its owner logs (a :class:`Service`: warn
    once, then debug).
    """

    def __init__(
        self,
        what: str,
        worker_id: str,
        *,
        using: str | None = None,
        give_up_after: float | None = None,
        warn_every: float | None = WARN_EVERY,
        warn_first: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.what = what
        self.worker_id = worker_id
        self.using = using
        self.give_up_after = give_up_after
        self.warn_every = warn_every
        self.warn_first = warn_first
        self.clock = clock
        self.failures = 0
        self.last_error = ""
        self._lock = threading.Lock()
        self._since: float | None = None
        self._warned: float | None = None

    def failed(self, exc: BaseException) -> bool:
        """One more failure (``exc``); whether it is the first of a run. A reporting
        outage warns if it is the first or the last warning is ``warn_every`` seconds
        old."""
        now = self.clock()
        with self._lock:
            self.failures += 1
            self.last_error = one_line(exc)
            if self._since is None:
                self._since = now
            first = self._warned is None
            every = self.warn_every
            due = every is not None and (first or now - (self._warned or now) >= every)
            if first or due:
                self._warned = now
            lasted = now - self._since
        if every is None:
            return first
        if due and (self.warn_first or not first):
            logger.warning(
                "database still failing: %s worker=%s for=%.0fs failures=%s error=%s (retrying)"
                if not first
                else "database error: %s worker=%s for=%.0fs failures=%s error=%s (retrying)",
                self.what,
                self.worker_id,
                lasted,
                self.failures,
                self.last_error,
            )
        else:
            logger.debug(
                "database error: %s worker=%s failures=%s error=%s",
                self.what,
                self.worker_id,
                self.failures,
                self.last_error,
            )
        return first

    def ok(self) -> bool:
        """The work succeeded: the outage, if any, is over (returned: whether one was)."""
        if self._since is None:  # the common case: no lock taken
            return False
        with self._lock:
            since, self._since, self._warned = self._since, None, None
            failures, self.failures = self.failures, 0
        if since is None:
            return False
        if self.warn_every is not None and self.warn_first:
            logger.info(
                "database reachable again: %s worker=%s after=%.0fs failures=%s",
                self.what,
                self.worker_id,
                self.clock() - since,
                failures,
            )
        return True

    def delay(self) -> float:
        """Seconds to wait before the next try: the one backoff rule
        (:func:`~.dbconn.backoff`: 0.5–1 s while the outage is under 30 s, then growing
        to 15 s)."""
        return backoff(self.failures, self.using)

    def lasted(self) -> float:
        """Seconds since the first failure of the current run (0 when none)."""
        with self._lock:
            return 0.0 if self._since is None else self.clock() - self._since

    def exhausted(self) -> bool:
        """Whether the run has lasted ``give_up_after`` seconds."""
        return (
            self.give_up_after is not None
            and self.failures > 0
            and (self.lasted() >= self.give_up_after)
        )

    def give_up_line(self, using: str) -> str:
        """The one line of a worker that gives up on its database."""
        return (
            f"database {using!r} failing for {self.give_up_after or 0:g}s ({self.what}: "
            f"{self.last_error}), giving up (--burst): check DATABASES[{using!r}] and that "
            "the server accepts connections"
        )


class Service(threading.Thread):
    """A background thread of the worker: subclasses write :meth:`loop`.

    ``halt`` is the stop event (the worker's own, shared by its threads, or a new one);
    :meth:`stop` sets it and ends a retry wait at once. When :meth:`loop` returns, the
    thread's connections to ``using`` and to the ``databases`` it names are closed.
    """

    def __init__(
        self,
        name: str,
        *,
        worker_id: str,
        using: str,
        halt: threading.Event | None = None,
        databases: tuple[str, ...] = (),
    ) -> None:
        super().__init__(name=name, daemon=True)
        self.worker_id = worker_id
        self.using = using
        self.halt = halt if halt is not None else threading.Event()
        self.databases = tuple(dict.fromkeys((using, *databases)))
        #: This thread's run of database failures (counted; the thread logs them).
        self.outage = Outage(name, worker_id, using=using, warn_every=None)
        self._retry = threading.Event()  # ends a retry wait early: stop, a reconnect

    def run(self) -> None:
        try:
            self.loop()
        finally:
            self.close_connections()

    def loop(self) -> None:  # pragma: no cover - every subclass has its own
        raise NotImplementedError

    def stop(self) -> None:
        """Ask the thread to end: its waits return at once."""
        self.halt.set()
        self._retry.set()

    @property
    def stopped(self) -> bool:
        return self.halt.is_set()

    def wait(self, seconds: float) -> bool:
        """Sleep up to ``seconds``; return early, True, once the thread is asked to stop."""
        return self.halt.wait(max(0.0, seconds))

    def retry_delay(self) -> float:
        """Seconds before the next try after a failure (:meth:`Outage.delay`)."""
        return self.outage.delay()

    def wait_to_retry(self, seconds: float) -> bool:
        """Wait ``seconds`` after a failure, less if any thread of the process connects
        to ``using`` again meanwhile (:func:`~.dbconn.pause`); True if asked to stop."""
        if not self.halt.is_set():
            pause(seconds, self._retry, self.using)
        return self.halt.is_set()

    def close_connections(self) -> None:
        """Drop this thread's connections (the next query reconnects)."""
        for alias in self.databases:
            close(alias)

    def failed(
        self,
        exc: BaseException,
        line: str,
        *args: Any,
        always_warn: bool = False,
        traceback: bool | None = None,
        show_delay: bool = False,
    ) -> float:
        """Count a failure and log it as one line, ``line % (*args, one_line(exc))``
        (and the retry delay after it, with ``show_delay``): a warning the first time in
        a run of failures (or ``always_warn``), debug level after; a traceback only for
        an error that is not a database error (or as ``traceback`` says). Its
        connections are dropped, so that the next try reconnects. Returns the seconds to
        wait before the next try (:meth:`retry_delay`)."""
        first = self.outage.failed(exc)
        self.close_connections()
        delay = self.retry_delay()
        if traceback is None:
            traceback = not isinstance(exc, DatabaseError)
        log = logger.warning if first or always_warn else logger.debug
        extra = (delay,) if show_delay else ()
        log(line, *args, one_line(exc), *extra, exc_info=exc if traceback else None)
        return delay

    def recovered(self, line: str | None = None, *args: Any) -> None:
        """The work succeeded: a run of failures, if any, ended (``line`` logged, info)."""
        if self.outage.ok() and line is not None:
            logger.info(line, *args)
