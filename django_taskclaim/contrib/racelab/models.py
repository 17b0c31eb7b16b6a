"""The lab's models: the rows the claimers fight over and the lock tables of the
techniques raced. Their tables come from the app's migration (``migrate``); the lab
empties them before each technique and after its run, and writes nothing else.
"""

from __future__ import annotations

from django.apps import apps
from django.core.exceptions import ImproperlyConfigured
from django.db import models

from django_taskclaim.contrib.racelab.apps import RaceLabConfig
from django_taskclaim.model.indexes import claim_indexes
from django_taskclaim.model.mixins import ClaimableModel

if not apps.is_installed(RaceLabConfig.name):
    # Django would file these models under the enclosing installed app (``taskclaim``,
    # whose package contains this one) instead of refusing them: refuse them here.
    raise ImproperlyConfigured(
        f"the race lab needs {RaceLabConfig.name!r} in INSTALLED_APPS (see docs/racelab.md)"
    )


class LabTask(ClaimableModel):
    """The rows the claimers fight over."""

    class ClaimMeta:
        lease = 300
        ordering = ("created_at", "pk")
        max_attempts = 1000

    class Meta:
        db_table = "taskclaim_racelab_task"
        indexes = claim_indexes("tcrl_task", order=("created_at", "id"))


class LabInsertLock(models.Model):
    """Insert-as-lock: the task id is the primary key; the INSERT that wins holds it."""

    task_id = models.BigIntegerField(primary_key=True)
    owner = models.CharField(max_length=255)

    class Meta:
        db_table = "taskclaim_racelab_insertlock"

    def __str__(self) -> str:
        return f"lock {self.task_id}"


class LabLease(models.Model):
    """Lease-lock table: one row per key, reusable once ``locked_until`` has passed."""

    key = models.CharField(max_length=100, unique=True)
    owner = models.CharField(max_length=255)
    locked_until = models.DateTimeField()

    class Meta:
        db_table = "taskclaim_racelab_lease"

    def __str__(self) -> str:
        return self.key


class LabBatchLock(models.Model):
    """The broken lock table of the articles: one row holding the ids a consumer took."""

    owner = models.CharField(max_length=255)
    ids = models.TextField()

    class Meta:
        db_table = "taskclaim_racelab_batchlock"

    def __str__(self) -> str:
        return f"{self.owner}: {self.ids}"


#: Every lab model, in the order the lab empties their tables.
LAB_MODELS: tuple[type[models.Model], ...] = (LabTask, LabInsertLock, LabLease, LabBatchLock)
