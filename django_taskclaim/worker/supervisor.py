"""``--processes N``: a small supervisor that forks N worker processes and keeps them up.

The supervisor holds no database connection and runs no thread. It forks each child
after closing its connections; a child runs one :class:`~.process.Worker`
and exits with its code. A child that dies abnormally (a signal, or an exit code other
than 0) is restarted, with backoff if it keeps dying at once; a child that exits 0
(``--burst`` drained, ``--max-tasks`` or ``--max-runtime`` reached) is not. SIGTERM /
SIGINT are passed on to every child (as :data:`~.stopping.FORWARDED`: a child that gets
the same signal directly, from Ctrl-C in a terminal or from systemd, still counts one
stop); a second one is passed on too (children then exit at once) and the supervisor
exits with :data:`~.exits.EXIT_FORCED`.
POSIX only (it uses ``fork``).

The supervisor is the one place that *knows* a worker died: ``waitpid`` told it. Each
time it reaps a child, whatever the exit, it calls ``on_exit`` (the worker command
releases the rows that child still held and marks it stopped in the registry:
:mod:`.childexit`) before it starts a replacement.

No child outlives the supervisor: each asks the kernel for ``SIGHUP`` when its parent
dies (``PR_SET_PDEATHSIG``, Linux) and checks its parent's pid every second (everywhere);
an orphaned child stops at once, giving back the rows it holds (see
:mod:`.process`). A child that exits with :data:`~.exits.EXIT_UNAVAILABLE` (``--burst``
gave up on its database) is not restarted either.

Watched (``supervise`` always watches), each child has a pipe to the supervisor on which
it reports how long its leases surely last and the deadlines of the bodies it runs; the
supervisor kills a child before its leases can lapse, or when a body runs past its
deadline and grace (:mod:`.childwatch`).
"""

from __future__ import annotations

import ctypes
import gc
import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from django.db import DatabaseError, connections

from django_taskclaim.db import default_worker_id
from django_taskclaim.worker.childexit import child_exited
from django_taskclaim.worker.childwatch import WATCH_POLL, ChildWatch
from django_taskclaim.worker.config import WorkerConfig
from django_taskclaim.worker.exits import (
    EXIT_BROKEN,
    EXIT_CONFIG,
    EXIT_FORCED,
    EXIT_OK,
    EXIT_UNAVAILABLE,
    describe_exit,
)
from django_taskclaim.worker.process import Worker
from django_taskclaim.worker.stopping import (
    CHILD_STOP_SIGNALS,
    FORWARDED,
    PARENT_DEATH_SIGNAL,
    hold_early_stop,
)

logger = logging.getLogger("django_taskclaim.supervisor")

#: A child that dies within this many seconds of its start counts as a fast failure.
FAST_FAILURE = 5.0

#: Exit codes after which a child is not restarted: it finished, or restarting it
#: cannot help (a database or schema that refuses it once it answered; ``--burst`` gave
#: up on its database).
FINAL = frozenset({EXIT_OK, EXIT_CONFIG, EXIT_UNAVAILABLE})

#: ``prctl`` option: the signal this process gets when its parent dies (Linux).
PR_SET_PDEATHSIG = 1


