"""Models for the concurrency-key tests: keyed tasks and the ledger their bodies write.

The keyed models use the generated-column form of the constraint, the one that works on
PostgreSQL, MariaDB and SQLite alike (the partial form is tested on a model built in the
test itself, since MariaDB ignores partial constraints).
"""

from __future__ import annotations

from django.db import models

from django_taskclaim.db import DbNow
from django_taskclaim.model.concurrency_keys import (
    concurrency_constraint,
    concurrency_slot,
    processing_key,
)
from django_taskclaim.models import ClaimableModel


class KeyRun(models.Model):
    """One run of a keyed task body: its key, and when it started and ended (database
    clock). Two runs of one key overlapping means two holders at once."""

    model = models.CharField(max_length=40)
    key = models.IntegerField(null=True)
    task_id = models.BigIntegerField()
    token = models.BigIntegerField()
    worker = models.CharField(max_length=255, blank=True, default="")
    #: The lease end the claim wrote (claim time + lease, database clock).
    claimed_until = models.DateTimeField(null=True)
    started_at = models.DateTimeField(db_default=DbNow())
    ended_at = models.DateTimeField(null=True)


def run_body(task: models.Model, key: int | None, seconds: float) -> None:
    """The task body of the keyed models: a :class:`KeyRun` stamped on start and end."""
    from tests.support.helpers import simulate_work

    run = KeyRun.objects.create(
        model=task._meta.model_name,
        key=key,
        task_id=task.pk,
        token=task.version,  # type: ignore[attr-defined]
        worker=task.locked_by or "",  # type: ignore[attr-defined]
        claimed_until=task.locked_until,  # type: ignore[attr-defined]
    )
    if seconds:
        simulate_work(seconds)
    KeyRun.objects.filter(pk=run.pk).update(ended_at=DbNow())


class KeyedJob(ClaimableModel):
    """At most one row ``processing`` per ``customer_id``."""

    customer_id = models.IntegerField(null=True)
    work = models.FloatField(default=0.0)
    customer_held = processing_key("customer_id", models.IntegerField())

    class Meta(ClaimableModel.Meta):
        constraints = [concurrency_constraint("customer_held", generated=True)]

    class ClaimMeta:
        lease = 30
        concurrency_key = "customer_id"

    def process(self) -> None:
        run_body(self, self.customer_id, self.work)


class PairJob(ClaimableModel):
    """At most two rows ``processing`` per ``customer_id`` (slots 0 and 1)."""

    customer_id = models.IntegerField(null=True)
    work = models.FloatField(default=0.0)
    customer_held = processing_key("customer_id", models.IntegerField())
    concurrency_slot = concurrency_slot()

    class Meta(ClaimableModel.Meta):
        constraints = [concurrency_constraint("customer_held", generated=True, slot=True)]

    class ClaimMeta:
        lease = 30
        concurrency_key = "customer_id"
        concurrency_limit = 2

    def process(self) -> None:
        run_body(self, self.customer_id, self.work)


class PlainJob(ClaimableModel):
    """The same rows without a concurrency key (the baseline of the benchmark, and the
    model whose claim SQL must not change)."""

    customer_id = models.IntegerField(null=True)
    work = models.FloatField(default=0.0)

    class ClaimMeta:
        lease = 30

    def process(self) -> None:
        run_body(self, self.customer_id, self.work)
