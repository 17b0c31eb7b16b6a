"""The lifecycle states of a claimable row."""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _


class Status(models.TextChoices):
    """States of a task row.

    ``ready`` → claimable (once ``run_after`` has passed); ``processing`` → held under a
    lease; ``waiting`` → not claimable until its prerequisites settle (docs/workflows.md);
    ``done`` / ``failed`` / ``cancelled`` → terminal. ``failed`` is the
    dead-letter state: visible, and retryable from the admin or ``requeue()``.
    """

    READY = "ready", _("ready")
    PROCESSING = "processing", _("processing")
    DONE = "done", _("done")
    FAILED = "failed", _("failed")
    CANCELLED = "cancelled", _("cancelled")
    WAITING = "waiting", _("waiting")


#: Logical state names used by the library; a model's ``ClaimMeta.statuses`` maps each
#: to the value stored in its own column.
#: ``waiting`` is optional, like ``cancelled``: a model that maps none cannot have
#: prerequisites.
STATE_NAMES = ("ready", "processing", "done", "failed", "cancelled", "waiting")
TERMINAL_STATES = ("done", "failed", "cancelled")

#: The key under which ``state_counts()`` and the figures count rows whose stored status
#: maps to no logical state (a value written outside the library).
UNKNOWN_STATE = "unknown"
