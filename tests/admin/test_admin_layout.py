"""What the admin pages say, through Django's test client on real rows: a task's page names
its last holder once nobody holds it and shows one lease line while somebody does;
``PeriodicRun`` stays out of the dashboard, the admin index and ``taskclaim_stats`` of a
project that schedules no function; the dashboard has one pause form; the workers header
links to every worker. (How the pages look is ``tests/system/test_admin_layout.py``.)"""

from __future__ import annotations

import io
import re
from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission
from django.core.management import call_command
from django.test import Client
from django.urls import reverse

from django_taskclaim.db import DbNow, db_now
from django_taskclaim.models import PeriodicRun, PeriodicSlot, WorkerProcess
from django_taskclaim.periodic import periodic, register, schedules, unregister
from django_taskclaim.periodic.reported import periodic_in_use, periodic_runs_in_use
from tests.support.testapp.models import Document

DASHBOARD = "admin:taskclaim_dashboard"
RUN_LABEL = 'data-model="taskclaim.PeriodicRun"'


def nightly() -> None:
    """The function of the schedules these tests register."""


@pytest.fixture
def no_schedules():
    """This process's schedule registry, emptied for the test and restored after it."""
    saved = schedules()
    for s in saved:
        unregister(s.name)
    try:
        yield
    finally:
        for s in schedules():
            unregister(s.name)
        for s in saved:
            register(s)


def document(state: str, **fields) -> Document:
    doc = Document.objects.create(title=f"a {state} invoice")
    Document.objects.filter(pk=doc.pk).update(status=state, **fields)
    return doc


def page(client, doc: Document) -> str:
    resp = client.get(reverse("admin:testapp_document_change", args=[doc.pk]))
    assert resp.status_code == 200
    return resp.content.decode()


def field_rows(html: str) -> list[str]:
    """The names of the read-only rows of a change form, in order (``field-<name>``)."""
    return re.findall(r'class="form-row field-([\w]+)', html)


def stats(*args: str) -> str:
    out = io.StringIO()
    call_command("taskclaim_stats", *args, stdout=out)
    return out.getvalue()


# -- a task's page ----------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("state", ["done", "failed", "cancelled"])
def test_a_finished_task_names_its_last_holder_and_no_lease(admin_client, state):
    doc = document(state, finished_at=DbNow(), attempts=2, locked_by="host-a:4242")
    html = page(admin_client, doc)
    rows = field_rows(html)
    assert "last_holder" in rows
    assert not {"current_holder", "locked_by", "locked_until", "lease_remaining"} & set(rows)
    assert "lease_details" not in rows  # a finished row holds no lease
    holder = html.split("field-last_holder")[1].split("</div>\n</div>")[0]
    assert "Last holder:" in holder
    assert "host-a:4242" in holder
    assert "Held by" not in html


@pytest.mark.django_db
def test_a_task_never_held_shows_a_dash_as_last_holder(admin_client):
    doc = document("ready")
    html = page(admin_client, doc)
    holder = html.split("field-last_holder")[1].split("</div>\n</div>")[0]
    assert "—" in holder


@pytest.mark.django_db(transaction=True)
def test_a_held_task_shows_its_holder_and_one_lease_line(admin_client):
    Document.objects.create(title="held")
    (task,) = Document.objects.claim(1, worker="host-b:77", lease=600)
    html = page(admin_client, task)
    rows = field_rows(html)
    assert [r for r in rows if "lease" in r or "locked" in r] == ["lease_details"]
    assert "current_holder" in rows
    assert "last_holder" not in rows
    holder = html.split("field-current_holder")[1].split("</div>\n</div>")[0]
    assert "Held by:" in holder
    assert "host-b:77" in holder
    lease = html.split("field-lease_details")[1].split("</div>\n</div>")[0]
    assert "Lease:" in lease
    assert re.search(r"\dm \d+s left \(until \d{4}-\d\d-\d\d \d\d:\d\d:\d\d \w+\)", lease), lease

    Document.objects.filter(pk=task.pk).update(locked_until=DbNow() - timedelta(seconds=90))
    lease = page(admin_client, task).split("field-lease_details")[1].split("</div>\n</div>")[0]
    assert 'class="taskclaim-expired"' in lease
    assert re.search(r"expired 1m 3\ds ago</span> \(at \d{4}-", lease), lease


# -- the admin index links to the dashboard -----------------------------------------------


@pytest.mark.django_db
def test_the_admin_index_links_to_the_dashboard(admin_client, django_user_model):
    """``/admin/`` lists "Dashboard" under "Task claims", which opens the dashboard; a
    staff user who may view no claimable model gets no such entry (nor the page)."""
    entry = reverse("admin:taskclaim_dashboard_changelist")
    index = admin_client.get(reverse("admin:index")).content.decode()
    assert f'<a href="{entry}"' in index
    assert ">Dashboard</a>" in index
    resp = admin_client.get(entry)
    assert resp.status_code == 302
    assert resp["Location"] == reverse(DASHBOARD)
    assert 'data-model="testapp.Document"' in admin_client.get(resp["Location"]).content.decode()

    staff = django_user_model.objects.create_user("staff", password="pw", is_staff=True)
    client = Client()
    client.force_login(staff)
    assert entry not in client.get(reverse("admin:index")).content.decode()
    assert client.get(entry).status_code == 403
    staff.user_permissions.add(Permission.objects.get(codename="view_document"))
    client.force_login(django_user_model.objects.get(pk=staff.pk))
    assert f'<a href="{entry}"' in client.get(reverse("admin:index")).content.decode()


