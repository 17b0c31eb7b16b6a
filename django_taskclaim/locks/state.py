"""The locks' state, typed and frozen: what a :class:`~.lease.LeaseLock` knows of its
lease (:class:`LeaseState`), and what an :func:`~.advisory.advisory` block needs at its
exit (:class:`Entered`, kept on a per-thread :class:`EntryStack`)."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from django.db import transaction


@dataclass(frozen=True, slots=True)
class LeaseState:
    """What a :class:`~.lease.LeaseLock` knows of its lease. Replaced whole on every change, so
    one read (from the holder's thread or its renewer's) sees one consistent state."""

    #: Fencing token of the held lease; ``None`` when not held.
    token: int | None = None
    #: Monotonic time the holder stops trusting the lease (meaningful while ``token`` is set).
    deadline: float = 0.0
    #: Found taken over or broken, or marked lost when its deadline passed.
    lost: bool = False

    def held(self, now: float) -> bool:
        """Taken, not found lost, and ``now`` (monotonic) before the local deadline."""
        return self.token is not None and not self.lost and now < self.deadline

    def over(self, now: float) -> bool:
        """Found lost, or taken and ``now`` (monotonic) at or past the local deadline."""
        return self.lost or (self.token is not None and now >= self.deadline)


@dataclass(frozen=True, slots=True)
class Entered:
    """One entry into an :class:`~.advisory.AdvisoryLock` block, as its exit needs it.

    Made once the lock was asked for and pushed on the entering thread's stack (unless
    the enter raised); the matching exit pops it. ``raw`` is the DB-API connection the lock
    was taken on, so a session lock whose connection was closed or replaced meanwhile is
    reported lost instead of "released" on another connection.
    """

    #: The vendor's lock id (``(int64,)``, ``(int32, int32)`` or a ``GET_LOCK`` name).
    lock_id: tuple[Any, ...]
    #: Released by the exit (session scope, or a MySQL / MariaDB named lock, which is
    #: released after the block's own transaction ends), not by a transaction's end.
    session: bool
    #: The transaction opened for the block (transaction scope), ``None`` if none was.
    atomic: transaction.Atomic | None
    acquired: bool
    raw: Any = None

    def end_transaction(self, exc: BaseException | None = None) -> None:
        """End the block's own transaction, if it opened one: commit, or roll back when
        ``exc`` is given."""
        if self.atomic is not None:
            tb = exc.__traceback__ if exc is not None else None
            self.atomic.__exit__(type(exc) if exc is not None else None, exc, tb)


class EntryStack(threading.local):
    """Per-thread stack of :class:`Entered` (one lock object may be nested, and one
    module-level object used by many threads at once)."""

    def __init__(self) -> None:
        self.stack: list[Entered] = []
