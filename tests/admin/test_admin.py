"""The admin integration on real rows: columns, filters, read-only claim state, actions,
permissions, CSRF, fencing against a live holder, the dashboard and the app's own models."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib import admin
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission
from django.contrib.staticfiles import finders
from django.db import connection, models
from django.db.models.signals import post_init
from django.test import Client
from django.test.utils import CaptureQueriesContext, isolate_apps
from django.urls import path, reverse

from django_taskclaim import ClaimLost
from django_taskclaim.admin import ClaimableAdminMixin
from django_taskclaim.db import DbNow, db_now
from django_taskclaim.models import (
    ClaimableMixin,
    ClaimFieldsMixin,
    Lease,
    TaskHistory,
    WorkerProcess,
)
from django_taskclaim.ops.figures import live_workers
from django_taskclaim.ops.metrics.gauges import queue_gauges
from django_taskclaim.rules import lease_ended
from django_taskclaim.worker import silent_workers
from tests.support.testapp.admin import DocumentAdmin
from tests.support.testapp.models import Document, Job

CHANGELIST = "admin:testapp_document_changelist"
ACTIONS = (
    "taskclaim_requeue",
    "taskclaim_retry_failed",
    "taskclaim_cancel",
    "taskclaim_release",
    "taskclaim_reap",
)


def make(state: str, n: int = 1, **extra) -> list[Document]:
    """Create ``n`` documents and put them in ``state`` directly in the database."""
    docs = Document.objects.bulk_create([Document(title=f"{state}-{i}", **extra) for i in range(n)])
    pks = [d.pk for d in docs]
    fields: dict = {"status": state}
    if state == "processing":
        fields.update(
            locked_until=DbNow() + timedelta(seconds=300), locked_by="w-other", attempts=1
        )
    if state in ("done", "failed", "cancelled"):
        fields.update(finished_at=DbNow(), attempts=1)
    if state == "failed":
        fields["last_error"] = "Traceback (most recent call last):\n  ...\nValueError: bad page 7"
    Document.objects.filter(pk__in=pks).update(**fields)
    return list(Document.objects.filter(pk__in=pks).order_by("pk"))


def expire(*docs: Document) -> None:
    Document.objects.filter(pk__in=[d.pk for d in docs]).update(
        locked_until=DbNow() - timedelta(seconds=5)
    )


def run_action(client: Client, action: str, docs=None, *, select_across: bool = False, **extra):
    data = {"action": action, "index": 0, "select_across": "1" if select_across else "0"}
    if docs is None and select_across:
        # the browser posts the visible page's checkboxes along with "select all"
        docs = list(Document.objects.order_by("-pk")[:1])
    if docs is not None:
        data["_selected_action"] = [str(d.pk) for d in docs]
    data.update(extra)
    return client.post(reverse(CHANGELIST), data, follow=True)


def messages_of(response) -> list[str]:
    return [str(m) for m in response.context["messages"]]


def states() -> dict[str, int]:
    return Document.objects.stats()


@pytest.fixture
def viewer(django_user_model):
    """Staff user with the view permission only."""
    user = django_user_model.objects.create_user("viewer", password="pw", is_staff=True)
    user.user_permissions.add(
        Permission.objects.get(codename="view_document"),
        Permission.objects.get(codename="view_workerprocess"),
    )
    return user


@pytest.fixture
def editor(django_user_model):
    """Staff user with view and change permissions on documents."""
    user = django_user_model.objects.create_user("editor", password="pw", is_staff=True)
    user.user_permissions.add(
        Permission.objects.get(codename="view_document"),
        Permission.objects.get(codename="change_document"),
    )
    return user


# -- changelist ---------------------------------------------------------------------


@pytest.mark.django_db
def test_changelist_columns_badges_and_summary(admin_client):
    make("ready", 3)
    held = make("processing", 2)
    expire(held[0])
    make("done", 4)
    make("failed", 1)
    deferred = make("ready", 1)
    Document.objects.filter(pk=deferred[0].pk).update(run_after=DbNow() + timedelta(minutes=10))
    resp = admin_client.get(reverse(CHANGELIST))
    assert resp.status_code == 200
    html = resp.content.decode()
    assert ">in 9m 5" in html or ">in 10m 00s<" in html  # deferred by run_after
    summary = resp.context["taskclaim_summary"]["stats"]
    assert summary.counts == {
        "ready": 4,
        "processing": 2,
        "done": 4,
        "failed": 1,
        "cancelled": 0,
        "waiting": 0,
    }
    assert summary.expired == 1
    for state, n in (("ready", 4), ("processing", 2), ("done", 4), ("failed", 1)):
        assert f'data-state="{state}" data-count="{n}"' in html
    assert 'data-state="expired" data-count="1"' in html
    assert html.count('class="taskclaim-badge taskclaim-done"') >= 4
    assert "taskclaim-expired" in html  # the lapsed lease is called out
    assert "w-other" in html  # the holder
    assert "ValueError: bad page 7" in html  # last line of the error, shortened
    assert "Traceback (most recent call last)" not in html.split("<tbody>")[1].split("title=")[0]
    for action in ACTIONS:
        assert f'value="{action}"' in html


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("taskclaim_status=ready", {"ready-0", "ready-1"}),
        ("taskclaim_status=failed", {"failed-0", "failed-1"}),
        ("taskclaim_lease=expired", {"processing-0"}),
        ("taskclaim_lease=running", {"processing-1"}),
        ("taskclaim_error=failed", {"failed-0"}),
    ],
)
def test_filters(admin_client, query, expected):
    make("ready", 2)
    held = make("processing", 2)
    expire(held[0])
    failed = make("failed", 2)
    Document.objects.filter(pk=failed[1].pk).update(last_error="")
    resp = admin_client.get(reverse(CHANGELIST) + "?" + query)
    assert resp.status_code == 200
    assert {d.title for d in resp.context["cl"].result_list} == expected


@pytest.mark.django_db
def test_no_facet_counts_unless_an_admin_turns_them_on(admin_client, monkeypatch):
    make("ready", 2)
    held = make("processing", 2)
    expire(held[0])
    failed = make("failed", 3)
    Document.objects.filter(pk=failed[2].pk).update(last_error="")
    url = reverse(CHANGELIST)
    html = admin_client.get(url).content.decode()
    assert "_facets" not in html  # no "Show counts" link
    resp = admin_client.get(url + "?_facets=True")  # ignored, not an error
    assert resp.status_code == 200
    assert not resp.context["cl"].add_facets
    # An admin that turns them on: each choice counted over the listed rows (one
    # conditional count per choice, no subquery), the other filters' choices applied.
    monkeypatch.setattr(DocumentAdmin, "show_facets", admin.ShowFacets.ALWAYS)
    with CaptureQueriesContext(connection) as queries:
        resp = admin_client.get(url + "?taskclaim_error=any")
    facets = {
        spec.parameter_name: {
            c["display"]: c["query_string"] for c in spec.choices(resp.context["cl"])
        }
        for spec in resp.context["cl"].filter_specs
    }
    status = set(facets["taskclaim_status"])
    assert {"ready (0)", "processing (0)", "failed (2)", "done (0)", "cancelled (0)"} <= status
    assert {"lease expired (0)", "lease running (0)"} <= set(facets["taskclaim_lease"])
    assert {"failed with error (2)", "has an error (2)", "no error (5)"} == {
        d for d in facets["taskclaim_error"] if d != "All"
    }
    counts = [q["sql"] for q in queries.captured_queries if "0__c" in q["sql"]]  # any quoting
    assert counts
    assert not any(" IN (SELECT" in sql for sql in counts), counts


@pytest.mark.django_db
def test_integer_status_model_gets_mapped_filters_and_no_cancel(admin_client):
    jobs = Job.objects.bulk_create([Job(name=f"j{i}") for i in range(3)])
    Job.objects.filter(pk=jobs[0].pk).update(status=Job.FAILED, last_error="boom")
    url = reverse("admin:testapp_job_changelist")
    resp = admin_client.get(url + "?taskclaim_status=failed")
    assert [j.name for j in resp.context["cl"].result_list] == ["j0"]
    html = resp.content.decode()
    assert 'value="taskclaim_cancel"' not in html  # Job maps no cancelled state
    assert 'value="taskclaim_retry_failed"' in html
    resp = admin_client.post(
        url,
        {"action": "taskclaim_retry_failed", "index": 0, "_selected_action": [j.pk for j in jobs]},
        follow=True,
    )
    assert messages_of(resp) == [
        "Retry failed: 1 done, 2 skipped (2 ready: only failed tasks are retried)."
    ]
    assert sorted(Job.objects.values_list("status", flat=True)) == [1, 1, 1]


# -- change form --------------------------------------------------------------------


@pytest.mark.django_db
def test_change_form_shows_claim_state_read_only(admin_client):
    (doc,) = make("failed")
    url = reverse("admin:testapp_document_change", args=[doc.pk])
    resp = admin_client.get(url)
    html = resp.content.decode()
    form_fields = set(resp.context["adminform"].form.fields)
    for name in ("status", "version", "locked_until", "locked_by", "attempts", "last_error"):
        assert name not in form_fields
    assert 'name="status"' not in html
    assert "Traceback (most recent call last):\n  ...\nValueError: bad page 7" in html
    assert "taskclaim-badge taskclaim-failed" in html
    fieldsets = resp.context["adminform"].fieldsets
    assert [name for name, _ in fieldsets] == [None, "Task"]
    assert "title" in fieldsets[0][1]["fields"]
    assert {"status_badge", "version", "attempts", "error_details", "run_after"} <= set(
        fieldsets[1][1]["fields"]
    )


@pytest.mark.django_db
def test_saving_a_held_row_keeps_the_claim(admin_client):
    Document.objects.create(title="before")
    (task,) = Document.objects.claim(1, worker="w1")
    url = reverse("admin:testapp_document_change", args=[task.pk])
    data = {"title": "edited", "kind": "k", "payload": "{}", "result": "", "priority": "0"}
    # a forged status field is ignored: it is not part of the form
    resp = admin_client.post(url, {**data, "status": "done", "attempts": "0"})
    assert resp.status_code == 302, resp.content.decode()[:2000]
    row = Document.objects.get(pk=task.pk)
    assert (row.title, row.status, row.version, row.locked_by) == (
        "edited",
        "processing",
        task.version,
        "w1",
    )
    task.complete(result="ok")  # the holder is not disturbed by the edit
    row.refresh_from_db()
    assert (row.status, row.result, row.title) == ("done", "ok", "edited")


# -- actions --------------------------------------------------------------------------


@pytest.mark.django_db
def test_requeue_action(admin_client):
    failed = make("failed", 2)
    cancelled = make("cancelled", 1)
    done = make("done", 1)
    ready = make("ready", 1)
    held = make("processing", 1)
    resp = run_action(admin_client, "taskclaim_requeue", failed + cancelled + done + ready + held)
    assert messages_of(resp) == [
        "Requeue: 4 done, 2 skipped (1 processing, 1 ready: "
        "only failed, cancelled or done tasks can be requeued)."
    ]
    assert states()["ready"] == 5
    row = Document.objects.get(pk=failed[0].pk)
    assert (row.attempts, row.finished_at, row.version) == (0, None, failed[0].version + 1)
    assert Document.objects.get(pk=held[0].pk).status == "processing"


@pytest.mark.django_db
def test_retry_failed_action(admin_client):
    failed = make("failed", 3)
    done = make("done", 2)
    resp = run_action(admin_client, "taskclaim_retry_failed", failed + done)
    assert messages_of(resp) == [
        "Retry failed: 3 done, 2 skipped (2 done: only failed tasks are retried)."
    ]
    assert states()["ready"] == 3
    assert states()["done"] == 2


@pytest.mark.django_db
def test_cancel_action(admin_client):
    ready = make("ready", 2)
    held = make("processing", 1)
    done = make("done", 1)
    resp = run_action(admin_client, "taskclaim_cancel", ready + held + done)
    assert messages_of(resp) == [
        "Cancel: 3 done, 1 skipped (1 done: only ready or processing tasks can be cancelled)."
    ]
    assert states()["cancelled"] == 3
    assert Document.objects.get(pk=held[0].pk).finished_at is not None


@pytest.mark.django_db
def test_release_action(admin_client):
    held = make("processing", 2)
    ready = make("ready", 1)
    resp = run_action(admin_client, "taskclaim_release", held + ready)
    assert messages_of(resp) == [
        "Release lease: 2 done, 1 skipped (1 ready: only processing tasks hold a lease)."
    ]
    row = Document.objects.get(pk=held[0].pk)
    assert (row.status, row.version) == ("ready", held[0].version + 1)
    assert row.locked_until is not None  # kept: the next claim sees the row as recovered


@pytest.mark.django_db
def test_reap_action(admin_client):
    held = make("processing", 3)
    expire(held[0], held[1])
    Document.objects.filter(pk=held[1].pk).update(attempts=99)  # retry budget spent
    done = make("done", 1)
    resp = run_action(admin_client, "taskclaim_reap", held + done)
    assert messages_of(resp) == [
        "Reap now: 2 done, 2 skipped (1 with a running lease, 1 done: "
        "only processing tasks with an expired lease are reaped)."
    ]
    got = {d.pk: d for d in Document.objects.all()}
    assert got[held[0].pk].status == "ready"
    assert got[held[1].pk].status == "failed"
    assert got[held[2].pk].status == "processing"  # its lease still runs
    assert "lease expired" in got[held[0].pk].last_error


@pytest.mark.django_db
def test_action_with_nothing_legal_reports_skips(admin_client):
    ready = make("ready", 2)
    resp = run_action(admin_client, "taskclaim_release", ready)
    assert messages_of(resp) == [
        "Release lease: 0 done, 2 skipped (2 ready: only processing tasks hold a lease)."
    ]
    assert states()["ready"] == 2


@pytest.mark.slow
@pytest.mark.django_db
def test_select_all_works_in_bounded_batches_without_loading_rows(admin_client, monkeypatch):
    # What is checked (no row instantiated, n // batch UPDATEs, every SELECT bounded) does
    # not depend on the size once it spans several batches.
    n = 20_000
    batch = 5_000
    monkeypatch.setattr(DocumentAdmin, "claim_action_batch_size", batch)
    for start in range(0, n, 10_000):
        Document.objects.bulk_create(
            [Document(status="failed") for _ in range(min(10_000, n - start))], batch_size=5_000
        )
    make("ready", 3)
    loaded = []

    def count_loaded(sender, **kwargs):
        loaded.append(1)

    statements: list[str] = []

    def record(execute, sql, params, many, context):
        statements.append(sql)
        return execute(sql, params, many, context)

    post_init.connect(count_loaded, sender=Document)
    try:
        visible = list(Document.objects.order_by("-pk").values_list("pk", flat=True)[:1])
        with connection.execute_wrapper(record):
            resp = admin_client.post(
                reverse(CHANGELIST),
                {
                    "action": "taskclaim_retry_failed",
                    "index": 0,
                    "select_across": "1",
                    "_selected_action": visible,
                },
            )
    finally:
        post_init.disconnect(count_loaded, sender=Document)
    assert resp.status_code == 302
    assert len(loaded) == 0  # no row was instantiated
    resp = admin_client.get(resp["Location"])
    assert messages_of(resp) == [
        f"Retry failed: {n} done, 3 skipped (3 ready: only failed tasks are retried)."
    ]
    assert states()["ready"] == n + 3
    updates = [q for q in statements if q.lstrip().upper().startswith("UPDATE")]
    assert len(updates) == n // batch
    # every SELECT of the action is bounded by a LIMIT (or is an aggregate)
    for q in statements:
        sql = q.upper()
        row_select = sql.lstrip().startswith("SELECT") and "COUNT(" not in sql
        if row_select and "TESTAPP_DOCUMENT" in sql and "DJANGO_" not in sql:
            assert f"LIMIT {batch}" in sql, sql[:300]


# -- permissions and CSRF ----------------------------------------------------------------


@pytest.mark.django_db
def test_user_without_change_permission_cannot_run_any_action(client, viewer):
    failed = make("failed", 2)
    held = make("processing", 1)
    expire(held[0])
    before = list(Document.objects.order_by("pk").values_list("pk", "status", "version"))
    client.force_login(viewer)
    resp = client.get(reverse(CHANGELIST))
    assert resp.status_code == 200
    html = resp.content.decode()
    for action in ACTIONS:
        assert f'value="{action}"' not in html
        for resp in (
            run_action(client, action, failed + held),
            run_action(client, action, select_across=True),
        ):
            # the changelist offers no action at all to this user: the forged POST
            # is not dispatched and nothing reports work done
            assert resp.status_code == 200
            assert not any("done" in m for m in messages_of(resp))
    after = list(Document.objects.order_by("pk").values_list("pk", "status", "version"))
    assert after == before


@pytest.mark.django_db
def test_forged_action_is_refused_when_other_actions_exist(client, viewer):
    """With the delete permission the action form exists; ours are still refused."""
    viewer.user_permissions.add(Permission.objects.get(codename="delete_document"))
    failed = make("failed", 2)
    client.force_login(viewer)
    html = client.get(reverse(CHANGELIST)).content.decode()
    assert 'value="delete_selected"' in html
    for action in ACTIONS:
        assert f'value="{action}"' not in html
        resp = run_action(client, action, failed)
        assert messages_of(resp) == ["No action selected."]
    assert states()["failed"] == 2
    assert set(Document.objects.values_list("version", flat=True)) == {failed[0].version}


@pytest.mark.django_db
def test_action_method_checks_permission_itself(rf, viewer):
    from django.contrib import admin

    make("failed", 1)
    request = rf.post("/")
    request.user = viewer
    model_admin = admin.site._registry[Document]
    with pytest.raises(Exception) as err:
        model_admin.taskclaim_retry_failed(request, Document.objects.all())
    assert type(err.value).__name__ == "PermissionDenied"
    assert states()["failed"] == 1


@pytest.mark.django_db
def test_user_with_change_permission_can_run_actions(client, editor):
    failed = make("failed", 2)
    client.force_login(editor)
    resp = run_action(client, "taskclaim_retry_failed", failed)
    assert messages_of(resp) == ["Retry failed: 2 done, 0 skipped."]
    assert states()["ready"] == 2


@pytest.mark.django_db
def test_csrf_is_enforced_on_actions(admin_user):
    failed = make("failed", 2)
    client = Client(enforce_csrf_checks=True)
    client.force_login(admin_user)
    data = {
        "action": "taskclaim_retry_failed",
        "index": 0,
        "_selected_action": [d.pk for d in failed],
    }
    resp = client.post(reverse(CHANGELIST), data)
    assert resp.status_code == 403
    assert states()["failed"] == 2
    page = client.get(reverse(CHANGELIST))
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.content.decode())
    assert token
    resp = client.post(
        reverse(CHANGELIST), {**data, "csrfmiddlewaretoken": token.group(1)}, follow=True
    )
    assert messages_of(resp) == ["Retry failed: 2 done, 0 skipped."]
    assert states()["ready"] == 2


# -- fencing against a live holder ---------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("action", ["taskclaim_release", "taskclaim_cancel"])
def test_action_on_a_held_row_fences_the_holder(admin_client, action):
    Document.objects.create(title="held")
    (task,) = Document.objects.claim(1, worker="w1")
    resp = run_action(admin_client, action, [task])
    assert "1 done, 0 skipped" in messages_of(resp)[0]
    after_action = Document.objects.get(pk=task.pk)
    assert after_action.version == task.version + 1
    with pytest.raises(ClaimLost):
        task.complete(result="late result")
    with pytest.raises(ClaimLost), task.fenced():
        pass
    row = Document.objects.get(pk=task.pk)
    assert (row.status, row.result, row.version) == (
        after_action.status,
        "",
        after_action.version,
    )


@pytest.mark.django_db
@pytest.mark.parametrize(
    "action", ["taskclaim_requeue", "taskclaim_retry_failed", "taskclaim_reap"]
)
def test_illegal_action_leaves_a_held_row_to_its_holder(admin_client, action):
    Document.objects.create(title="held")
    (task,) = Document.objects.claim(1, worker="w1")
    resp = run_action(admin_client, action, [task])
    assert "0 done, 1 skipped" in messages_of(resp)[0]
    task.complete(result="ok")
    row = Document.objects.get(pk=task.pk)
    assert (row.status, row.result) == ("done", "ok")


# -- dashboard and the app's own models ------------------------------------------------------


@pytest.fixture
def workers():
    live = WorkerProcess.objects.create(
        worker_id="host-a:101",
        hostname="host-a",
        pid=101,
        concurrency=4,
        processed=17,
        model_labels=["testapp.Document"],
    )
    silent = WorkerProcess.objects.create(worker_id="host-b:202", hostname="host-b", pid=202)
    WorkerProcess.objects.filter(pk=silent.pk).update(last_seen=DbNow() - timedelta(hours=1))
    stopped = WorkerProcess.objects.create(worker_id="host-c:303", hostname="host-c", pid=303)
    WorkerProcess.objects.filter(pk=stopped.pk).update(stopped_at=DbNow())
    return live, silent, stopped


@pytest.mark.django_db
def test_dashboard_shows_every_claimable_model_and_live_workers(admin_client, workers):
    make("ready", 2)
    held = make("processing", 1)
    expire(*held)
    make("done", 3)
    old = make("done", 1)
    Document.objects.filter(pk=old[0].pk).update(finished_at=DbNow() - timedelta(minutes=30))
    Job.objects.create(name="j")
    resp = admin_client.get(reverse("admin:taskclaim_dashboard"))
    assert resp.status_code == 200
    rows = {r["label"]: r for r in resp.context["taskclaim_rows"]}
    doc = rows["testapp.Document"]
    assert {c["state"]: c["count"] for c in doc["cells"]} == {
        "ready": 2,
        "processing": 1,
        "done": 4,
        "failed": 0,
        "cancelled": 0,
        "waiting": 0,
    }
    assert (doc["expired"], doc["done_5"], doc["done_60"]) == (1, 3, 4)
    assert doc["oldest_ready"] != "—"
    job = rows["testapp.Job"]
    assert {c["state"]: c["count"] for c in job["cells"]}["ready"] == 1
    assert job["done_5"] is None  # Job has no finished_at
    assert [w["worker_id"] for w in resp.context["taskclaim_workers"]] == ["host-a:101"]
    html = resp.content.decode()
    assert 'data-worker="host-a:101"' in html
    assert "host-b:202" not in html
    assert reverse(CHANGELIST) + "?taskclaim_status=ready" in html
    assert "parked for an event" not in html


@pytest.mark.django_db
def test_dashboard_counts_rows_parked_for_an_event_under_ready(admin_client):
    from django_taskclaim.models import TaskEventWait

    rows = make("ready", 3)
    for row in rows[:2]:
        TaskEventWait.objects.create(
            name=f"approved:{row.pk}",
            task_model="testapp.Document",
            task_pk=str(row.pk),
            deadline=DbNow() + timedelta(hours=1),
        )
    html = admin_client.get(reverse("admin:taskclaim_dashboard")).content.decode()
    assert '<small class="taskclaim-muted" data-parked="2">2 parked for events</small>' in html


@pytest.mark.django_db
def test_dashboard_is_linked_from_the_admin_index(admin_client, workers):
    make("failed", 2)
    index = admin_client.get(reverse("admin:index")).content.decode()
    app_url = reverse("admin:app_list", kwargs={"app_label": "taskclaim"})
    assert f'href="{app_url}"' in index
    app_index = admin_client.get(app_url).content.decode()
    assert reverse("admin:taskclaim_dashboard") in app_index
    assert 'id="taskclaim-queues"' in app_index
    assert 'data-worker="host-a:101"' in app_index
    changelist = admin_client.get(reverse(CHANGELIST)).content.decode()
    assert reverse("admin:taskclaim_dashboard") in changelist


@pytest.mark.django_db
def test_dashboard_respects_permissions(client, viewer, django_user_model):
    make("ready", 1)
    Job.objects.create(name="j")
    client.force_login(viewer)
    resp = client.get(reverse("admin:taskclaim_dashboard"))
    assert [r["label"] for r in resp.context["taskclaim_rows"]] == ["testapp.Document"]
    plain = django_user_model.objects.create_user("plain", password="pw")
    client.force_login(plain)
    resp = client.get(reverse("admin:taskclaim_dashboard"))
    assert resp.status_code == 302
    assert "/login/" in resp["Location"]


@pytest.mark.django_db
def test_worker_and_lease_admin(admin_client, workers):
    Lease.objects.create(
        key="nightly-report", owner="host-a:101", locked_until=DbNow() + timedelta(minutes=5)
    )
    Lease.objects.create(key="old", owner="host-b:202", locked_until=DbNow() - timedelta(minutes=5))
    resp = admin_client.get(reverse("admin:taskclaim_workerprocess_changelist"))
    html = resp.content.decode()
    assert "host-a:101" in html
    assert "taskclaim-badge taskclaim-done" in html
    assert "taskclaim-badge taskclaim-failed" in html  # silent
    resp = admin_client.get(reverse("admin:taskclaim_workerprocess_changelist") + "?alive=live")
    assert [w.worker_id for w in resp.context["cl"].result_list] == ["host-a:101"]
    resp = admin_client.get(reverse("admin:taskclaim_lease_changelist"))
    html = resp.content.decode()
    assert "nightly-report" in html
    assert "expired" in html
    lease = Lease.objects.get(key="nightly-report")
    resp = admin_client.post(
        reverse("admin:taskclaim_lease_change", args=[lease.pk]), {"owner": "me"}
    )
    assert resp.status_code == 403  # read-only: written by the library only
    assert 'value="delete_selected"' not in html  # deleting would restart the token


@pytest.mark.django_db(transaction=True)
def test_break_lease_action_fences_the_holder(admin_client):
    from django_taskclaim.locks import LeaseLock

    lock = LeaseLock("nightly-report", ttl=300, owner="host-a:101")
    assert lock.acquire()
    Lease.objects.create(key="old", owner="x", locked_until=DbNow() - timedelta(minutes=1))
    token = lock.token
    resp = admin_client.post(
        reverse("admin:taskclaim_lease_changelist"),
        {
            "action": "break_leases",
            "index": 0,
            "_selected_action": list(Lease.objects.values_list("pk", flat=True)),
        },
        follow=True,
    )
    assert messages_of(resp) == ["Break leases: 1 done, 1 skipped (already expired)."]
    row = Lease.objects.get(key="nightly-report")
    assert row.token == token + 1
    assert lock.renew() is False  # the holder learns it lost the lock
    other = LeaseLock("nightly-report", ttl=300, owner="host-b:202")
    assert other.acquire()
    assert other.token == token + 2


# -- one rule per figure --------------------------------------------------------------------


@pytest.mark.django_db
def test_rows_with_an_unmapped_status_are_counted_alike_everywhere(admin_client):
    """A stored status no state maps is "unknown" to stats(), the summary, the dashboard
    and the action report alike, so each of their totals is the number of rows."""
    make("failed", 2)
    make("ready", 1)
    (odd,) = make("ready", 1)
    Document.objects.filter(pk=odd.pk).update(status="legacy")
    assert states() == {
        "ready": 1,
        "processing": 0,
        "done": 0,
        "failed": 2,
        "cancelled": 0,
        "waiting": 0,
        "unknown": 1,
        "expired": 0,
    }
    resp = admin_client.get(reverse(CHANGELIST))
    summary = resp.context["taskclaim_summary"]["stats"]
    assert (summary.counts["unknown"], summary.total) == (1, 4)
    # shown, without a link to a filter that has no such choice
    assert '<span class="taskclaim-summary-item" data-state="unknown" data-count="1">' in (
        resp.content.decode()
    )
    rows = admin_client.get(reverse("admin:taskclaim_dashboard")).context["taskclaim_rows"]
    assert {r["label"]: r["total"] for r in rows}["testapp.Document"] == 4
    resp = run_action(admin_client, "taskclaim_retry_failed", select_across=True)
    assert messages_of(resp) == [
        "Retry failed: 2 done, 2 skipped (1 ready, 1 unknown: only failed tasks are retried)."
    ]


@pytest.mark.django_db
def test_a_row_failing_between_the_count_and_the_update_is_no_negative_skip(admin_client):
    """A worker fails one more row of a "select all" after the action counted the
    states and before its UPDATE: the report (and the history) says so, never
    "-1 skipped (: …)"."""
    make("failed", 3)
    (late,) = make("processing")
    fired: list[str] = []

    def fail_one_after_the_count(execute, sql, params, many, context):
        result = execute(sql, params, many, context)
        if not fired and "GROUP BY" in sql.upper() and Document._meta.db_table in sql:
            fired.append(sql)
            # what a worker's fail() commits meanwhile
            Document.objects.filter(pk=late.pk).update(status="failed", finished_at=DbNow())
        return result

    with connection.execute_wrapper(fail_one_after_the_count):
        # "select all" of the changelist filtered to the failed rows
        resp = admin_client.post(
            reverse(CHANGELIST) + "?taskclaim_status=failed",
            {
                "action": "taskclaim_retry_failed",
                "index": 0,
                "select_across": "1",
                "_selected_action": [str(Document.objects.filter(status="failed").first().pk)],
            },
            follow=True,
        )
    assert fired
    text = "Retry failed: 4 done (1 of them changed state meanwhile), 0 skipped."
    assert messages_of(resp) == [text]
    assert states()["ready"] == 4
    entry = LogEntry.objects.get(content_type__model="document")
    assert entry.change_message == text


@pytest.mark.django_db
def test_oldest_ready_ages_from_the_retry_not_from_the_creation(admin_client):
    """Retrying rows that failed days ago must not fire the backlog alert at once: the
    changelist, the dashboard, taskclaim_stats' figures and the gauge age a ready row
    from when it became ready."""
    old = make("failed", 2)
    Document.objects.filter(pk__in=[d.pk for d in old]).update(
        created_at=DbNow() - timedelta(days=3)
    )
    resp = run_action(admin_client, "taskclaim_retry_failed", old)
    assert messages_of(resp) == ["Retry failed: 2 done, 0 skipped."]
    summary = admin_client.get(reverse(CHANGELIST)).context["taskclaim_summary"]
    assert summary["stats"].oldest_ready_age < 600
    rows = admin_client.get(reverse("admin:taskclaim_dashboard")).context["taskclaim_rows"]
    (row,) = [r for r in rows if r["label"] == "testapp.Document"]
    assert row["oldest_ready"].endswith("s")
    assert "m" not in row["oldest_ready"]
    (gauge,) = queue_gauges(Document, db_now(), using="default")
    assert gauge.ready == 2
    assert gauge.oldest_ready_age < 600
    # a row never retried still ages from its creation
    (fresh,) = make("ready")
    Document.objects.filter(pk=fresh.pk).update(created_at=DbNow() - timedelta(hours=2))
    (gauge,) = queue_gauges(Document, db_now(), using="default")
    assert 7100 < gauge.oldest_ready_age < 7300


@pytest.mark.django_db
def test_the_changelist_counts_no_done_in_the_last_minutes_it_does_not_show(admin_client):
    """The "done in the last 5 / 60 minutes" figures are the dashboard's: the
    changelist's summary never shows them, so it must not count them (two scans of the
    finished rows at 1 M rows, about 250 ms each)."""
    make("done", 3)
    make("failed", 1)
    make("ready", 2)
    # the workers' history exists: the charts read it, not the rows' finished_at
    TaskHistory.objects.create(model="testapp.Document", queue="", minute=db_now(), done=3)
    with CaptureQueriesContext(connection) as queries:
        resp = admin_client.get(reverse(CHANGELIST))
    assert resp.status_code == 200
    summary = resp.context["taskclaim_summary"]
    assert {i["state"]: i["count"] for i in summary["items"]}["done"] == 3
    on_finished = [
        q["sql"]
        for q in queries.captured_queries
        if Document._meta.db_table in q["sql"] and '"finished_at" >=' in q["sql"]
    ]
    assert on_finished == []
    assert summary["stats"].done_last == {}
    # the charts' ready depth is one count, not a row back per ready row
    per_row = [
        q["sql"]
        for q in queries.captured_queries
        if f'GROUP BY "{Document._meta.db_table}"."id"' in q["sql"]
    ]
    assert per_row == []
    assert resp.context["taskclaim_charts"][0].series[0].ready_now == 2
    # the dashboard still has them
    rows = admin_client.get(reverse("admin:taskclaim_dashboard")).context["taskclaim_rows"]
    (row,) = [r for r in rows if r["label"] == "testapp.Document"]
    assert (row["done_5"], row["done_60"]) == (3, 3)


@pytest.mark.django_db
def test_lease_column_says_expired_exactly_when_a_reap_would_take_the_row(rf, admin_user):
    """A lease ending exactly at the database's now is still running for the reaper
    (``locked_until < now``), the lease filter and the column alike."""
    (held,) = make("processing")
    model_admin = admin.site._registry[Document]
    request = rf.get("/")
    request.user = admin_user
    row = model_admin.get_queryset(request).get(pk=held.pk)
    now = row.taskclaim_db_now
    row.locked_until = now
    assert not lease_ended(row.locked_until, now)
    assert model_admin.lease_remaining(row) == "0s"
    row.locked_until = now - timedelta(microseconds=1)
    assert lease_ended(row.locked_until, now)
    assert "taskclaim-expired" in model_admin.lease_remaining(row)
    Document.objects.filter(pk=held.pk).update(locked_until=DbNow() - timedelta(microseconds=1))
    assert list(Document.objects.expired().values_list("pk", flat=True)) == [held.pk]


@pytest.mark.django_db
def test_live_and_silent_workers_are_one_rule(admin_client, workers):
    """The dashboard's live workers, the registry's silent ones and the admin's filter
    and badges split the workers that are not stopped the same way."""
    assert [w.worker_id for w in live_workers()] == ["host-a:101"]
    assert silent_workers() == ["host-b:202"]
    url = reverse("admin:taskclaim_workerprocess_changelist")
    for choice, expected in (
        ("live", "host-a:101"),
        ("silent", "host-b:202"),
        ("stopped", "host-c:303"),
    ):
        resp = admin_client.get(f"{url}?alive={choice}")
        assert [w.worker_id for w in resp.context["cl"].result_list] == [expected]
        badge_state = {"live": "done", "silent": "failed", "stopped": "cancelled"}[choice]
        assert f"taskclaim-badge taskclaim-{badge_state}" in resp.content.decode()


STYLESHEET_HREF = 'href="/static/django_taskclaim/admin.css"'
#: A tag of ours with a style attribute, or a <style> element styling our classes.
INLINE_STYLE = re.compile(r"<[^>]*taskclaim[^>]*\sstyle=|<style[^>]*>[^<]*taskclaim")


@pytest.mark.slow
@pytest.mark.django_db
def test_admin_pages_style_from_the_static_stylesheet_only(admin_client, workers):
    """Every page of ours links the app's stylesheet once and carries no inline CSS (a
    Content-Security-Policy without 'unsafe-inline' styles keeps the pages intact)."""
    (failed,) = make("failed")
    expire(*make("processing"))
    Lease.objects.create(key="k", owner="o", locked_until=DbNow() + timedelta(minutes=5))
    assert finders.find("django_taskclaim/admin.css")
    for url in (
        reverse(CHANGELIST),
        reverse("admin:testapp_document_change", args=[failed.pk]),
        reverse("admin:taskclaim_dashboard"),
        reverse("admin:app_list", kwargs={"app_label": "taskclaim"}),
        reverse("admin:taskclaim_workerprocess_changelist"),
        reverse("admin:taskclaim_lease_changelist"),
    ):
        html = admin_client.get(url).content.decode()
        assert html.count(STYLESHEET_HREF) == 1, url
        assert "taskclaim-badge" in html or "taskclaim-queues" in html, url
        assert not INLINE_STYLE.search(html), (url, INLINE_STYLE.search(html))


# -- a custom status field name -------------------------------------------------------------
# A claimable model whose status column is ``state`` (``ClaimMeta.status_field``), defined in
# an isolated app registry (no migration, invisible to the rest of the suite) and served by
# an admin site of its own; its table exists only while a test that uses it runs.

with isolate_apps("tests.support.testapp"):

    class StateTicket(ClaimFieldsMixin, ClaimableMixin, models.Model):
        title = models.CharField(max_length=50)
        state = models.CharField(max_length=16, default="ready")

        class ClaimMeta:
            status_field = "state"
            lease = 30

        class Meta:
            app_label = "testapp"
            db_table = "testapp_state_ticket_admin"


class StateTicketAdmin(ClaimableAdminMixin, admin.ModelAdmin):
    list_display = ["title"]


state_site = admin.AdminSite(name="state_admin")
state_site.register(StateTicket, StateTicketAdmin)
#: URLconf of the tests marked ``@pytest.mark.urls("tests.admin.test_admin")``.
urlpatterns = [path("admin/", admin.site.urls), path("state-admin/", state_site.urls)]


@pytest.fixture
def state_tickets(transactional_db):
    """The ``StateTicket`` table with three rows in different states, dropped afterwards."""
    with connection.schema_editor() as editor:
        editor.create_model(StateTicket)
    try:
        for title, state in (("t1", "ready"), ("t2", "done"), ("t3", "failed")):
            StateTicket.objects.create(title=title, state=state)
        yield
    finally:
        with connection.schema_editor() as editor:
            editor.delete_model(StateTicket)


@pytest.mark.urls("tests.admin.test_admin")
def test_status_column_orders_by_a_custom_status_field(admin_client, state_tickets):
    url = reverse("admin:testapp_stateticket_changelist", current_app="state_admin")
    resp = admin_client.get(url)
    assert resp.status_code == 200
    column = resp.context["cl"].list_display.index("status_badge")
    assert 'class="sortable column-status_badge' in resp.content.decode()
    resp = admin_client.get(f"{url}?o={column}")
    assert resp.status_code == 200
    assert [t.title for t in resp.context["cl"].result_list] == ["t2", "t3", "t1"]
    resp = admin_client.get(f"{url}?o=-{column}")
    assert resp.status_code == 200
    assert [t.title for t in resp.context["cl"].result_list] == ["t1", "t3", "t2"]
    assert resp.context["taskclaim_summary"]["stats"].counts["done"] == 1


@pytest.mark.django_db
def test_status_column_of_the_default_status_field_still_orders_by_it(admin_client):
    make("failed", 1)
    make("done", 1)
    make("ready", 1)
    resp = admin_client.get(reverse(CHANGELIST))
    column = resp.context["cl"].list_display.index("status_badge")
    resp = admin_client.get(f"{reverse(CHANGELIST)}?o={column}")
    assert resp.status_code == 200
    assert [d.status for d in resp.context["cl"].result_list] == ["done", "failed", "ready"]
