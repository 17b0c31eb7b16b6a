"""Models for the flow-control tests (pause / resume): task models with queues, and the
run each body records (when its claim was made, by the database clock)."""

from __future__ import annotations

from django.db import models

from django_taskclaim.db import DbNow
from django_taskclaim.model.concurrency_keys import concurrency_constraint, processing_key
from django_taskclaim.models import ClaimableModel


class ErrandRun(models.Model):
    """One run of a task body: which row, its claim token, its queue, and its claim's
    lease end (claim time + lease, database clock)."""

    model = models.CharField(max_length=40)
    task_id = models.BigIntegerField()
    token = models.BigIntegerField()
    queue = models.CharField(max_length=400)
    worker = models.CharField(max_length=255, blank=True, default="")
    claimed_until = models.DateTimeField(null=True)
    started_at = models.DateTimeField(db_default=DbNow())
    ended_at = models.DateTimeField(null=True)


def run_body(task: models.Model, seconds: float) -> None:
    """The task body of the models here: an :class:`ErrandRun` stamped on start and end."""
    from tests.support.helpers import simulate_work

    run = ErrandRun.objects.create(
        model=task._meta.model_name,
        task_id=task.pk,
        token=task.version,  # type: ignore[attr-defined]
        queue=task.queue_name,  # type: ignore[attr-defined]
        worker=task.locked_by or "",  # type: ignore[attr-defined]
        claimed_until=task.locked_until,  # type: ignore[attr-defined]
    )
    if seconds:
        simulate_work(seconds)
    ErrandRun.objects.filter(pk=run.pk).update(ended_at=DbNow())


class Errand(ClaimableModel):
    """A task with a queue (``queue_name``, what ``--queue`` and a queue pause name;
    longer than the history's column can hold, for the history's tests)."""

    queue_name = models.CharField(max_length=400, default="default")
    work = models.FloatField(default=0.0)

    class ClaimMeta:
        lease = 30

    def process(self) -> None:
        run_body(self, self.work)


class KeyedErrand(ClaimableModel):
    """A task with a queue and a concurrency key (one row ``processing`` per customer)."""

    queue_name = models.CharField(max_length=50, default="default")
    customer_id = models.IntegerField(null=True)
    work = models.FloatField(default=0.0)
    customer_held = processing_key("customer_id", models.IntegerField())

    class Meta(ClaimableModel.Meta):
        constraints = [concurrency_constraint("customer_held", generated=True)]

    class ClaimMeta:
        lease = 30
        concurrency_key = "customer_id"

    def process(self) -> None:
        run_body(self, self.work)
