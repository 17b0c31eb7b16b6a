"""The in-flight ledger: every row one worker process holds, and where it is in its life.

    claimed ──take()──▶ running ──settled()──▶ (deferred ack) ──take_acks()──▶ written
       │                   │
       └─ lost / released  └─ lost (its later writes are fenced out anyway)

It is the only state the worker's threads share and the only owner of its lock: the
claimer adds rows, executors take and settle them, the heartbeat reads what is held and
marks what was lost, the main thread releases what was not started. No method does I/O
while holding the lock.

Each kind of waiter has its own condition on that one lock, and a change wakes only the
waiters it can concern (:meth:`Ledger._wake`): the claimer once there is room for a
claim, executors once rows are queued, the rarer waiters (idle, alone, written,
settled) only while one waits. Waking a thread is a system call and a hand-over of the
interpreter lock; per job the claimer used to be woken three times to find no room.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from django_taskclaim.row.claimable import Claimable
from django_taskclaim.worker.history import History


class Ledger:
    """Rows held by one process: ``claimed`` (waiting for an executor), ``running`` (one
    per executor thread) and ``acks`` (run, completion not written yet).

    ``capacity`` bounds claimed + running: the claimer never holds more rows than the
    executors can start soon (``--concurrency`` × ``--batch``). Which row runs alone (a
    recovered row near its last attempt) the claimer decides, once, and says so to
    :meth:`add_claimed`; how many rows it may claim at all (``--max-tasks``) is its own
    count (:class:`~.claimer.Budget`)."""

    def __init__(
        self,
        *,
        capacity: int,
        claim_size: int,
    ) -> None:
        self.capacity = capacity
        self.claim_size = claim_size
        self._lock = threading.Lock()
        # One lock, three kinds of waiters (see _wake): the claimer (room), executors
        # (rows to take), and everything else (idle, alone, written, settled).
        self._room_ready = threading.Condition(self._lock)
        self._rows_ready = threading.Condition(self._lock)
        self._changed = threading.Condition(self._lock)
        self._room_waiting = 0
        self._rows_waiting = 0
        self._watching = 0
        self._claimed: deque[Any] = deque()
        self._running: dict[str, Any] = {}
        self._finishing: set[str] = set()  # threads whose body returned, outcome not written
        self._acks: list[Any] = []
        self._writing: dict[int, Any] = {}  # acks taken by a writer, not written yet
        self._acks_since: float | None = None
        self._lost: set[tuple[type, Any, int]] = set()
        self._alone: set[int] = set()  # id() of the claimed or running rows that run alone
        # threads whose recovered row's body returned, outcome not written yet
        self._recovered_finishing: set[str] = set()
        self._closed = False
        self._stopped = False
        self.processed = 0
        #: Finished attempts per minute, for the admin's charts (written by the heartbeat).
        self.history = History()

    # -- the claimer's side ---------------------------------------------------------
    def room(self) -> int:
        """Rows the claimer may claim now (0 = wait). A full claim is made as soon as it
        fits; a smaller one only when no claimed row is waiting (an executor is, or is
        about to be, idle), so claims stay large when the executors are busy."""
        with self._lock:
            return self._room()

    def _room(self) -> int:
        if self._closed or len(self._alone) > len(self._recovered_finishing):
            return 0  # a recovered row runs alone: nothing more is claimed meanwhile
        # A row whose body has returned frees its slot: the next one is claimed while its
        # outcome is written, so a short task's executor does not wait for a claim.
        room = self.capacity - len(self._claimed) - len(self._running) + len(self._finishing)
        if room >= self.claim_size:
            return self.claim_size
        return room if room > 0 and not self._claimed else 0

    def wait_for_room(self, timeout: float) -> int:
        """Block until :meth:`room` is positive (or ``timeout``); return it."""
        with self._lock:
            if not self._room():
                self._room_waiting += 1
                try:
                    self._room_ready.wait(timeout)
                finally:
                    self._room_waiting -= 1
            return self._room()

    def _wake(self, *, rows: int = 0, claimer: bool = False) -> None:
        """After a change (the lock held): wake the waiters it can concern. The claimer
        if there is room for a claim now (or ``claimer``: it must look, as after a
        close); up to ``rows`` executors (-1: all of them) if rows were queued or may
        now be taken; the other waiters, if any, always."""
        if self._room_waiting and (claimer or self._room()):
            self._room_ready.notify()
        if rows and self._rows_waiting:
            if rows < 0:
                self._rows_ready.notify_all()
            else:
                self._rows_ready.notify(rows)
        if self._watching:
            self._changed.notify_all()

    def add_claimed(self, rows: list[Any], *, alone: Any = None) -> bool:
        """Queue freshly claimed rows for the executors, in claim order; ``alone``, one
        of them, runs alone (:meth:`wait_alone`): nothing more is claimed while its body
        may run. Returns False, queuing nothing, once the ledger is stopped: the caller
        releases them."""
        with self._lock:
            if self._stopped:
                return False
            self._claimed.extend(rows)
            if alone is not None:
                self._alone.add(id(alone))
            self._wake(rows=len(rows))
            return True

    def runs_alone(self, task: Any) -> bool:
        """Whether held ``task`` was queued to run alone (see :meth:`add_claimed`)."""
        return bool(self._alone) and id(task) in self._alone  # no lock: one set lookup

    def holds_recovered(self) -> bool:
        """Whether a recovered row is claimed or running its body here (one whose body
        has returned does not count: the next may be claimed while its outcome is
        written, and starts once that is written: see :meth:`take`)."""
        with self._lock:
            return len(self._alone) > len(self._recovered_finishing)

    def in_flight(self) -> int:
        """Rows claimed or running in this process."""
        with self._lock:
            return len(self._claimed) + len(self._running)

    def unwritten(self) -> int:
        """Completions buffered or being written in this process: writes still to come,
        each of which may release rows that wait for it (``after=``)."""
        with self._lock:
            return len(self._acks) + len(self._writing)

    def wait_written(self, timeout: float) -> bool:
        """Block until no completion taken by a writer is still being written (or
        ``timeout``); return whether so. A recovered row starts only once the rows run
        before it are written: see :meth:`wait_alone`."""
        return self._wait_while(lambda: bool(self._writing), timeout)

    def wait_until_idle(self, timeout: float) -> bool:
        """Block until nothing is claimed or running (or ``timeout``); return whether so."""
        return self._wait_while(lambda: bool(self._claimed or self._running), timeout)

    def _wait_while(
        self, busy: Callable[[], bool], timeout: float, then: Callable[[], bool] | None = None
    ) -> bool:
        """Wait while ``busy()`` (the lock held), up to ``timeout``; False if it still is,
        else True, or what ``then()`` says with the lock still held."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while busy():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._watch(left)
            return True if then is None else then()

    def _watch(self, timeout: float) -> None:
        """Wait (the lock held) for any change, or ``timeout``."""
        self._watching += 1
        try:
            self._changed.wait(timeout)
        finally:
            self._watching -= 1

    def close(self) -> None:
        """No more rows will be added: executors end once the claimed ones are taken."""
        with self._lock:
            self._closed = True
            self._wake(rows=-1, claimer=True)

    def stop(self) -> None:
        """Start nothing more: :meth:`take` returns ``None`` from now on (graceful stop;
        the unstarted rows are then released by the caller)."""
        with self._lock:
            self._stopped = self._closed = True
            self._wake(rows=-1, claimer=True)

    @property
    def closed(self) -> bool:
        return self._closed

    # -- the executors' side ----------------------------------------------------------
    def take(self, me: str, timeout: float) -> Any:
        """The next claimed row, now running in thread ``me``; ``None`` after ``timeout``
        or once the ledger is closed and empty, or stopped (see :attr:`closed`).

        Nothing starts while a recovered row's outcome is being written (its body has
        returned): if the next row killed the process, that outcome would be lost and
        the recovered row charged again for another row's crash."""

        deadline = time.monotonic() + timeout
        with self._lock:
            while self._blocked():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._rows_waiting += 1
                try:
                    self._rows_ready.wait(left)
                finally:
                    self._rows_waiting -= 1
            if not self._claimed or self._stopped or self._recovered_finishing:
                return None
            task = self._claimed.popleft()
            self._running[me] = task
            self._wake()  # the last queued row taken: room for a claim
            return task

    def _blocked(self) -> bool:
        """Whether :meth:`take` must wait (the lock held)."""
        if self._stopped:
            return False
        if not self._claimed:
            return not self._closed
        return bool(self._recovered_finishing)

    def wait_alone(self, me: str, timeout: float) -> bool:
        """Block until thread ``me``'s row is the only one running (or ``timeout``, or a
        stop); return whether it is. A recovered row may be the one that killed a
        worker: it starts only once the rows running beside it have settled."""
        return self._wait_while(
            lambda: len(self._running) > 1 and not self._stopped,
            timeout,
            then=lambda: len(self._running) == 1,
        )

    def finishing(self, me: str) -> None:
        """Thread ``me``'s body has returned; its outcome is being written. The row stays
        held (leases kept, counted in flight) until :meth:`settled`, but no longer takes
        a slot: the claimer may claim the executor's next row meanwhile."""
        with self._lock:
            if me in self._running:
                self._finishing.add(me)
                if id(self._running[me]) in self._alone:
                    self._recovered_finishing.add(me)
                self._wake()

    def settled(self, me: str) -> None:
        """Thread ``me`` finished its running row (whatever the outcome)."""
        with self._lock:
            self._finishing.discard(me)
            unblocked = me in self._recovered_finishing
            self._recovered_finishing.discard(me)
            task = self._running.pop(me, None)
            if task is not None:
                self.processed += 1
                self._forget(task)
            # Rows wait behind a recovered row's outcome (see take): all may go now.
            self._wake(rows=-1 if unblocked and not self._recovered_finishing else 0)

    def _forget(self, task: Claimable) -> None:
        if self._alone:
            self._alone.discard(id(task))

    def defer_ack(self, task: Claimable) -> bool:
        """Buffer a completion to be written with others; return True if it is the
        first of a new buffer (the heartbeat then has a new deadline)."""
        with self._lock:
            first = not self._acks
            if first:
                self._acks_since = time.monotonic()
            self._acks.append(task)
            return first

    def take_acks(self, *, window: float | None = None, size: int = 0) -> list[Any]:
        """Remove and return the buffered completions; with ``window``, only if the
        oldest waited that long or ``size`` of them are buffered (else ``[]``)."""
        if not self._acks:  # nothing buffered: no lock (an executor asks after each task)
            return []
        since = self._acks_since
        if (  # not due yet (read without the lock: a stale answer only waits for the writer)
            window is not None
            and since is not None
            and time.monotonic() - since < window
            and (not size or len(self._acks) < size)
        ):
            return []
        with self._lock:
            if not self._acks:
                return []
            if window is not None and self._acks_since is not None:
                young = time.monotonic() - self._acks_since < window
                if young and (not size or len(self._acks) < size):
                    return []
            acks, self._acks, self._acks_since = self._acks, [], None
            self._writing.update((id(t), t) for t in acks)
            return acks

    def acks_written(self, tasks: list[Any]) -> None:
        """The writer of ``tasks`` (from :meth:`take_acks`) is done with them, written or
        not: their leases need no keeping any more."""
        with self._lock:
            for task in tasks:
                self._writing.pop(id(task), None)
            if self._watching:  # a recovered row may be waiting: wait_written()
                self._changed.notify_all()

    def acks_due_at(self, window: float) -> float | None:
        """When the oldest buffered completion's window ends (monotonic), or None."""
        with self._lock:
            return None if self._acks_since is None else self._acks_since + window

    # -- heartbeat, shutdown ----------------------------------------------------------
    def held(self, *, skip_running: Any = None) -> list[Any]:
        """Every row whose lease this process must keep: claimed, running (but not those
        ``skip_running(task)`` excludes) and run-but-unacknowledged (buffered, or being
        written: a completion waiting on a row lock keeps its lease until it lands)."""
        with self._lock:
            running = [t for t in self._running.values() if not (skip_running and skip_running(t))]
            return [*self._claimed, *running, *self._acks, *self._writing.values()]

    def startable(self) -> list[Any]:
        """The rows claimed or running here whose body has not returned: those a lapsing
        lease must stop (by their cancellation flag) before another worker may start them."""
        with self._lock:
            running = [t for me, t in self._running.items() if me not in self._finishing]
            return [*self._claimed, *running]

    def mark_lost(self, task: Claimable, version: int) -> str | None:
        """Record that ``task`` (at token ``version``) was taken back. Returns
        ``"claimed"`` if it had not started (it is dropped: never started), ``"running"``
        if it is running or unacknowledged, ``None`` if it has moved on since or if its
        outcome is being written by this process right now.

        A row whose outcome write is in flight (its body returned and its thread writes
        it, or a writer took its buffered completion) may look taken back to a renewal
        only because that very write landed and the instance is not updated yet: that
        write is fenced and says itself whether the claim was lost, so nothing is
        recorded here."""
        with self._lock:
            if task.version != version:
                return None  # settled since the heartbeat's snapshot
            if id(task) in self._writing or any(
                self._running.get(me) is task for me in self._finishing
            ):
                return None  # its own outcome write is landing: that write tells
            self._lost.add((type(task), task.pk, version))
            for i, t in enumerate(self._claimed):
                if t is task:
                    del self._claimed[i]
                    self._forget(task)
                    self._wake()
                    return "claimed"
            return "running"

    def is_lost(self, task: Claimable) -> bool:
        """Whether the heartbeat found the claim ``task`` holds taken back."""
        if not self._lost:  # the usual case, without the lock: the set only grows
            return False
        with self._lock:
            return (type(task), task.pk, task.version) in self._lost

    def take_unstarted(self) -> list[Any]:
        """Remove and return every claimed row not started yet (to release them)."""
        with self._lock:
            tasks = list(self._claimed)
            self._claimed.clear()
            for task in tasks:
                self._forget(task)
            self._wake()
            return tasks

    def wait_settled(self, tasks: list[Any], timeout: float) -> bool:
        """Block until none of ``tasks`` is running (or ``timeout``); return whether so."""
        ids = {id(t) for t in tasks}
        return self._wait_while(lambda: any(id(t) in ids for t in self._running.values()), timeout)

    def running(self) -> list[Any]:
        with self._lock:
            return list(self._running.values())

    def counts(self) -> tuple[int, int]:
        """(rows in flight, rows processed so far), for the registry."""
        with self._lock:
            return len(self._claimed) + len(self._running), self.processed
