"""The demo's case: documents processed by several workers, and a legacy job table.

``Document`` is the one-line path (``ClaimableModel``). ``ParserJob`` is an existing table
whose integer status column (NEW=1, PENDING=2, SUCCESS=0, FAILED=3) is mapped by
configuration instead of migrated.
"""

from __future__ import annotations

import random
import time

from django.db import models

from django_taskclaim.db import DbNow
from django_taskclaim.models import (
    ClaimableMixin,
    ClaimableModel,
    ClaimFieldsMixin,
    ErrorFieldMixin,
    claim_indexes,
)


class DocumentProcessingError(RuntimeError):
    """A (simulated) transient failure: the attempt is retried with backoff."""


def simulate(payload: dict) -> None:
    """Work for ``payload["seconds"]``, then fail with probability ``payload["fail_rate"]``."""
    seconds = float(payload.get("seconds", 0))
    if seconds > 0:
        time.sleep(seconds)
    if random.random() < float(payload.get("fail_rate", 0)):
        raise DocumentProcessingError("OCR engine timed out (simulated failure)")


class Document(ClaimableModel):
    """An uploaded document waiting to be processed (claimed with the default strategy)."""

    title = models.CharField(max_length=200)
    batch = models.CharField(max_length=40, blank=True, default="", db_index=True)
    payload = models.JSONField(default=dict, blank=True)
    pages = models.PositiveIntegerField(default=0)
    summary = models.TextField(blank=True, default="")

    class ClaimMeta:
        lease = 60
        max_attempts = 3
        retry_backoff = 0.5  # short, so the demo shows retries without waiting long
        retry_backoff_max = 5

    class Meta(ClaimableModel.Meta):
        ordering = ["-pk"]

    def __str__(self) -> str:
        return self.title

    def process(self) -> dict:
        """Simulated processing; the returned fields are saved with the fenced completion."""
        simulate(self.payload or {})
        pages = 1 + self.pk % 17
        return {"pages": pages, "summary": f"{self.title}: {pages} page(s) read"}


class ParserJob(ClaimFieldsMixin, ErrorFieldMixin, ClaimableMixin, models.Model):
    """An existing table with its own integer statuses, mapped in ``ClaimMeta.statuses``."""

    NEW, PENDING, SUCCESS, FAILED = 1, 2, 0, 3
    STATUS_CHOICES = [(NEW, "new"), (PENDING, "pending"), (SUCCESS, "success"), (FAILED, "failed")]

    url = models.CharField(max_length=300)
    status = models.SmallIntegerField(choices=STATUS_CHOICES, default=NEW, db_default=NEW)
    create_time = models.DateTimeField(db_default=DbNow())
    update_time = models.DateTimeField(db_default=DbNow())
    payload = models.JSONField(default=dict, blank=True)
    result = models.TextField(blank=True, default="")

    class ClaimMeta:
        statuses = {"ready": 1, "processing": 2, "done": 0, "failed": 3}
        ordering = ("create_time", "pk")
        lease = 60
        max_attempts = 3
        retry_backoff = 0.5
        retry_backoff_max = 5

    class Meta:
        db_table = "parser_job"
        indexes = claim_indexes("parser_job", ready=1, processing=2, order=("create_time", "id"))

    def __str__(self) -> str:
        return self.url

    def process(self) -> dict:
        """Simulated parsing of ``url``."""
        simulate(self.payload or {})
        return {"result": f"parsed {self.url}"}
