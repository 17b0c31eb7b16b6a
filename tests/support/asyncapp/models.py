"""Models for the asyncapp tests: a claimable model whose body is ``async def``."""

from __future__ import annotations

import asyncio
import threading

from django.db import models

from django_taskclaim.db import DbNow
from django_taskclaim.models import ClaimableModel

BASE_EXCEPTIONS = {"SystemExit": SystemExit, "KeyboardInterrupt": KeyboardInterrupt}


class AsyncDocument(ClaimableModel):
    """A task row with an ``async def process``; ``payload`` says what it does:
    ``{"sleep": s}`` awaits ``asyncio.sleep(s)`` (standing for I/O), ``{"raise": msg}``
    raises on its first attempt (``{"base": "SystemExit"}`` raises that instead),
    ``{"ignore_cancel": s}`` goes on for ``s`` more seconds after a cancellation."""

    payload = models.JSONField(default=dict, blank=True)
    result = models.TextField(blank=True, default="")

    class ClaimMeta:
        lease = 30
        retry_backoff = 0.05
        retry_jitter = 0

    def __str__(self) -> str:
        return f"async document {self.pk}"

    async def mark(self, kind: str) -> None:
        """Record what the body did, when (database clock) and on which thread."""
        await Mark.objects.acreate(
            task_id=self.pk,
            kind=kind,
            attempt=self.attempts,
            thread=threading.current_thread().name,
            holder=self.locked_by,
        )

    async def process(self) -> dict:
        p = self.payload or {}
        await self.mark("start")
        try:
            if p.get("sleep"):
                await asyncio.sleep(p["sleep"])
        except asyncio.CancelledError:
            await self.mark("cancelled")
            if not p.get("ignore_cancel"):
                raise
            await asyncio.sleep(p["ignore_cancel"])
        if self.attempts == 1 and p.get("raise"):
            raise RuntimeError(p["raise"])
        if self.attempts == 1 and p.get("base"):
            raise BASE_EXCEPTIONS[p["base"]]("raised by the async body")
        await self.mark("end")
        return {"result": f"async {self.pk}"}


class Mark(models.Model):
    """One thing an async body did (``start``, ``end``, ``cancelled``), on the database
    clock: the ledger the async tests check their invariants on."""

    task_id = models.BigIntegerField()
    kind = models.CharField(max_length=20)
    attempt = models.IntegerField(default=0)
    thread = models.CharField(max_length=100, blank=True, default="")
    holder = models.CharField(max_length=255, blank=True, default="")
    at = models.DateTimeField(db_default=DbNow())