def die_with_parent(signum: int) -> bool:
    """Ask the kernel to send ``signum`` to this process when its parent dies (Linux
    ``prctl(PR_SET_PDEATHSIG)``); ``False`` where that is not available."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return False
    zero = ctypes.c_ulong(0)
    return int(prctl(PR_SET_PDEATHSIG, ctypes.c_ulong(signum), zero, zero, zero)) == 0


class Supervisor:
    """Run ``processes`` children, each calling ``target(index)`` and exiting with its result.

    ``run()`` returns 0 when every child stopped cleanly, else the highest child exit code
    seen after the stop began or of a child not restarted (:data:`FINAL`), or
    :data:`EXIT_FORCED` after a second signal.
    """

    def __init__(
        self,
        target: Callable[[int], int],
        processes: int,
        *,
        on_exit: Callable[[int, int, int], None] | None = None,
        watch: bool = False,
    ) -> None:
        if processes < 1:
            raise ValueError("processes must be >= 1")
        self.target = target
        self.on_exit = on_exit
        #: In a child: the write end of its report pipe (``None``: not watched).
        self.report_fd: int | None = None
        self.processes = processes
        self.pid = os.getpid()  # the parent each child watches
        self.children: dict[int, tuple[int, float]] = {}  # pid -> (index, started)
        #: The children's report pipes and whom they get killed (``None``: not watched).
        self.watch = ChildWatch(self.children) if watch else None
        self.restarts = 0
        self._signals = 0
        self._stopping = False
        self._failures: dict[int, int] = {}  # index -> consecutive fast failures
        self._code = EXIT_OK

    def _spawn(self, index: int) -> int | None:
        """Fork child ``index``; ``None`` (nothing forked) once the stop has begun.

        The stop signals are blocked from the last look at the stop to the child's
        registration: a SIGTERM that arrives meanwhile is handled right after, so it is
        passed on to the new child as well (before, a child forked then was never told
        and the supervisor waited for it forever). The child keeps them blocked until it
        holds any that came in for its worker (:func:`~.stopping.hold_early_stop`)."""
        connections.close_all()
        sys.stdout.flush()
        sys.stderr.flush()
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, CHILD_STOP_SIGNALS)
        if self._stopping:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            return None
        read_end, write_end = os.pipe() if self.watch else (-1, -1)
        # What is loaded so far stays shared with the child: its collections leave these
        # objects alone instead of writing to each one's header (copying its page).
        gc.freeze()
        pid = os.fork()
        if pid == 0:  # child
            code = EXIT_BROKEN  # a crash: restarted (not 1, a refusal that is not)
            try:
                hold_early_stop()
                signal.pthread_sigmask(signal.SIG_SETMASK, mask)
                if self.watch:
                    self.watch.in_child(read_end)
                    self.report_fd = write_end
                die_with_parent(PARENT_DEATH_SIGNAL)
                if os.getppid() != self.pid:  # the supervisor died before that
                    os._exit(EXIT_OK)
                code = int(self.target(index))
            except BaseException as exc:  # never return into the supervisor's loop
                logger.error("worker process crashed index=%s error=%r", index, exc, exc_info=exc)
                code = EXIT_BROKEN
            finally:
                try:
                    sys.stdout.flush()
                    sys.stderr.flush()
                finally:
                    os._exit(code)
        try:
            self.children[pid] = (index, time.monotonic())
            if self.watch:
                self.watch.started(pid, read_end, write_end)
            logger.info("worker process started index=%s pid=%s", index, pid)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        return pid

    def _on_signal(self, signum: int, frame: Any) -> None:
        self._signals += 1
        self._stopping = True
        for pid in list(self.children):
            try:  # passed on as its own signal: a child may get ``signum`` directly too
                os.kill(pid, FORWARDED.get(signum, signum))
            except ProcessLookupError:
                pass
        if self._signals > 1:
            logger.warning("second %s: supervisor exiting now", signal.Signals(signum).name)
            sys.stderr.flush()
            os._exit(EXIT_FORCED)

    def _after_exit(self, index: int, pid: int, code: int) -> None:
        """Run ``on_exit`` for a reaped child; its errors are logged, never fatal."""
        if self.on_exit is None:
            return
        try:
            self.on_exit(index, pid, code)
        except Exception as exc:  # a database away (expected: one line) or a bug
            logger.error(
                "could not release the rows of exited worker index=%s pid=%s error=%s "
                "(their leases will expire)",
                index,
                pid,
                " ".join(str(exc).split()) or repr(exc),
                exc_info=None if isinstance(exc, DatabaseError) else exc,
            )
        finally:
            connections.close_all()  # no connection may cross the next fork

    def killed_for(self, pid: int) -> list[dict[str, Any]]:
        """The reports of the bodies child ``pid`` was killed for (ran past their deadline
        and grace), ``[]`` if it was not killed by this supervisor."""
        return self.watch.killed_for(pid) if self.watch else []

    def stalled_for(self, pid: int) -> float | None:
        """Seconds child ``pid`` had been silent when it was killed for it, else ``None``."""
        return self.watch.stalled_for(pid) if self.watch else None

    def _wait(self) -> tuple[int, int]:
        """``os.wait()``; while watching, the reports are read and overdue or silent
        children killed meanwhile (:data:`WATCH_POLL`)."""
        if not self.watch:
            return os.wait()
        while True:
            pid, status = os.waitpid(-1, os.WNOHANG)  # ChildProcessError: no child left
            if pid:
                return pid, status
            self._pause(WATCH_POLL)

    def _pause(self, seconds: float) -> None:
        """Wait ``seconds`` (less if a child's lease time comes first), reading the
        children's reports meanwhile if watched."""
        if self.watch:
            self.watch.pause(seconds)
        else:
            time.sleep(max(0.0, seconds))

    def run(self) -> int:
        """Start the children and supervise them until all have stopped."""
        previous = {
            sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGTERM, signal.SIGINT)
        }
        try:
            for index in range(self.processes):
                self._spawn(index)
            while self.children:
                try:
                    pid, status = self._wait()
                except ChildProcessError:
                    break
                if pid in self.children:
                    self._reaped(pid, os.waitstatus_to_exitcode(status))
            return self._code
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _reaped(self, pid: int, code: int) -> None:
        """Child ``pid`` exited with ``code``: release what it held (``on_exit``), then
        restart it (with backoff if it keeps dying at once) unless it need not be."""
        index, started = self.children.pop(pid)
        if self.watch:
            self.watch.reaped(pid)
        self._after_exit(index, pid, code)
        replaced = self.watch.replaced(pid) if self.watch else False
        if self._stopping:
            self._code = max(self._code, code if code >= 0 else EXIT_FORCED)
            return
        if code == EXIT_OK:
            logger.info("worker process finished index=%s pid=%s", index, pid)
            return
        if code in FINAL:
            self._code = max(self._code, code)
            logger.warning(
                "worker process gave up index=%s pid=%s how=%s (not restarted)",
                index,
                pid,
                describe_exit(code),
            )
            return
        how = describe_exit(code)
        # A child replaced for a body past its deadline did not fail: no backoff.
        fast = time.monotonic() - started < FAST_FAILURE and not replaced
        self._failures[index] = self._failures.get(index, 0) + 1 if fast else 0
        delay = min(30.0, 0.5 * 2 ** self._failures[index]) if fast else 0.0
        logger.warning(
            "worker process died index=%s pid=%s how=%s restart_in=%.1fs",
            index,
            pid,
            how,
            delay,
        )
        deadline = time.monotonic() + delay
        while not self._stopping and time.monotonic() < deadline:
            self._pause(min(0.2, deadline - time.monotonic()))
        if not self._stopping and self._spawn(index) is not None:
            self.restarts += 1


