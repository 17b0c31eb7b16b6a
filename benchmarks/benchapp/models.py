"""The benchmark's task model: a no-op task on the stock ``ClaimableModel``."""

from __future__ import annotations

import time

from django.db import models

from django_taskclaim.models import ClaimableModel


class BenchTask(ClaimableModel):
    """A no-op task. With ``stamp`` set it records when a worker started it (latency runs)."""

    stamp = models.BooleanField(default=False, db_default=False)
    started = models.FloatField(null=True, blank=True)

    class ClaimMeta:
        lease = 300
        max_attempts = 5

    class Meta(ClaimableModel.Meta):
        app_label = "benchapp"

    def __str__(self) -> str:
        return f"bench task {self.pk}"

    def process(self) -> dict | None:
        if self.stamp:
            return {"started": time.time()}
        return None
