"""``--processes N``: a small supervisor that forks N worker processes and keeps them up.

The supervisor holds no database connection and runs no thread. It forks each child
after closing its connections; a child runs one :class:`~.process.Worker`
and exits with its code. A child that dies abnormally (a signal, or an exit code other
than 0) is restarted, with backoff if it keeps dying at once; a child that exits 0
(``--burst`` drained, ``--max-tasks`` or ``--max-runtime`` reached) is not. SIGTERM /
SIGINT are forwarded to every child; a second one is forwarded too (children then exit at
once) and the supervisor exits with :data:`~.exits.EXIT_FORCED`.
POSIX only (it uses ``fork``).

The supervisor is the one place that *knows* a worker died: ``waitpid`` told it. Each
time it reaps a child, whatever the exit, it calls ``on_exit`` (the worker command
releases the rows that child still held, fenced on holder, status and token: see
:func:`supervise`) before it starts a replacement, so a task of a SIGKILLed or
OOM-killed child runs again within a second or two instead of after its lease — the
only early recovery the library makes. It also marks that child stopped in the worker
registry, so that its replacement (same worker id) registers as the same worker, not as
a second process using its id.

No child outlives the supervisor: each asks the kernel for ``SIGHUP`` when its parent
dies (``PR_SET_PDEATHSIG``, Linux) and checks its parent's pid every second (everywhere);
an orphaned child stops at once, giving back the rows it holds (see
:mod:`.process`). A child that exits with :data:`~.exits.EXIT_UNAVAILABLE` (``--burst``
gave up on its database) is not restarted either.

Each child has a pipe to the supervisor, which, instead of blocking in ``wait()``, reads
it and looks at its children every :data:`WATCH_POLL` seconds (sooner when a child's
lease time comes first).

Leases (ONE BODY AT A TIME): a body that stalls its whole process (a C call holding the
GIL, ``SIGSTOP``) stops that process's heartbeat too. Each child reports on its pipe how
long the leases of the rows it may still run surely last (:mod:`.leasewatch`: the time
taken before the claim or renewal that set them, plus the lease, less a margin); a
child that has not renewed them by then is killed (``SIGKILL``) before they can lapse,
and once ``waitpid`` has seen it die its rows are released as after any crash. So
another worker never takes back a row whose body still runs in a stalled child.

Deadlines (``ClaimMeta.timeout``, a row's ``task_timeout``): each child reports the
bodies with a deadline it starts and ends on the same pipe (:mod:`.deadlines`). A child
still running a body ``TASKCLAIM_TIMEOUT_GRACE`` seconds past its deadline is killed
(``SIGKILL``: the body ignores its cancellation flag) and, once reaped, replaced at
once: that attempt fails with ``TimeoutError``, fenced, and the child's other rows go
back ``ready`` without losing an attempt (:mod:`~django_taskclaim.recovery.overdue`).
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import select
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from django.apps import apps
from django.db import DatabaseError, connections

from django_taskclaim.db import default_worker_id
from django_taskclaim.recovery.overdue import fail_overdue, give_back_held
from django_taskclaim.recovery.reap import release_worker
from django_taskclaim.worker.config import WorkerConfig
from django_taskclaim.worker.exits import EXIT_FORCED, EXIT_OK, EXIT_UNAVAILABLE
from django_taskclaim.worker.maintenance.registry import mark_stopped
from django_taskclaim.worker.process import Worker
from django_taskclaim.worker.stopping import PARENT_DEATH_SIGNAL

logger = logging.getLogger("django_taskclaim.supervisor")

#: A child that dies within this many seconds of its start counts as a fast failure.
FAST_FAILURE = 5.0

#: Exit codes after which a child is not restarted: it finished, or restarting it
#: cannot help (``--burst`` gave up on its database).
FINAL = frozenset({EXIT_OK, EXIT_UNAVAILABLE})

#: ``prctl`` option: the signal this process gets when its parent dies (Linux).
PR_SET_PDEATHSIG = 1

#: Seconds between the supervisor's looks at its children's deadline reports and exits,
#: when it watches deadlines (it then cannot block in ``wait()``).
WATCH_POLL = 0.2


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


def describe_exit(code: int) -> str:
    """``signal SIGKILL`` or ``exit code 5``, from :func:`os.waitstatus_to_exitcode`."""
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


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
        self.watch = watch
        #: In a child: the write end of its report pipe (``None``: not watched).
        self.report_fd: int | None = None
        self._reports: dict[int, int] = {}  # read end -> child pid
        self._partial: dict[int, bytes] = {}  # read end -> an unfinished line
        self._armed: dict[int, dict[str, dict[str, Any]]] = {}  # pid -> key -> report
        self._killed: dict[int, list[dict[str, Any]]] = {}  # pid -> the bodies it ran late
        self._lease_kill: dict[int, float] = {}  # pid -> when its leases could lapse (less margin)
        self.processes = processes
        self.pid = os.getpid()  # the parent each child watches
        self.children: dict[int, tuple[int, float]] = {}  # pid -> (index, started)
        self.restarts = 0
        self._signals = 0
        self._stopping = False
        self._failures: dict[int, int] = {}  # index -> consecutive fast failures
        self._code = EXIT_OK

    def _spawn(self, index: int) -> int:
        connections.close_all()
        sys.stdout.flush()
        sys.stderr.flush()
        read_end, write_end = os.pipe() if self.watch else (-1, -1)
        pid = os.fork()
        if pid == 0:  # child
            code = 1
            try:
                if self.watch:
                    for fd in [read_end, *self._reports]:
                        os.close(fd)
                    self._reports.clear()
                    self.report_fd = write_end
                die_with_parent(PARENT_DEATH_SIGNAL)
                if os.getppid() != self.pid:  # the supervisor died before that
                    os._exit(EXIT_OK)
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                signal.signal(signal.SIGINT, signal.SIG_DFL)
                code = int(self.target(index))
            except BaseException as exc:  # never return into the supervisor's loop
                logger.error("worker process crashed index=%s error=%r", index, exc, exc_info=exc)
                code = 1
            finally:
                try:
                    sys.stdout.flush()
                    sys.stderr.flush()
                finally:
                    os._exit(code)
        self.children[pid] = (index, time.monotonic())
        if self.watch:
            os.close(write_end)
            os.set_blocking(read_end, False)
            self._reports[read_end] = pid
            self._armed[pid] = {}
        logger.info("worker process started index=%s pid=%s", index, pid)
        return pid

    def _on_signal(self, signum: int, frame: Any) -> None:
        self._signals += 1
        self._stopping = True
        for pid in list(self.children):
            try:
                os.kill(pid, signum)
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

    # -- deadlines: each child reports the bodies it runs that have one ----------------
    def killed_for(self, pid: int) -> list[dict[str, Any]]:
        """The reports of the bodies child ``pid`` was killed for (ran past their deadline
        and grace), ``[]`` if it was not killed by this supervisor."""
        return list(self._killed.get(pid, ()))

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
        if not self.watch:
            time.sleep(max(0.0, seconds))
            return
        if self._lease_kill:
            seconds = min(seconds, min(self._lease_kill.values()) - time.monotonic())
        fds = list(self._reports)
        if fds:
            ready, _, _ = select.select(fds, [], [], max(0.0, seconds))
            for fd in ready:
                self._read(fd)
        else:
            time.sleep(max(0.0, seconds))
        self._kill_overdue()

    def _read(self, fd: int) -> None:
        """Take in what child's pipe ``fd`` holds: ``arm`` and ``disarm`` lines (its
        deadlines), ``lease`` lines (when its leases could lapse: :mod:`.leasewatch`)."""
        pid = self._reports.get(fd)
        if pid is None:
            return
        chunks = [self._partial.pop(fd, b"")]
        eof = False
        while True:
            try:
                data = os.read(fd, 65536)
            except BlockingIOError:
                break
            except OSError:
                eof = True
                break
            if not data:
                eof = True
                break
            chunks.append(data)
        *lines, rest = b"".join(chunks).split(b"\n")
        if rest:
            self._partial[fd] = rest
        armed = self._armed.setdefault(pid, {})
        for line in lines:
            try:
                report = json.loads(line)
                if report["op"] == "lease":
                    self._lease(pid, report["kill_at"])
                    continue
                key = report["key"]
                if report["op"] == "arm":
                    report["kill_at"] = time.monotonic() + float(report["kill_in"])
                    armed[key] = report
                else:
                    armed.pop(key, None)
            except (ValueError, KeyError, TypeError):
                logger.warning("unreadable worker report pid=%s line=%r", pid, line[:200])
        if eof:
            os.close(fd)
            del self._reports[fd]
            self._partial.pop(fd, None)

    def _forget_reports(self, pid: int) -> None:
        """Child ``pid`` exited: read its last reports, close its pipe."""
        for fd in [fd for fd, owner in self._reports.items() if owner == pid]:
            self._read(fd)
            if fd in self._reports:
                os.close(fd)
                del self._reports[fd]
                self._partial.pop(fd, None)
        self._armed.pop(pid, None)
        self._lease_kill.pop(pid, None)

    def _lease(self, pid: int, kill_at: float | None) -> None:
        """Child ``pid`` holds rows whose leases could lapse soon after ``kill_at``
        (monotonic, one clock for every process of the host), or none (``None``)."""
        if kill_at is None or pid in self._killed:
            self._lease_kill.pop(pid, None)
        else:
            self._lease_kill[pid] = float(kill_at)

    def _kill_overdue(self) -> None:
        """Kill each child running a body past its deadline and grace (SIGKILL: the body
        ignores its cancellation flag), and each child whose leases could lapse before it
        renews them (its heartbeat is silent: a body holding the GIL, a stopped process);
        its rows are settled when it is reaped."""
        now = time.monotonic()
        for pid, kill_at in list(self._lease_kill.items()):
            if now < kill_at:
                continue
            del self._lease_kill[pid]
            if pid not in self.children or pid in self._killed:
                continue  # gone, or killed already
            self._killed[pid] = []  # not a deadline: its rows are released as after a crash
            logger.warning(
                "worker process silent: its leases were not renewed in time (a body holding "
                "the GIL, or the database away); killing it before they can lapse, so that "
                "no task runs twice at once index=%s pid=%s",
                self.children[pid][0],
                pid,
            )
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for pid, armed in self._armed.items():
            late = [r for r in armed.values() if now >= r["kill_at"]]
            if not late or pid not in self.children or pid in self._killed:
                continue
            self._killed[pid] = late
            for report in late:
                logger.warning(
                    "task past its deadline and grace: replacing worker process "
                    "index=%s pid=%s task=%s:%s timeout=%gs",
                    self.children[pid][0],
                    pid,
                    report.get("label"),
                    report.get("pk"),
                    float(report.get("timeout", 0)),
                )
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

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
                if pid not in self.children:
                    continue
                index, started = self.children.pop(pid)
                code = os.waitstatus_to_exitcode(status)
                self._forget_reports(pid)
                self._after_exit(index, pid, code)
                replaced = self._killed.pop(pid, None) is not None
                if self._stopping:
                    self._code = max(self._code, code if code >= 0 else EXIT_FORCED)
                    continue
                if code == EXIT_OK:
                    logger.info("worker process finished index=%s pid=%s", index, pid)
                    continue
                if code in FINAL:
                    self._code = max(self._code, code)
                    logger.warning(
                        "worker process gave up index=%s pid=%s how=%s (not restarted)",
                        index,
                        pid,
                        describe_exit(code),
                    )
                    continue
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
                if not self._stopping:
                    self.restarts += 1
                    self._spawn(index)
            return self._code
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def supervise(
    configs: WorkerConfig | Sequence[WorkerConfig],
    processes: int,
    announce: Callable[[str], None],
) -> int:
    """Run ``processes`` supervised :class:`~.process.Worker` children of each
    configuration in ``configs`` (one per database the fleet drains, see
    :mod:`.fleet`); return the supervisor's exit code. Child ``i`` is named
    ``<worker_id>-i`` (or gets the default id of its pid). ``announce`` gets each
    child's startup line.

    Each child the supervisor sees exit (``waitpid``: proof of death) has the rows it
    still held released at once on its own database
    (:func:`~django_taskclaim.recovery.reap.release_worker`, fenced on holder, status and
    token) and its registry row marked stopped before a replacement starts. Each child
    stops, giving back what it holds, as soon as the supervisor is gone."""
    plans = [configs] if isinstance(configs, WorkerConfig) else list(configs)
    total = processes * len(plans)

    def config_of(index: int) -> WorkerConfig:
        return plans[index // processes]

    def child_id(index: int) -> str | None:
        worker_id = config_of(index).worker_id
        return f"{worker_id}-{index}" if worker_id else None

    def child(index: int) -> int:
        worker = Worker(
            replace(config_of(index), worker_id=child_id(index)),
            parent=sup.pid,
            report_fd=sup.report_fd,
        )
        return worker.run(lambda: announce(worker.describe() + f" process={index + 1}/{total}"))

    def exited(index: int, pid: int, code: int) -> None:
        config = config_of(index)
        worker_id = child_id(index) or default_worker_id(pid)
        late = sup.killed_for(pid)
        if late:
            try:
                replaced(config, worker_id, late)
            except Exception as exc:  # what is left is released below, as for any exit
                logger.error(
                    "could not settle the rows of the replaced worker worker=%s error=%s",
                    worker_id,
                    " ".join(str(exc).split()) or repr(exc),
                    exc_info=None if isinstance(exc, DatabaseError) else exc,
                )
                connections.close_all()
        result = release_worker(
            worker_id,
            *config.models,
            using=config.using,
            reason=f"worker {{}} exited ({describe_exit(code)}); released by its supervisor",
        )
        if result.total:
            logger.warning(
                "released rows of exited worker worker=%s how=%s requeued=%s failed=%s",
                worker_id,
                describe_exit(code),
                result.requeued,
                result.failed,
            )
        mark_stopped(worker_id, pid)

    def replaced(config: WorkerConfig, worker_id: str, late: list[dict[str, Any]]) -> None:
        """The child was killed for bodies past their deadline and grace: each such
        attempt fails with ``TimeoutError``; its other rows go back without losing an
        attempt (:mod:`~django_taskclaim.recovery.overdue`)."""
        keep = []
        for report in late:
            model = apps.get_model(report["label"])
            outcome = fail_overdue(
                model,
                report["pk"],
                int(report["version"]),
                using=config.using,
                timeout=float(report["timeout"]),
            )
            keep.append((model, report["pk"]))
            logger.warning(
                "task past its deadline failed worker=%s task=%s:%s timeout=%gs outcome=%s",
                worker_id,
                report["label"],
                report["pk"],
                float(report["timeout"]),
                outcome or "already settled",
            )
        given = give_back_held(worker_id, config.models, using=config.using, keep=keep)
        if given:
            logger.warning(
                "gave back the other rows of the replaced worker worker=%s rows=%s "
                "(attempts not counted)",
                worker_id,
                given,
            )

    databases = ",".join(c.using for c in plans)
    sup = Supervisor(child, total, on_exit=exited, watch=True)
    announce(f"taskclaim supervisor pid={sup.pid} processes={total} databases={databases}")
    return sup.run()
