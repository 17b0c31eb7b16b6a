"""How one worker process begins to stop: the events its threads watch, the signals
that start a graceful stop (the second exits at once), and the supervisor it must not
outlive.

A supervised process (``parent`` given) never outlives its supervisor: when the
supervisor is gone (``SIGHUP`` from ``PR_SET_PDEATHSIG`` on Linux, and a parent-pid
check every second everywhere) it stops at once, without a grace period (see
:mod:`.process`: what a stop then does, and the grace).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from django_taskclaim.worker.exits import EXIT_FORCED

logger = logging.getLogger("django_taskclaim.worker")

#: The signal a supervised process gets when its supervisor dies (``PR_SET_PDEATHSIG``).
PARENT_DEATH_SIGNAL = signal.SIGHUP
#: The signals that stop a worker (the second one: at once).
STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT})
#: The signal a supervisor sends its children for each stop signal it gets. Not the stop
#: signal itself: a child may get that one too, at the same moment — from the terminal
#: (Ctrl-C reaches the whole foreground process group) or from systemd (which signals
#: every process of the unit) — and one stop must count once. A child counts the signals
#: it gets and those passed on separately; the second of either kind exits at once.
FORWARDED: dict[int, int] = {signal.SIGTERM: signal.SIGUSR1, signal.SIGINT: signal.SIGUSR2}
#: What each passed-on signal stands for.
PASSED_ON: dict[int, int] = {forwarded: signum for signum, forwarded in FORWARDED.items()}
#: Every signal a supervised child handles to stop (blocked from the fork until then).
CHILD_STOP_SIGNALS: frozenset[int] = STOP_SIGNALS | frozenset(PASSED_ON)

#: Stop signals a freshly forked child got before its worker handled them.
_early: list[int] = []


def hold_early_stop() -> None:
    """In a supervised child just forked: keep any stop signal that comes before its
    worker's handlers are in place (:meth:`Stop.signals_handled` then acts on it), instead
    of the supervisor's handler it inherited."""
    _early.clear()
    for sig in CHILD_STOP_SIGNALS:
        signal.signal(sig, lambda signum, frame: _early.append(signum))


class Stop:
    """The stop of one worker process (``worker_id``, supervised by ``parent`` or
    ``None``); ``wake`` is called on every request, to wake the claimer."""

    def __init__(self, worker_id: str, parent: int | None, wake: Callable[[], None]) -> None:
        self.worker_id = worker_id
        self.parent = parent
        self._wake = wake
        self.stopping = threading.Event()  # no new claims, nothing new started
        self.halt = threading.Event()  # the threads end (the services' stop event)
        self.main_wake = threading.Event()  # the main loop looks now
        self.reason = ""
        #: The supervisor is gone: stop at once, without grace.
        self.orphaned = False
        self._signals = 0  # stop signals this process got itself
        self._passed_on = 0  # those its supervisor passed on (FORWARDED)
        self._stop_seen = False  # a first stop signal of either kind was acted on

    def request(self, reason: str = "requested") -> None:
        """Begin a graceful stop: no new claims, unstarted rows released, grace starts."""
        if not self.stopping.is_set():
            self.reason = reason
            self.stopping.set()
        self._wake()
        self.main_wake.set()

    @contextmanager
    def signals_handled(self) -> Iterator[None]:
        """SIGTERM / SIGINT (and, supervised, :data:`PARENT_DEATH_SIGNAL`) handled here
        while in the block, if this is the main thread (else none is)."""
        previous: dict[int, Any] = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                previous[sig] = signal.signal(sig, self._on_signal)
            if self.parent is not None:
                previous[PARENT_DEATH_SIGNAL] = signal.signal(
                    PARENT_DEATH_SIGNAL, self._on_parent_signal
                )
                for passed in PASSED_ON:
                    previous[passed] = signal.signal(passed, self._on_signal)
            while _early:  # came between the fork and now
                self._on_signal(_early.pop(0), None)
        try:
            yield
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def _on_signal(self, signum: int, frame: Any) -> None:
        # Python may run a second handler inside this one, between any two lines (the
        # stop signal and its passed-on twin arrive together): each kind has its own
        # count, and the first to mark the stop seen is the one that asks for it.
        passed_on = signum in PASSED_ON
        if passed_on:
            self._passed_on += 1
            count = self._passed_on
            signum = PASSED_ON[signum]
        else:
            self._signals += 1
            count = self._signals
        name = signal.Signals(signum).name
        if count > 1:
            logger.warning(
                "second %s: exiting now worker=%s (leases recover the held rows)",
                name,
                self.worker_id,
            )
            for handler in logging.getLogger().handlers + logger.handlers:
                try:
                    handler.flush()
                except Exception:
                    pass
            sys.stderr.flush()
            os._exit(EXIT_FORCED)
        if self._stop_seen:
            return  # the same stop, from the supervisor and directly: counted once
        self._stop_seen = True
        how = "passed on by the supervisor" if passed_on else "received"
        logger.info("%s %s: stopping worker=%s", name, how, self.worker_id)
        self.request(name)

    def _on_parent_signal(self, signum: int, frame: Any) -> None:
        self.check_parent()
        self.main_wake.set()

    def check_parent(self) -> None:
        """Stop at once, without grace, when the supervisor is gone (our parent changed)."""
        if self.parent is None or self.orphaned or os.getppid() == self.parent:
            return
        self.orphaned = True
        logger.warning(
            "supervisor gone (pid %s): stopping now worker=%s, giving back the rows held",
            self.parent,
            self.worker_id,
        )
        self.request("supervisor gone")
