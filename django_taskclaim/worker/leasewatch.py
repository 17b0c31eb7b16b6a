"""What a ``--processes`` child tells its supervisor about its leases, so that a process
whose heartbeat falls silent is killed before any of its leases can lapse.

A body that stalls its whole process (a C call that holds the GIL, ``SIGSTOP``) stops the
heartbeat of that process too: its leases would lapse, another worker's reaper would take
its rows back and a second body could start while the first still runs. The supervisor
is a process no child's GIL can stop, so it keeps the promise (ONE BODY AT A TIME):

- the child keeps, for each row that can still run a body here (claimed, or running and
  not returned; rows lost to someone else and ``ClaimMeta.atomic`` bodies, which hold
  their row lock, apart), the monotonic time by which its lease surely still runs: the
  time taken *before* the statement that set it (the claim, a renewal) plus the lease.
  The database sets ``locked_until`` to its own ``now()`` plus the lease, and its
  ``now()`` is no earlier than the statement, so the lease cannot end before that time;
- it reports the earliest of those, less :func:`kill_margin`, on the supervisor's pipe
  (one JSON line ``{"op": "lease", "kill_at": …}``, ``null`` when nothing is held) each
  time it changes: before a claim that could lower it, after a claim that found
  nothing, after every heartbeat loop. ``CLOCK_MONOTONIC`` is one clock for every
  process of a host, so the supervisor compares it with its own;
- the supervisor kills (``SIGKILL``) a child whose ``kill_at`` has passed and, once
  ``waitpid`` has seen it die, gives its rows back (:mod:`.supervisor`).

A healthy child renews every heartbeat interval (at most half the lease), so it is
never near its ``kill_at``. A child whose renewals cannot run (database unreachable, a
row locked by another session) has already told its bodies to stop one interval before
the lease can lapse (:mod:`.maintenance.heartbeat`); a body still running at ``kill_at``
is stopped with its process. The cost: at most two small pipe writes per claim and one
per heartbeat, and only under ``--processes``.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import threading
from typing import Any

from django_taskclaim.config.options import get_options
from django_taskclaim.worker.ledger import Ledger

logger = logging.getLogger("django_taskclaim.worker")

#: The attribute of a held instance: the monotonic time its lease surely still runs until.
LEASE_ATTR = "_taskclaim_lease_until"

#: Most seconds before a lease can lapse that the supervisor kills a silent child.
KILL_MARGIN = 2.0


def kill_margin(lease: float) -> float:
    """Seconds before a ``lease``-second lease can lapse that a silent child is killed: a
    quarter of the lease, at most :data:`KILL_MARGIN` (time for the supervisor to wake,
    send ``SIGKILL`` and see the process gone). A healthy child renews at least every
    half lease, so it is always more than a quarter of a lease away from it."""
    return min(KILL_MARGIN, lease / 4)


def lease_until(task: Any, sent: float, lease: float) -> None:
    """Record on ``task`` that its lease, set by a statement sent at monotonic ``sent``,
    runs at least until ``sent + lease`` (its kill time is that less the margin)."""
    task.__dict__[LEASE_ATTR] = sent + lease - kill_margin(lease)


class LeaseReport:
    """The earliest kill time of the rows a child may still run, kept on the
    supervisor's pipe ``fd`` (see the module docstring); thread-safe."""

    def __init__(self, fd: int, ledger: Ledger, *, worker_id: str) -> None:
        self.fd = fd
        self.ledger = ledger
        self.worker_id = worker_id
        self._lock = threading.Lock()
        self._claims: dict[int, float] = {}  # claims in flight: their kill times
        self._ids = itertools.count()
        self._sent: float | None = None  # what the supervisor has now (None: nothing)

    def claiming(self, sent: float, lease: float) -> int:
        """A claim with a ``lease``-second lease is about to be sent (monotonic ``sent``,
        taken before it): until :meth:`claimed`, its rows count as held. Returns the
        claim's key."""
        key = next(self._ids)
        at = sent + lease - kill_margin(lease)
        with self._lock:
            self._claims[key] = at
            if self._sent is None or at < self._sent:
                self._send(at)
        return key

    def claimed(self, key: int, *, rows: bool) -> None:
        """The claim ``key`` is over: its ``rows`` (if any) are in the ledger, each with
        that claim's lease time (:func:`lease_until`: nothing to report, the time stands),
        or it returned none or failed (the earliest time is looked for again if it was
        that claim's)."""
        with self._lock:
            at = self._claims.pop(key, None)
            if not rows and at is not None and (self._sent is None or at <= self._sent):
                self._refresh()

    def refresh(self) -> None:
        """Report the earliest kill time again if it changed (after a heartbeat)."""
        with self._lock:
            self._refresh()

    def _refresh(self) -> None:
        times = list(self._claims.values())
        for task in self.ledger.startable():
            at = task.__dict__.get(LEASE_ATTR)
            if at is None or get_options(type(task)).atomic or self.ledger.is_lost(task):
                continue
            times.append(at)
        at = min(times, default=None)
        if at != self._sent:
            self._send(at)

    def _send(self, at: float | None) -> None:
        """One line to the supervisor (the lock held). A write fails only once the
        supervisor is gone (this process then stops on its own: :mod:`.process`)."""
        data = (json.dumps({"op": "lease", "kill_at": at}) + "\n").encode()
        try:
            os.write(self.fd, data)  # one write under PIPE_BUF: never interleaved
        except OSError as exc:
            logger.debug("lease report not sent worker=%s error=%s", self.worker_id, exc)
            return
        self._sent = at