# -- PeriodicRun only where periodic work is used ---------------------------------------


@pytest.mark.django_db
def test_periodic_run_is_left_out_where_no_function_is_scheduled(admin_client, no_schedules):
    Document.objects.create(title="one")
    assert not periodic_runs_in_use()
    assert not periodic_in_use()
    html = admin_client.get(reverse(DASHBOARD)).content.decode()
    assert 'data-model="testapp.Document"' in html
    assert RUN_LABEL not in html
    index = admin_client.get(reverse("admin:index")).content.decode()
    assert reverse("admin:taskclaim_periodicrun_changelist") not in index
    assert reverse("admin:taskclaim_periodicslot_changelist") not in index
    assert reverse("admin:taskclaim_workerprocess_changelist") in index
    out = stats()
    assert "testapp.Document" in out
    assert "taskclaim.PeriodicRun" not in out
    # named, it is reported; its page still opens
    assert "taskclaim.PeriodicRun" in stats("taskclaim.PeriodicRun")
    url = reverse("admin:taskclaim_periodicrun_changelist")
    assert admin_client.get(url).status_code == 200


@pytest.mark.django_db
def test_periodic_run_stays_out_of_the_worker_doctor_and_metrics_where_unused(no_schedules):
    """A project that never uses periodic work does not see PeriodicRun in the worker's
    default models (its start line), the doctor's report or the metrics; once a function
    is scheduled, all three have it."""
    from django_taskclaim.ops.doctor import diagnose
    from django_taskclaim.ops.metrics.gauges import collect
    from django_taskclaim.worker.config import _models

    label = "taskclaim.PeriodicRun"
    assert not periodic_runs_in_use()
    assert PeriodicRun not in _models([], None)
    assert label not in {f.model for f in diagnose()}
    assert label not in {q.model for q in collect().queues}
    # named, it is served and checked
    assert _models([label], None) == [PeriodicRun]
    assert label in {f.model for f in diagnose([PeriodicRun])}
    periodic("0 3 * * *", name="layout.tests.nightly")(nightly)
    assert PeriodicRun in _models([], None)
    assert label in {f.model for f in diagnose()}
    assert label in {q.model for q in collect().queues}


@pytest.mark.django_db
def test_periodic_run_is_listed_once_a_function_is_scheduled(admin_client, no_schedules):
    periodic("0 3 * * *", name="layout.tests.nightly")(nightly)
    assert periodic_runs_in_use()
    assert RUN_LABEL in admin_client.get(reverse(DASHBOARD)).content.decode()
    index = admin_client.get(reverse("admin:index")).content.decode()
    assert reverse("admin:taskclaim_periodicrun_changelist") in index
    assert reverse("admin:taskclaim_periodicslot_changelist") in index
    assert "taskclaim.PeriodicRun" in stats()


@pytest.mark.django_db
def test_periodic_run_is_listed_while_runs_exist(admin_client, no_schedules):
    slot = db_now().replace(microsecond=0)
    PeriodicRun.objects.create(schedule="gone.job", slot=slot, function="gone.job")
    assert periodic_runs_in_use()
    assert RUN_LABEL in admin_client.get(reverse(DASHBOARD)).content.decode()
    assert "taskclaim.PeriodicRun" in stats()


@pytest.mark.django_db
def test_slots_alone_show_the_slots_but_not_the_runs(admin_client, no_schedules):
    slot = db_now().replace(microsecond=0)
    PeriodicSlot.objects.create(schedule="documents", slot=slot, target="testapp.Document")
    assert periodic_in_use()
    assert not periodic_runs_in_use()
    index = admin_client.get(reverse("admin:index")).content.decode()
    assert reverse("admin:taskclaim_periodicslot_changelist") in index
    assert reverse("admin:taskclaim_periodicrun_changelist") not in index


# -- the dashboard ----------------------------------------------------------------------


@pytest.mark.django_db
def test_the_dashboard_has_one_pause_form_and_a_visible_workers_link(admin_client):
    Document.objects.create(title="one")
    WorkerProcess.objects.create(
        worker_id="host-a:1", hostname="host-a", pid=1, concurrency=2, model_labels=[]
    )
    html = admin_client.get(reverse(DASHBOARD)).content.decode()
    controls = html.split('id="taskclaim-pause-controls"')
    assert len(controls) == 2  # one form
    form = controls[1].split("</form>")[0]
    assert 'name="model"' in form
    assert '<option value="testapp.Document" data-model="testapp.Document">' in form
    assert 'name="queue" value="all"' in form
    assert 'value="pause"' in form
    assert 'value="resume"' in form
    assert "taskclaim-pause-form" not in html  # no per-model forms on the dashboard
    header = html.split('id="taskclaim-workers"')[1].split("</h2>")[0]
    assert 'class="taskclaim-workers-link taskclaim-h2-link"' in header
    assert "1 live worker" in header
    assert "·" not in header
