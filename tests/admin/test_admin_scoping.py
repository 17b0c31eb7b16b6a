"""Admin figures follow ``ModelAdmin.get_queryset(request)``: a per-tenant admin that narrows
its queryset never shows the counts of rows it cannot see, on the changelist summary, the
dashboard page or the app index, and a model its admin hides is left off the dashboard."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib import admin
from django.urls import path, reverse

from django_taskclaim.admin import ClaimableAdminMixin
from django_taskclaim.admin.workers import WorkerProcessAdmin
from django_taskclaim.db import DbNow
from django_taskclaim.models import WorkerProcess
from tests.support.testapp.models import Document, Job

pytestmark = [pytest.mark.django_db, pytest.mark.urls("tests.admin.test_admin_scoping")]

SITE = "tenant_admin"


class MineOnlyDocumentAdmin(ClaimableAdminMixin, admin.ModelAdmin):
    """A tenant's admin: only the documents of kind ``mine``."""

    list_display = ["title", "kind"]

    def get_queryset(self, request):
        return super().get_queryset(request).filter(kind="mine")


class HiddenJobAdmin(ClaimableAdminMixin, admin.ModelAdmin):
    """An admin that lets nobody see its rows, whatever their permissions."""

    def has_view_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False


tenant_site = admin.AdminSite(name=SITE)
tenant_site.register(Document, MineOnlyDocumentAdmin)
tenant_site.register(Job, HiddenJobAdmin)
tenant_site.register(WorkerProcess, WorkerProcessAdmin)
urlpatterns = [path("admin/", admin.site.urls), path("tenant-admin/", tenant_site.urls)]


def put(kind: str, state: str, n: int, *, expired: bool = False) -> None:
    docs = Document.objects.bulk_create(
        [Document(title=f"{kind}-{state}-{i}", kind=kind) for i in range(n)]
    )
    fields: dict = {"status": state}
    if state == "processing":
        lease = timedelta(seconds=-5 if expired else 300)
        fields.update(locked_until=DbNow() + lease, locked_by="w", attempts=1)
    if state in ("done", "failed", "cancelled"):
        fields.update(finished_at=DbNow(), attempts=1)
    Document.objects.filter(pk__in=[d.pk for d in docs]).update(**fields)


@pytest.fixture
def tenants():
    """Mine: 2 ready, 1 done. Others: 5 ready, 3 failed, 2 processing with lapsed leases."""
    put("mine", "ready", 2)
    put("mine", "done", 1)
    put("other", "ready", 5)
    put("other", "failed", 3)
    put("other", "processing", 2, expired=True)
    Job.objects.create(name="j")


MINE = {"ready": 2, "processing": 0, "done": 1, "failed": 0, "cancelled": 0, "waiting": 0}


def test_changelist_summary_counts_only_what_the_admin_queryset_sees(admin_client, tenants):
    url = reverse("admin:testapp_document_changelist", current_app=SITE)
    resp = admin_client.get(url)
    assert resp.status_code == 200
    assert resp.context["cl"].result_count == 3
    stats = resp.context["taskclaim_summary"]["stats"]
    assert stats.counts == MINE
    assert (stats.expired, stats.total) == (0, 3)
    html = resp.content.decode()
    assert 'data-state="ready" data-count="2"' in html
    assert 'data-state="failed" data-count="0"' in html


def test_dashboard_counts_only_what_each_model_admin_queryset_sees(admin_client, tenants):
    resp = admin_client.get(reverse("admin:taskclaim_dashboard", current_app=SITE))
    assert resp.status_code == 200
    rows = {r["label"]: r for r in resp.context["taskclaim_rows"]}
    doc = rows["testapp.Document"]
    assert {c["state"]: c["count"] for c in doc["cells"]} == MINE
    assert (doc["total"], doc["expired"], doc["done_5"]) == (3, 0, 1)
    assert doc["url"] == reverse("admin:testapp_document_changelist", current_app=SITE)
    html = resp.content.decode()
    assert 'data-state="failed" data-count="0"' in html
    assert 'data-state="expired" data-count="0"' in html
    # Job's admin refuses to show it, even to a superuser: it is not on the dashboard.
    assert "testapp.Job" not in rows


def test_app_index_dashboard_counts_only_what_the_admin_queryset_sees(admin_client, tenants):
    resp = admin_client.get(
        reverse("admin:app_list", kwargs={"app_label": "taskclaim"}, current_app=SITE)
    )
    assert resp.status_code == 200
    html = resp.content.decode()
    assert 'id="taskclaim-queues"' in html
    assert 'data-model="testapp.Document"' in html
    assert 'data-state="ready" data-count="2"' in html
    assert 'data-state="failed" data-count="0"' in html
    assert 'data-model="testapp.Job"' not in html


def test_default_site_still_counts_every_row(admin_client, tenants):
    resp = admin_client.get(reverse("admin:taskclaim_dashboard"))
    rows = {r["label"]: r for r in resp.context["taskclaim_rows"]}
    counts = {c["state"]: c["count"] for c in rows["testapp.Document"]["cells"]}
    assert counts == {
        "ready": 7,
        "processing": 2,
        "done": 1,
        "failed": 3,
        "cancelled": 0,
        "waiting": 0,
    }
    assert rows["testapp.Document"]["expired"] == 2
    assert "testapp.Job" in rows
