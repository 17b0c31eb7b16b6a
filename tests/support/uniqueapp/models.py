"""Models for the unique-enqueue tests."""

from __future__ import annotations

from django.db import models

from django_taskclaim.model.unique import ActiveKeyField
from django_taskclaim.models import (
    ClaimableMixin,
    ClaimableModel,
    ClaimFieldsMixin,
    ErrorFieldMixin,
    claim_indexes,
)


class Export(ClaimableModel):
    """Enqueued at most once per ``dedupe_key`` while ready or processing."""

    dedupe_key = models.CharField(max_length=100, null=True, blank=True)
    payload = models.CharField(max_length=50)
    ref = models.CharField(max_length=50, null=True, blank=True, unique=True)
    active_dedupe_key = ActiveKeyField("dedupe_key")

    class Meta(ClaimableModel.Meta):
        constraints = [
            models.UniqueConstraint(fields=["active_dedupe_key"], name="uniq_export_active_key")
        ]

    def process(self) -> None:
        return None


class LegacySync(ClaimFieldsMixin, ErrorFieldMixin, ClaimableMixin, models.Model):
    """Integer statuses in a column named ``sync_state``, status field ``state``, and an
    integer key: the active key follows the model's ``ClaimMeta``."""

    NEW, RUNNING, OK, BROKEN = 1, 2, 0, 3
    state = models.SmallIntegerField(default=NEW, db_default=NEW, db_column="sync_state")
    account_id = models.IntegerField(null=True, blank=True)
    active_account_id = ActiveKeyField("account_id")

    class ClaimMeta:
        status_field = "state"
        statuses = {"ready": 1, "processing": 2, "done": 0, "failed": 3}
        ordering = ("pk",)

    class Meta:
        indexes = claim_indexes(
            "legsync", status_field="state", ready=1, processing=2, order=("id",)
        )
        constraints = [
            models.UniqueConstraint(fields=["active_account_id"], name="uniq_legsync_account")
        ]

    def process(self) -> None:
        return None


class KeyedStep(ClaimableModel):
    """A row of a workflow with a unique key (tests/workflows/test_unique_dependents.py):
    it may wait for other rows (``after=``), rows may wait for it, and while ``ready`` or
    ``processing`` it holds ``dedupe_key``."""

    name = models.CharField(max_length=100, blank=True, default="")
    dedupe_key = models.CharField(max_length=100, null=True, blank=True)
    active_dedupe_key = ActiveKeyField("dedupe_key")

    class ClaimMeta:
        dependents = True
        lease = 30

    class Meta(ClaimableModel.Meta):
        constraints = [
            models.UniqueConstraint(fields=["active_dedupe_key"], name="uniq_keyedstep_active_key")
        ]

    def process(self) -> None:
        return None


class KeyedTally(ClaimFieldsMixin, ErrorFieldMixin, ClaimableMixin, models.Model):
    """A keyed row that may wait for others but maps no ``cancelled`` state (its status
    field is ``state``): skipped as a duplicate, it ends ``failed``."""

    state = models.CharField(max_length=16, default="ready")
    dedupe_key = models.CharField(max_length=100, null=True, blank=True)
    active_dedupe_key = ActiveKeyField("dedupe_key")

    class ClaimMeta:
        status_field = "state"
        statuses = {
            "ready": "ready",
            "processing": "processing",
            "done": "done",
            "failed": "failed",
            "waiting": "waiting",
        }
        ordering = ("pk",)

    class Meta:
        indexes = claim_indexes("keytally", status_field="state", order=("id",))
        constraints = [
            models.UniqueConstraint(fields=["active_dedupe_key"], name="uniq_keyedtally_active_key")
        ]

    def process(self) -> None:
        return None
