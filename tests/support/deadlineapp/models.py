"""Models for the deadline tests (``ClaimMeta.timeout``, a row's ``task_timeout``).

``payload["modes"]`` says what each attempt's body does (attempt ``n`` uses
``modes[n - 1]``, the last one after that):

- ``"quick"``: returns at once;
- ``"honour"``: works until its cancellation flag is set (at most 60 s), then returns a
  result (which a deadline turns into a ``TimeoutError`` failure anyway);
- ``"ignore"``: works ``payload["seconds"]`` seconds whatever its flag says;
- ``"slow"``: works ``payload["seconds"]`` seconds (a row without a deadline);
- ``"stall"``: stalls its whole process ``payload["seconds"]`` seconds in a C call that
  holds the GIL (no other thread of the process runs meanwhile: not the heartbeat),
  then returns.

A row whose ``payload["lockfile"]`` names a file is guarded by it: each body takes an
exclusive ``flock`` on it as it starts and keeps it until it ends (the kernel drops it
when the process dies). A body that finds it held by another body of the row — one
still running, in a process still alive — writes an ``overlap`` trace.

Every body writes ``Trace`` rows on the database clock: ``start``, a ``tick`` every
0.2 s while it works, ``flag`` when it sees its flag, ``end``; each run is one claim
token (``token``).
"""

from __future__ import annotations

import asyncio
import ctypes
import fcntl
import os
import time

from django.db import models

from django_taskclaim.db import DbNow
from django_taskclaim.models import ClaimableModel

TICK = 0.2


class Trace(models.Model):
    """One thing a body did, on the database clock."""

    task = models.CharField(max_length=50)  # "<model>:<pk>"
    token = models.BigIntegerField()
    attempt = models.IntegerField()
    kind = models.CharField(max_length=20)
    holder = models.CharField(max_length=255, blank=True, default="")
    pid = models.IntegerField(default=0)
    at = models.DateTimeField(db_default=DbNow())


def trace(task, kind: str) -> None:
    Trace.objects.create(
        task=f"{type(task).__name__}:{task.pk}",
        token=task.version,
        attempt=task.attempts,
        kind=kind,
        holder=task.locked_by or "",
        pid=os.getpid(),
    )


def stall(seconds: float) -> None:
    """Sleep ``seconds`` in libc's ``sleep()`` called through ``PyDLL``, which keeps the
    GIL: every thread of this process stops until it returns."""
    libc = ctypes.PyDLL(None)
    libc.sleep.argtypes = [ctypes.c_uint]
    libc.sleep.restype = ctypes.c_uint
    left = int(seconds)
    while left:  # a signal cuts sleep() short: sleep the rest
        left = libc.sleep(left)


def guard(task) -> int | None:
    """Take the row's lockfile (``payload["lockfile"]``) for this body; trace
    ``overlap`` if another living body holds it. Returns the descriptor to close."""
    path = (task.payload or {}).get("lockfile")
    if not path:
        return None
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        trace(task, "overlap")
    return fd


def mode_of(task) -> str:
    modes = (task.payload or {}).get("modes") or ["quick"]
    return modes[min(task.attempts, len(modes)) - 1]


class TimedTask(ClaimableModel):
    """A sync body; ``task_timeout`` (seconds) is its own deadline, else 60 s."""

    payload = models.JSONField(default=dict, blank=True)
    task_timeout = models.FloatField(null=True, blank=True)
    result = models.TextField(blank=True, default="")

    class ClaimMeta:
        lease = 30
        timeout = 60
        retry_backoff = 0.05
        retry_jitter = 0

    def process(self, cancel) -> dict:
        fd = guard(self)
        try:
            return self._run(cancel)
        finally:
            if fd is not None:
                os.close(fd)

    def _run(self, cancel) -> dict:
        trace(self, "start")
        mode = mode_of(self)
        seconds = float((self.payload or {}).get("seconds", 60))
        if mode == "stall":
            stall(seconds)
        elif mode in ("ignore", "slow"):
            ends = time.monotonic() + seconds
            seen = False
            while time.monotonic() < ends:
                trace(self, "tick")
                if cancel.is_set() and not seen:
                    seen = True
                    trace(self, "flag")  # seen, and ignored
                time.sleep(TICK)
        elif mode == "honour":
            ends = time.monotonic() + 60
            while not cancel.wait(TICK) and time.monotonic() < ends:
                trace(self, "tick")
            trace(self, "flag")
        trace(self, "end")
        return {"result": f"{mode} {self.pk}"}


class AsyncTimedTask(ClaimableModel):
    """An ``async def`` body; ``"honour"`` awaits until ``CancelledError``."""

    payload = models.JSONField(default=dict, blank=True)
    task_timeout = models.DurationField(null=True, blank=True)
    result = models.TextField(blank=True, default="")

    class ClaimMeta:
        lease = 30
        retry_backoff = 0.05
        retry_jitter = 0

    async def process(self) -> dict:
        from asgiref.sync import sync_to_async

        await sync_to_async(trace)(self, "start")
        mode = mode_of(self)
        if mode == "honour":
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                await sync_to_async(trace)(self, "cancelled")
                raise
        await sync_to_async(trace)(self, "end")
        return {"result": f"{mode} {self.pk}"}
