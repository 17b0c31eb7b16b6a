"""Concrete models on the mixins, used by the test-suite."""

from __future__ import annotations

import os
import signal
import uuid

from django.core.serializers.json import DjangoJSONEncoder
from django.db import models

from django_taskclaim.db import DbNow
from django_taskclaim.exceptions import Fail, Retry
from django_taskclaim.models import (
    ClaimableMixin,
    ClaimableModel,
    ClaimFieldsMixin,
    ErrorFieldMixin,
    claim_indexes,
)
from django_taskclaim.row.status import Status


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
            from tests.support.helpers import simulate_work

            simulate_work(p["sleep"])
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
    create_time = models.DateTimeField(db_default=DbNow())
    update_time = models.DateTimeField(db_default=DbNow())

    class ClaimMeta:
        statuses = {"ready": 1, "processing": 2, "done": 0, "failed": 3}
        ordering = ("create_time", "pk")
        lease = 30
        handler = "tests.support.testapp.handlers.run_job"

    class Meta:
        db_table = "job"
        indexes = claim_indexes("job", ready=1, processing=2, order=("create_time", "id"))


class Ledger(models.Model):
    """Side effects written inside ``fenced()``: exactly one row per completed task."""

    task_id = models.BigIntegerField()
    token = models.BigIntegerField()
    worker = models.CharField(max_length=255, blank=True, default="")
    at = models.DateTimeField(db_default=DbNow())


class NaiveLock(models.Model):
    """A broken lock table: one row holding the ids a consumer took."""

    owner = models.CharField(max_length=100)
    ids = models.JSONField(default=list)


class UUIDTask(ClaimableModel):
    """A task table keyed by a UUID (stored as ``char(32)`` on SQLite, natively elsewhere)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4)
    note = models.CharField(max_length=100, blank=True, default="")

    def process(self) -> dict:
        return {"note": "processed"}


class CharKeyTask(ClaimableModel):
    """A task table keyed by free text; the key column's name is a reserved word in SQL."""

    key = models.CharField(primary_key=True, max_length=100)
    note = models.CharField(max_length=100, blank=True, default="")

    def process(self) -> dict:
        return {"note": "processed"}


class ColumnTask(ClaimableMixin, models.Model):
    """Every claim column renamed with ``db_column``: SQL must name columns, not fields."""

    id = models.BigAutoField(primary_key=True, db_column="row_id")
    status = models.CharField(
        max_length=16,
        choices=Status.choices,
        default=Status.READY,
        db_default=Status.READY.value,
        db_column="st",
    )
    version = models.PositiveBigIntegerField(
        default=0, db_default=0, editable=False, db_column="tok"
    )
    locked_until = models.DateTimeField(
        null=True, blank=True, editable=False, db_column="lease_end"
    )
    locked_by = models.CharField(
        max_length=255, blank=True, default="", db_default="", editable=False, db_column="holder"
    )
    attempts = models.PositiveIntegerField(
        default=0, db_default=0, editable=False, db_column="tries"
    )
    run_after = models.DateTimeField(null=True, blank=True, db_column="not_before")
    priority = models.SmallIntegerField(default=0, db_default=0, db_column="prio")
    created_at = models.DateTimeField(db_default=DbNow(), editable=False, db_column="enqueued")
    claimed_at = models.DateTimeField(null=True, blank=True, editable=False, db_column="claimed")
    finished_at = models.DateTimeField(null=True, blank=True, editable=False, db_column="ended")
    last_error = models.TextField(blank=True, default="", db_default="", db_column="err")
    note = models.CharField(max_length=100, blank=True, default="", db_column="remark")

    class Meta:
        indexes = claim_indexes("coltask")

    def process(self) -> dict:
        return {"note": "processed"}


class NullableOrderTask(ClaimableModel):
    """Claimed in ``due`` order, where ``due`` may be NULL."""

    due = models.DateTimeField(null=True, blank=True)

    class ClaimMeta:
        ordering = ("due", "pk")

    def process(self) -> None:
        return None


class ResultTypes(ClaimableModel):
    """Result fields of many types, written by batched completions."""

    data = models.JSONField(null=True, blank=True)
    encoded = models.JSONField(null=True, blank=True, encoder=DjangoJSONEncoder)
    text = models.TextField(blank=True, default="")
    number = models.BigIntegerField(null=True, blank=True)
    ratio = models.FloatField(null=True, blank=True)
    flag = models.BooleanField(null=True, blank=True)
    at = models.DateTimeField(null=True, blank=True)
    day = models.DateField(null=True, blank=True)
    ref = models.UUIDField(null=True, blank=True)
    amount = models.DecimalField(max_digits=12, decimal_places=4, null=True, blank=True)
    took = models.DurationField(null=True, blank=True)
    blob = models.BinaryField(null=True, blank=True)

    class Meta:
        indexes = claim_indexes("restypes")

    def process(self) -> None:
        return None


class Step(ClaimableModel):
    """A row of a dependency chain (tests/workflows/): rows may wait for it, and its
    settles release them. ``payload`` as :class:`Document`'s: {"fail": msg}."""

    name = models.CharField(max_length=100, blank=True, default="")
    payload = models.JSONField(default=dict, blank=True)

    class ClaimMeta:
        dependents = True
        lease = 30

    def process(self) -> None:
        if "fail" in (self.payload or {}):
            raise Fail(self.payload["fail"])


class OddStep(ClaimableModel):
    """A :class:`Step` with a text primary key."""

    key = models.CharField(primary_key=True, max_length=100)

    class ClaimMeta:
        dependents = True

    def process(self) -> None:
        return None
