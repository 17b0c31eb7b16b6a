"""Concrete models on the mixins, used by the test-suite."""

from __future__ import annotations

import os
import signal
import time

from django.db import models
from django.db.models.functions import Now

from django_taskclaim.exceptions import Fail, Retry
from django_taskclaim.models import (
    ClaimableMixin,
    ClaimableModel,
    ClaimFieldsMixin,
    ErrorFieldMixin,
    claim_indexes,
)


class Document(ClaimableModel):
    """A task row; ``payload`` drives what ``process()`` does (for worker tests)."""

    title = models.CharField(max_length=200, blank=True, default="")
    kind = models.CharField(max_length=20, blank=True, default="")
    payload = models.JSONField(default=dict, blank=True)
    result = models.TextField(blank=True, default="")

    class ClaimMeta:
        lease = 30

    def __str__(self) -> str:
        return self.title or f"document {self.pk}"

    def process(self) -> dict | None:
        """Test behaviours: {"sleep": s, "raise": msg, "fail": msg, "retry": delay,
        "kill": true, "ledger": true}."""
        p = self.payload or {}
        if p.get("kill"):
            os.kill(os.getpid(), signal.SIGKILL)
        if p.get("sleep"):
            deadline = time.monotonic() + float(p["sleep"])
            while time.monotonic() < deadline:
                time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
        if p.get("ledger"):
            # The effect and the completion commit together, or not at all.
            with self.fenced():
                Ledger.objects.create(task_id=self.pk, token=self.version, worker=self.locked_by)
                self.complete(result=f"processed {self.pk}")
            return None
        if "raise" in p:
            raise RuntimeError(p["raise"])
        if "fail" in p:
            raise Fail(p["fail"])
        if "retry" in p:
            raise Retry(delay=p["retry"])
        return {"result": f"processed {self.pk}"}


class Job(ClaimFieldsMixin, ErrorFieldMixin, ClaimableMixin, models.Model):
    """A legacy MySQL job table: integer statuses NEW=1, PENDING=2, SUCCESS=0, FAILED=3."""

    NEW, PENDING, SUCCESS, FAILED = 1, 2, 0, 3
    name = models.CharField(max_length=100, blank=True, default="")
    status = models.SmallIntegerField(default=NEW, db_default=NEW)
    create_time = models.DateTimeField(db_default=Now())
    update_time = models.DateTimeField(db_default=Now())

    class ClaimMeta:
        statuses = {"ready": 1, "processing": 2, "done": 0, "failed": 3}
        ordering = ("create_time", "pk")
        lease = 30
        handler = "tests.testapp.handlers.run_job"

    class Meta:
        db_table = "job"
        indexes = claim_indexes("job", ready=1, processing=2, order=("create_time", "id"))


class Ledger(models.Model):
    """Side effects written inside ``fenced()``: exactly one row per completed task."""

    task_id = models.BigIntegerField()
    token = models.BigIntegerField()
    worker = models.CharField(max_length=255, blank=True, default="")
    at = models.DateTimeField(db_default=Now())


class NaiveLock(models.Model):
    """A broken lock table: one row holding the ids a consumer took."""

    owner = models.CharField(max_length=100)
    ids = models.JSONField(default=list)
