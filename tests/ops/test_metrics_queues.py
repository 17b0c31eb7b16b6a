"""The gauges of a model with queues (a ``queue_name`` field): one series per queue,
and a paused queue named by its queue. Needs the tasks backend's ``QueuedTask``: run
with ``--ds=tests.support.settings_tasks``."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from django.apps import apps

if not apps.is_installed("django_taskclaim.contrib.tasks"):
    pytest.skip(
        "the django.tasks backend is not installed; run with --ds=tests.support.settings_tasks",
        allow_module_level=True,
    )

from django.core.management import call_command

from django_taskclaim.contrib.tasks.models import QueuedTask
from django_taskclaim.db import DbNow
from django_taskclaim.models import QueuePause

parser = pytest.importorskip("prometheus_client.parser", reason="prometheus_client not installed")

pytestmark = pytest.mark.django_db(transaction=True)

LABEL = QueuedTask._meta.label


def scrape() -> dict[tuple[str, tuple], float]:
    out = StringIO()
    call_command("taskclaim_metrics", LABEL, stdout=out)
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in parser.text_string_to_metric_families(out.getvalue())
        for s in family.samples
    }


def test_each_queue_has_its_own_series():
    def add(queue: str, status: str = "ready", age: float = 0.0) -> None:
        row = QueuedTask.objects.create(
            task_path="tests.support.tasks_examples.add", queue_name=queue, status=status
        )
        QueuedTask.objects.filter(pk=row.pk).update(created_at=DbNow() - timedelta(seconds=age))

    add("emails", age=300)
    add("emails")
    add("reports", age=30)
    add("reports", status="failed")
    QueuePause.objects.create(model=LABEL, queue="reports")
    found = scrape()

    def gauge(name: str, queue: str, **labels: str) -> float:
        return found[(name, tuple(sorted({"model": LABEL, "queue": queue, **labels}.items())))]

    assert gauge("taskclaim_tasks", "emails", state="ready") == 2
    assert gauge("taskclaim_tasks", "reports", state="ready") == 1
    assert gauge("taskclaim_tasks", "reports", state="failed") == 1
    assert gauge("taskclaim_tasks", "emails", state="failed") == 0
    assert 300 <= gauge("taskclaim_oldest_ready_age_seconds", "emails") < 600
    assert 30 <= gauge("taskclaim_oldest_ready_age_seconds", "reports") < 300
    assert gauge("taskclaim_queue_paused", "reports") == 1
    assert ("taskclaim_queue_paused", (("model", LABEL), ("queue", "emails"))) not in found
