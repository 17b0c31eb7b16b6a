"""The concrete task model of the ``django.tasks`` backend: one row per enqueued task.

Rows are claimed, leased, retried and recovered like any other claimable model; the
worker runs them through :func:`django_taskclaim.contrib.tasks.runner.execute`.
"""

from __future__ import annotations

import os
import time
import uuid

from django.db import models
from django.tasks import DEFAULT_TASK_BACKEND_ALIAS, DEFAULT_TASK_QUEUE_NAME
from django.utils.translation import gettext_lazy as _

from django_taskclaim.config.settings import taskclaim_settings
from django_taskclaim.model.indexes import claim_indexes
from django_taskclaim.model.mixins import ClaimableModel
from django_taskclaim.model.unique import ActiveKeyField, SparseUniqueConstraint
from django_taskclaim.row.status import Status

#: Highest ``max_attempts`` a task may have. It is also the model-level budget the
#: reaper applies, so that each row's own ``max_attempts`` (checked when the row is
#: next claimed) decides when a task that keeps losing its worker ends failed.
MAX_ATTEMPTS_CEILING = 1000


def default_max_attempts() -> int:
    """``TASKCLAIM_MAX_ATTEMPTS``: the budget of rows inserted without the backend."""
    return int(taskclaim_settings.MAX_ATTEMPTS)


def time_ordered_uuid() -> uuid.UUID:
    """A version-7 UUID (RFC 9562): 48 bits of Unix milliseconds, the version and
    variant bits, then 74 random bits. A task enqueued later gets a larger id, so the
    primary-key index is appended to instead of written at random pages (what a random
    UUID does to every insert); ids stay unguessable and unique across hosts."""
    millis = time.time_ns() // 1_000_000 & (1 << 48) - 1
    rand = int.from_bytes(os.urandom(10), "big")
    rand_a = rand >> 68 & 0xFFF
    rand_b = rand & (1 << 62) - 1
    return uuid.UUID(int=millis << 80 | 0x7 << 76 | rand_a << 64 | 0b10 << 62 | rand_b)


#: Longest queue name and backend alias that fit their columns.
NAME_MAX_LENGTH = 64
#: Longest key of :func:`django_taskclaim.contrib.tasks.enqueue_unique`.
UNIQUE_KEY_MAX_LENGTH = 255


class QueuedTask(ClaimableModel):
    """One enqueued ``django.tasks`` Task and its result.

    Adds to :class:`~django_taskclaim.model.mixins.ClaimableModel`: ``id`` (UUID, the
    ``TaskResult.id``), ``task_path``, ``args``, ``kwargs``, ``queue_name``,
    ``backend_name``, ``max_attempts``, ``return_value``, ``errors`` (one entry per
    failed or lost attempt, with traceback), ``worker_ids`` (one entry per attempt),
    ``attempt_open``, ``started_at``, ``last_attempted_at``, ``unique_key`` (the key of
    :func:`~django_taskclaim.contrib.tasks.enqueue_unique`, else ``NULL``) and
    ``active_unique_key`` (that key while the row is ready or processing; unique).
    ``created_at`` is the ``enqueued_at`` of the result; ``priority`` is Django's (higher
    runs first).
    """

    id = models.UUIDField(primary_key=True, default=time_ordered_uuid, editable=False)
    task_path = models.CharField(_("task"), max_length=255)
    args = models.JSONField(_("positional arguments"), default=list, blank=True)
    kwargs = models.JSONField(_("keyword arguments"), default=dict, blank=True)
    queue_name = models.CharField(
        _("queue"), max_length=NAME_MAX_LENGTH, default=DEFAULT_TASK_QUEUE_NAME
    )
    backend_name = models.CharField(
        _("backend"), max_length=NAME_MAX_LENGTH, default=DEFAULT_TASK_BACKEND_ALIAS
    )
    max_attempts = models.PositiveSmallIntegerField(_("max attempts"), default=default_max_attempts)
    return_value = models.JSONField(_("return value"), null=True, blank=True, editable=False)
    errors = models.JSONField(_("errors"), default=list, blank=True, editable=False)
    worker_ids = models.JSONField(_("worker ids"), default=list, blank=True, editable=False)
    attempt_open = models.BooleanField(
        _("attempt in progress"),
        default=False,
        editable=False,
        help_text=_("Set when an attempt starts, cleared when it records its outcome."),
    )
    started_at = models.DateTimeField(_("started at"), null=True, blank=True, editable=False)
    last_attempted_at = models.DateTimeField(
        _("last attempted at"), null=True, blank=True, editable=False
    )
    # NULL, not "": a row without a key never collides with another.
    unique_key = models.CharField(  # noqa: DJ001
        _("unique key"),
        max_length=UNIQUE_KEY_MAX_LENGTH,
        null=True,
        blank=True,
        editable=False,
        help_text=_("At most one ready or processing task has a given key."),
    )
    active_unique_key = ActiveKeyField("unique_key", verbose_name=_("active unique key"))

    class ClaimMeta:
        handler = "django_taskclaim.contrib.tasks.runner.execute"
        max_attempts = MAX_ATTEMPTS_CEILING
        dependents = True  # ClaimTask.after(): a task may wait for others

    class Meta:
        verbose_name = _("queued task")
        verbose_name_plural = _("queued tasks")
        indexes = [
            *claim_indexes("tctask"),
            # The worker's --queue NAME claim: WHERE status = 'ready' AND queue_name = ...
            models.Index(
                fields=["queue_name", "-priority", "created_at"],
                condition=models.Q(status=Status.READY.value),
                name="tctask_queue_claim",
            ),
            # The metrics' count of tasks waiting for others (after()): only those rows.
            models.Index(
                fields=["created_at"],
                condition=models.Q(status=Status.WAITING.value),
                name="tctask_waiting",
            ),
        ]
        constraints = [
            # enqueue_unique(): one ready-or-processing task per key, on every database;
            # rows without a key stay out of the index where partial indexes exist.
            SparseUniqueConstraint(fields=["active_unique_key"], name="tctask_active_unique_key"),
        ]

    def __str__(self) -> str:
        return f"{self.task_path} ({self.pk})"
