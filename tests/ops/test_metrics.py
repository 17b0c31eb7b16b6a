"""The database-side gauges on the real database: a known set of rows, scraped through
the protected view with Django's test client and printed by ``taskclaim_metrics``, each
parsed with prometheus_client's own parser and checked against the rows."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.test import override_settings

from django_taskclaim.db import DbNow
from django_taskclaim.models import QueuePause, WorkerProcess
from django_taskclaim.ops.metrics.exposition import METRICS
from django_taskclaim.periodic.reported import reported_models
from tests.support.testapp.models import Document

parser = pytest.importorskip("prometheus_client.parser", reason="prometheus_client not installed")

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.urls("tests.support.metrics_urls"),
]

URL = "/metrics/taskclaim"
DOC = "testapp.Document"
TOKEN = "s3cret-token"


def families(text: str) -> dict[str, dict[tuple, float]]:
    """name -> {sorted label items: value}, parsed by prometheus_client."""
    found: dict[str, dict[tuple, float]] = {}
    for family in parser.text_string_to_metric_families(text):
        assert family.type == "gauge", family.name
        samples = found.setdefault(family.name, {})
        for sample in family.samples:
            samples[tuple(sorted(sample.labels.items()))] = sample.value
    return found


def at(found: dict, name: str, **labels: str) -> float:
    return found[name][tuple(sorted(labels.items()))]


@pytest.fixture
def rows():
    """4 ready (one scheduled for later), 2 processing (one lease expired), 1 failed,
    2 done; the whole model paused; one live and one silent worker."""
    ready = [Document.objects.create(title=f"r{i}") for i in range(3)]
    Document.objects.filter(pk=ready[0].pk).update(created_at=DbNow() - timedelta(seconds=600))
    later = Document.objects.create(title="later")
    Document.objects.filter(pk=later.pk).update(
        created_at=DbNow() - timedelta(seconds=5000), run_after=DbNow() + timedelta(hours=1)
    )
    for title, lease in (("expired", -60), ("running", 600)):
        doc = Document.objects.create(title=title)
        Document.objects.filter(pk=doc.pk).update(
            status="processing", attempts=1, locked_until=DbNow() + timedelta(seconds=lease)
        )
    Document.objects.create(title="failed", status="failed")
    Document.objects.create(title="d1", status="done")
    Document.objects.create(title="d2", status="done")
    QueuePause.objects.create(model=DOC, queue="", paused_by="test")
    WorkerProcess.objects.create(
        worker_id="live:1", hostname="h", pid=1, model_labels=[DOC, "testapp.Job"]
    )
    WorkerProcess.objects.create(worker_id="silent:2", hostname="h", pid=2, model_labels=[DOC])
    WorkerProcess.objects.filter(worker_id="silent:2").update(
        last_seen=DbNow() - timedelta(hours=1)
    )


def check(found: dict) -> None:
    """The gauges of the ``rows`` fixture."""
    assert set(found) == set(METRICS)
    for state, n in (("ready", 4), ("processing", 2), ("failed", 1)):
        assert at(found, "taskclaim_tasks", model=DOC, queue="", state=state) == n
    assert at(found, "taskclaim_expired_leases", model=DOC, queue="") == 1
    # the oldest row ready now was created 600 s ago (database clock); the older row
    # scheduled for later does not count
    age = at(found, "taskclaim_oldest_ready_age_seconds", model=DOC, queue="")
    assert 600 <= age < 900
    assert found["taskclaim_queue_paused"] == {(("model", DOC), ("queue", "")): 1}
    assert at(found, "taskclaim_workers_live") == 1
    assert at(found, "taskclaim_workers_silent") == 1
    assert at(found, "taskclaim_model_workers_live", model=DOC) == 1
    assert at(found, "taskclaim_model_workers_live", model="testapp.Job") == 1
    # every claimable model has its gauges, zeros included (PeriodicRun where periodic
    # functions are used)
    for model in reported_models():
        label = model._meta.label
        assert at(found, "taskclaim_expired_leases", model=label, queue="") >= 0
        if label != DOC:
            assert at(found, "taskclaim_tasks", model=label, queue="", state="ready") == 0


@override_settings(TASKCLAIM_METRICS_TOKEN=TOKEN)
def test_a_scrape_with_the_token_reads_the_gauges_of_the_rows(client, rows):
    response = client.get(URL, HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert response.status_code == 200
    assert response["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    check(families(response.content.decode()))


def staff_user(name: str, *codenames: str):
    """An active staff user holding the ``taskclaim`` permissions ``codenames``."""
    from django.contrib.auth.models import Permission

    user = get_user_model().objects.create_user(name, password="x", is_staff=True)
    user.user_permissions.add(
        *Permission.objects.filter(content_type__app_label="taskclaim", codename__in=codenames)
    )
    return user


def test_a_staff_user_with_the_permission_reads_them_without_a_token(client, rows):
    client.force_login(staff_user("ops", "view_metrics"))
    response = client.get(URL)
    assert response.status_code == 200
    check(families(response.content.decode()))


def test_a_staff_user_without_the_metrics_permission_gets_403(client, rows):
    # Staff, and allowed to see every model's rows and the workers: not the metrics.
    client.force_login(staff_user("viewer", "view_workerprocess", "view_queuepause"))
    response = client.get(URL)
    assert response.status_code == 403
    assert b"taskclaim.view_metrics" in response.content
    assert b"taskclaim_tasks" not in response.content
    superuser = get_user_model().objects.create_superuser("root", password="x")
    client.force_login(superuser)  # holds every permission
    assert client.get(URL).status_code == 200


@pytest.mark.parametrize(
    ("token", "header"),
    [
        (None, ""),
        (None, f"Bearer {TOKEN}"),  # no token configured: no token accepted
        ("", "Bearer "),  # an empty token is no token
        (TOKEN, ""),
        (TOKEN, "Bearer wrong"),
        (TOKEN, f"Basic {TOKEN}"),
        (TOKEN, f"Bearer {TOKEN}x"),
    ],
)
def test_anyone_else_gets_403_and_no_figures(client, rows, token, header):
    with override_settings(TASKCLAIM_METRICS_TOKEN=token):
        extra = {"HTTP_AUTHORIZATION": header} if header else {}
        response = client.get(URL, **extra)
    assert response.status_code == 403
    assert b"taskclaim_" not in response.content


def test_a_logged_in_user_who_is_not_staff_gets_403(client, rows):
    user = get_user_model().objects.create_user("someone", password="x")
    client.force_login(user)
    assert client.get(URL).status_code == 403
    user.is_staff, user.is_active = True, False
    user.save()
    assert client.get(URL).status_code == 403


@override_settings(TASKCLAIM_METRICS_TOKEN=TOKEN)
def test_only_get_and_head_are_answered(client, rows):
    auth = {"HTTP_AUTHORIZATION": f"Bearer {TOKEN}"}
    assert client.post(URL, **auth).status_code == 405
    assert client.head(URL, **auth).status_code == 200


def test_the_command_prints_the_same_gauges(rows):
    out = StringIO()
    call_command("taskclaim_metrics", stdout=out)
    check(families(out.getvalue()))
    out = StringIO()
    call_command("taskclaim_metrics", DOC, "--database", "default", stdout=out)
    found = families(out.getvalue())
    assert {dict(k)["model"] for k in found["taskclaim_tasks"]} == {DOC}
    assert at(found, "taskclaim_tasks", model=DOC, queue="", state="ready") == 4


def test_the_command_refuses_bad_input_in_one_line(rows):
    with pytest.raises(CommandError, match="unknown database alias 'nope'"):
        call_command("taskclaim_metrics", "--database", "nope")
    with pytest.raises(CommandError) as info:
        call_command("taskclaim_metrics", "testapp.Nope")
    assert "testapp.Nope" in str(info.value)
    assert "\n" not in str(info.value)


def test_an_empty_database_gives_zeros_not_missing_series():
    out = StringIO()
    call_command("taskclaim_metrics", DOC, stdout=out)
    found = families(out.getvalue())
    for state in ("ready", "processing", "failed"):
        assert at(found, "taskclaim_tasks", model=DOC, queue="", state=state) == 0
    assert at(found, "taskclaim_oldest_ready_age_seconds", model=DOC, queue="") == 0
    assert at(found, "taskclaim_workers_live") == 0
    assert at(found, "taskclaim_model_workers_live", model=DOC) == 0
    assert found["taskclaim_queue_paused"] == {}


def test_rows_waiting_for_prerequisites_and_for_events_are_counted():
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from django_taskclaim.models import TaskEventWait
    from django_taskclaim.ops.figures import model_stats
    from tests.support.testapp.models import Step

    first = Step.objects.create(name="first")
    for i in range(2):
        Document.objects.create(title=f"waits {i}", after=[first])
    Document.objects.create(title="ready")
    TaskEventWait.objects.create(
        name="approved:1", task_model=DOC, task_pk="1", deadline=DbNow() + timedelta(hours=1)
    )
    with CaptureQueriesContext(connection) as queries:
        out = StringIO()
        call_command("taskclaim_metrics", stdout=out)
    found = families(out.getvalue())
    assert at(found, "taskclaim_tasks", model=DOC, queue="", state="waiting") == 2
    assert at(found, "taskclaim_tasks", model=DOC, queue="", state="ready") == 1
    assert at(found, "taskclaim_tasks", model="testapp.Step", queue="", state="waiting") == 0
    assert at(found, "taskclaim_event_waits", model=DOC) == 1
    assert at(found, "taskclaim_event_waits", model="testapp.Step") == 0
    # a model none of whose rows ever waited: its table is not read for waiting rows
    step_table = Step._meta.db_table
    assert not [q["sql"] for q in queries if step_table in q["sql"] and "waiting" in q["sql"]]
    stats = model_stats(Document)
    assert stats.counts["waiting"] == 2
    assert stats.parked == 1


def test_5000_queue_names_give_at_most_the_cap_plus_one_series_per_metric(settings):
    from tests.support.flowapp.models import Errand

    settings.TASKCLAIM_METRICS_MAX_QUEUES = 50
    Errand.objects.bulk_create(Errand(queue_name=f"tenant-{i:04d}") for i in range(5000))
    Errand.objects.bulk_create(Errand(queue_name="zz-busiest") for _ in range(3))
    failed = Errand.objects.create(queue_name="tenant-4999")  # 2 rows: among the busiest
    Errand.objects.filter(pk=failed.pk).update(status="failed")
    QueuePause.objects.bulk_create(
        QueuePause(model="flowapp.Errand", queue=f"tenant-{i:04d}") for i in range(60)
    )
    QueuePause.objects.create(model="flowapp.Errand", queue="")
    out = StringIO()
    call_command("taskclaim_metrics", "flowapp.Errand", stdout=out)
    found = families(out.getvalue())
    for name in ("taskclaim_expired_leases", "taskclaim_oldest_ready_age_seconds"):
        assert len(found[name]) == 51, name
    assert len(found["taskclaim_tasks"]) == 51 * 4  # per state
    ready = {
        dict(k)["queue"]: v for k, v in found["taskclaim_tasks"].items() if ("state", "ready") in k
    }
    assert ready["zz-busiest"] == 3
    assert ready["tenant-4999"] == 1
    assert sum(ready.values()) == 5003  # the others summed up, nothing lost
    assert ready["(other)"] == 5003 - 3 - 1 - 48
    paused = {dict(k)["queue"] for k in found["taskclaim_queue_paused"]}
    assert len(paused) == 52  # the whole model, 50 queues by name, "(other)"
    assert {"", "(other)", "tenant-0000"} <= paused
    assert "tenant-0059" not in paused