def supervise(
    configs: WorkerConfig | Sequence[WorkerConfig],
    processes: int,
    announce: Callable[[str], None],
    *,
    single: bool = False,
) -> int:
    """Run ``processes`` supervised :class:`~.process.Worker` children of each
    configuration in ``configs`` (one per database the fleet drains, see
    :mod:`.fleet`); return the supervisor's exit code. Child ``i`` is named
    ``<worker_id>-i`` (or gets the default id of its pid). ``announce`` gets each
    child's startup line.

    Each child the supervisor sees exit (``waitpid``: proof of death) has the rows it
    still held released at once on its own database and its registry row marked stopped
    before a replacement starts (:mod:`.childexit`). Each child stops, giving back what
    it holds, as soon as the supervisor is gone.

    ``single``: the worker command's default, one process that is not named a child of
    a fleet: it keeps ``--worker-id`` as given, its startup line is the worker's own
    (with ``supervisor=<pid>``), and a ``--burst`` run ends with its leftover line."""
    plans = [configs] if isinstance(configs, WorkerConfig) else list(configs)
    total = processes * len(plans)
    if single and total != 1:
        raise ValueError("single supervises one process")

    def config_of(index: int) -> WorkerConfig:
        return plans[index // processes]

    def child_id(index: int) -> str | None:
        worker_id = config_of(index).worker_id
        if single:
            return worker_id
        return f"{worker_id}-{index}" if worker_id else None

    def child(index: int) -> int:
        config = replace(config_of(index), worker_id=child_id(index))
        worker = Worker(config, parent=sup.pid, report_fd=sup.report_fd)
        if not single:
            return worker.run(lambda: announce(worker.describe() + f" process={index + 1}/{total}"))
        code = worker.run(lambda: announce(worker.describe() + f" supervisor={sup.pid}"))
        if config.burst and code == EXIT_OK:
            try:
                announce(worker.leftover())
            except DatabaseError:
                pass  # the summary is a courtesy; the run itself succeeded
        return code

    def exited(index: int, pid: int, code: int) -> None:
        worker_id = child_id(index) or default_worker_id(pid)
        child_exited(
            config_of(index),
            worker_id,
            pid,
            code,
            sup.killed_for(pid),
            stalled=sup.stalled_for(pid),
        )

    databases = ",".join(c.using for c in plans)
    sup = Supervisor(child, total, on_exit=exited, watch=True)
    if not single:
        announce(f"taskclaim supervisor pid={sup.pid} processes={total} databases={databases}")
    return sup.run()
