"""What a supervisor watches besides ``waitpid``: each child's pipe, and the children
to kill before harm is done.

Each child has a pipe to the supervisor, which, instead of blocking in ``wait()``, reads
it and looks at its children every :data:`WATCH_POLL` seconds (sooner when a child's
lease time comes first: :meth:`ChildWatch.pause`).

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
once (:mod:`.childexit` settles what it ran late).
"""

from __future__ import annotations

import json
import logging
import os
import select
import signal
import time
from typing import Any

logger = logging.getLogger("django_taskclaim.supervisor")

#: Seconds between the supervisor's looks at its children's deadline reports and exits,
#: when it watches deadlines (it then cannot block in ``wait()``).
WATCH_POLL = 0.2


class ChildWatch:
    """The report pipes of a supervisor's children, what they said, and whom it killed.

    ``children`` is the supervisor's own table (pid -> (index, started)): a child not in
    it any more is not killed."""

    def __init__(self, children: dict[int, tuple[int, float]]) -> None:
        self.children = children
        self._reports: dict[int, int] = {}  # read end -> child pid
        self._partial: dict[int, bytes] = {}  # read end -> an unfinished line
        self._armed: dict[int, dict[str, dict[str, Any]]] = {}  # pid -> key -> report
        self._killed: dict[int, list[dict[str, Any]]] = {}  # pid -> the bodies it ran late
        self._lease_kill: dict[int, float] = {}  # pid -> when its leases could lapse (less margin)
        self._heard: dict[int, float] = {}  # pid -> when its last lease report came
        self._stalled: dict[int, float] = {}  # pid -> seconds it had been silent when killed

    def in_child(self, read_end: int) -> None:
        """In a freshly forked child: close the read ends, its own and its siblings'."""
        for fd in [read_end, *self._reports]:
            os.close(fd)
        self._reports.clear()

    def started(self, pid: int, read_end: int, write_end: int) -> None:
        """In the supervisor: child ``pid`` was forked; read its pipe from now on."""
        os.close(write_end)
        os.set_blocking(read_end, False)
        self._reports[read_end] = pid
        self._armed[pid] = {}
        self._heard[pid] = time.monotonic()

    def killed_for(self, pid: int) -> list[dict[str, Any]]:
        """The reports of the bodies child ``pid`` was killed for (ran past their deadline
        and grace), ``[]`` if it was not killed by this supervisor."""
        return list(self._killed.get(pid, ()))

    def stalled_for(self, pid: int) -> float | None:
        """Seconds child ``pid`` had not renewed its leases when this watch killed it for
        that (its heartbeat silent: a body holding the GIL, a stopped process), or
        ``None`` if it was not killed for silence."""
        return self._stalled.get(pid)

    def reaped(self, pid: int) -> None:
        """Child ``pid`` exited: read its last reports, close its pipe."""
        for fd in [fd for fd, owner in self._reports.items() if owner == pid]:
            self._read(fd)
            if fd in self._reports:
                os.close(fd)
                del self._reports[fd]
                self._partial.pop(fd, None)
        self._armed.pop(pid, None)
        self._lease_kill.pop(pid, None)
        self._heard.pop(pid, None)

    def replaced(self, pid: int) -> bool:
        """Forget reaped child ``pid``; return whether this watch killed it."""
        self._stalled.pop(pid, None)
        return self._killed.pop(pid, None) is not None

    def pause(self, seconds: float) -> None:
        """Wait ``seconds`` (less if a child's lease time comes first), reading the
        children's reports meanwhile; then kill who must be."""
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
                    self._heard[pid] = time.monotonic()
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

    def _lease(self, pid: int, kill_at: float | None) -> None:
        """Child ``pid`` holds rows whose leases could lapse soon after ``kill_at``
        (monotonic, one clock for every process of the host), or none (``None``)."""
        if kill_at is None or pid in self._killed:
            self._lease_kill.pop(pid, None)
        else:
            self._lease_kill[pid] = float(kill_at)

    def _kill_overdue(self) -> None:
        """Kill each child whose leases could lapse before it renews them (its heartbeat
        is silent: a body holding the GIL, a stopped process), and each child running a
        body past its deadline and grace (SIGKILL: the body ignores its cancellation
        flag); its rows are settled when it is reaped."""
        now = time.monotonic()
        for pid, kill_at in list(self._lease_kill.items()):
            if now < kill_at:
                continue
            del self._lease_kill[pid]
            if pid not in self.children or pid in self._killed:
                continue  # gone, or killed already
            self._killed[pid] = []  # not a deadline: its rows are released as after a crash
            self._stalled[pid] = silent = now - self._heard.get(pid, now)
            logger.warning(
                "worker process silent: its leases were not renewed in time (a body holding "
                "the GIL, a stopped process, or the database away); the worker stalled for "
                "%.1f s, past its lease margin: killing it before they can lapse, so that "
                "no task runs twice at once index=%s pid=%s",
                silent,
                self.children[pid][0],
                pid,
            )
            _kill(pid)
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
            _kill(pid)


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
