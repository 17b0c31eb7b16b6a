"""The lab's scratch models. Their tables are created and dropped by the lab itself.

``managed = False`` and no migrations: ``migrate`` never creates these tables and
``makemigrations`` never writes a migration for them (the app keeps them out of its
model listing, see :class:`~django_taskclaim.contrib.racelab.apps.RaceLabConfig`).
:class:`~django_taskclaim.contrib.racelab.lab.RaceLab` creates them with the schema
editor when a run starts and drops them when it ends.
"""

from __future__ import annotations

from django.apps import apps
from django.core.exceptions import ImproperlyConfigured
from django.db import models

from django_taskclaim.mixins import ClaimableModel, claim_indexes

from .apps import LABEL, RaceLabConfig

if not apps.is_installed(RaceLabConfig.name):
    # Without the app these models would be registered by whoever imports them.
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
        app_label = LABEL
        db_table = "taskclaim_racelab_task"
        managed = False
        indexes = claim_indexes("tcrl_task", order=("created_at", "id"))


class LabInsertLock(models.Model):
    """Insert-as-lock: the task id is the primary key; the INSERT that wins holds it."""

    task_id = models.BigIntegerField(primary_key=True)
    owner = models.CharField(max_length=255)

    class Meta:
        app_label = LABEL
        db_table = "taskclaim_racelab_insertlock"
        managed = False

    def __str__(self) -> str:
        return f"lock {self.task_id}"


class LabLease(models.Model):
    """Lease-lock table: one row per key, reusable once ``locked_until`` has passed."""

    key = models.CharField(max_length=100, unique=True)
    owner = models.CharField(max_length=255)
    locked_until = models.DateTimeField()

    class Meta:
        app_label = LABEL
        db_table = "taskclaim_racelab_lease"
        managed = False

    def __str__(self) -> str:
        return self.key


class LabBatchLock(models.Model):
    """The broken lock table of the articles: one row holding the ids a consumer took."""

    owner = models.CharField(max_length=255)
    ids = models.TextField()

    class Meta:
        app_label = LABEL
        db_table = "taskclaim_racelab_batchlock"
        managed = False

    def __str__(self) -> str:
        return f"{self.owner}: {self.ids}"


#: Every scratch model, in the order the lab creates their tables.
SCRATCH_MODELS: tuple[type[models.Model], ...] = (LabTask, LabInsertLock, LabLease, LabBatchLock)
