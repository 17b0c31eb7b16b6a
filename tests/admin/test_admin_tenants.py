"""The app's own admin controls and pages inside the rows a user may see: pause and
resume under an admin that narrows its queryset per tenant (a queue by name only with
rows of hers in it, every queue only for a user who sees every row), the paused
queues, a worker's running bodies and the periodic slots limited to the models she
may view. Posts go through Django's test client with the CSRF token a page gave."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

import pytest
from django.contrib import admin
from django.contrib.auth.models import Permission
from django.test import Client
from django.urls import path, reverse

from django_taskclaim.admin import ClaimableAdminMixin
from django_taskclaim.admin.own_models import QueuePauseAdmin
from django_taskclaim.admin.periodic import PeriodicSlotAdmin
from django_taskclaim.admin.workers import WorkerProcessAdmin
from django_taskclaim.flow.pause import is_paused, pause
from django_taskclaim.models import PeriodicSlot, QueuePause, WorkerProcess
from tests.support.flowapp.models import Errand
from tests.support.testapp.models import Document


class TenantErrandAdmin(ClaimableAdminMixin, admin.ModelAdmin):
    """Tenant 1's admin: only the errands of the queues named ``t1-…``."""

    list_display = ["queue_name"]

    def get_queryset(self, request):
        return super().get_queryset(request).filter(queue_name__startswith="t1-")


class PlainAdmin(ClaimableAdminMixin, admin.ModelAdmin):
    """Every row."""


SITE = "tenant_pause"
tenant_site = admin.AdminSite(name=SITE)
tenant_site.register(Errand, TenantErrandAdmin)
tenant_site.register(Document, PlainAdmin)
tenant_site.register(WorkerProcess, WorkerProcessAdmin)
tenant_site.register(QueuePause, QueuePauseAdmin)
tenant_site.register(PeriodicSlot, PeriodicSlotAdmin)
#: The same models, every row shown.
ALL_ROWS = "all_rows"
all_rows_site = admin.AdminSite(name=ALL_ROWS)
all_rows_site.register(Errand, PlainAdmin)
all_rows_site.register(WorkerProcess, WorkerProcessAdmin)
urlpatterns = [
    path("admin/", admin.site.urls),
    path("tenant-pause/", tenant_site.urls),
    path("all-rows/", all_rows_site.urls),
]

pytestmark = [pytest.mark.django_db, pytest.mark.urls("tests.admin.test_admin_tenants")]

ERRAND = "flowapp.Errand"


def staff(django_user_model, name: str, *codenames: str):
    user = django_user_model.objects.create_user(name, password="pw", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(codename__in=codenames))
    return user


def csrf_client(user) -> tuple[Client, str]:
    """A client that enforces CSRF, logged in as ``user``, and the token a page gave it."""
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    page = client.get(reverse("admin:flowapp_errand_changelist", current_app=SITE))
    assert page.status_code == 200
    return client, page.context["csrf_token"]


def post_pause(client: Client, token: str, queue: str, op: str = "pause", **extra):
    url = reverse("admin:taskclaim_pause", current_app=SITE)
    data = {"model": ERRAND, "queue": queue, "op": op, "csrfmiddlewaretoken": token, **extra}
    return client.post(url, data)


@pytest.fixture
def tenants():
    """Tenant 1's queue ``t1-mail`` (2 rows), tenant 2's ``t2-mail`` (3 rows)."""
    Errand.objects.bulk_create(
        [Errand(queue_name="t1-mail") for _ in range(2)]
        + [Errand(queue_name="t2-mail") for _ in range(3)]
    )


@pytest.fixture
def editor(django_user_model):
    """Tenant 1's operator: may view and change errands (model-wide permissions)."""
    return staff(django_user_model, "t1-ops", "view_errand", "change_errand", "view_queuepause")


def test_a_narrowed_user_pauses_and_resumes_only_the_queues_she_sees(tenants, editor):
    client, token = csrf_client(editor)
    assert post_pause(client, token, "queue:t2-mail").status_code == 403  # another tenant's
    assert post_pause(client, token, "queue:t9-none").status_code == 403  # no row of hers
    assert post_pause(client, token, "all").status_code == 403  # every tenant's queues
    assert not QueuePause.objects.exists()

    assert post_pause(client, token, "queue:t1-mail", reason="smtp").status_code == 302
    assert is_paused(Errand, "t1-mail")
    assert post_pause(client, token, "queue:t1-mail", "resume").status_code == 302
    assert not is_paused(Errand, "t1-mail")

    pause(Errand, "t2-mail", by="t2-ops")
    pause(Errand, by="root")
    assert post_pause(client, token, "queue:t2-mail", "resume").status_code == 403
    assert post_pause(client, token, "all", "resume").status_code == 403
    assert is_paused(Errand, "t2-mail")
    assert is_paused(Errand, None)


def test_a_superuser_under_a_narrowed_admin_is_narrowed_too(tenants, admin_user):
    client, token = csrf_client(admin_user)
    assert post_pause(client, token, "all").status_code == 403
    assert post_pause(client, token, "queue:t2-mail").status_code == 403
    assert post_pause(client, token, "queue:t1-mail").status_code == 302


def test_a_user_who_sees_every_row_pauses_every_queue(tenants, editor):
    """Where the admin does not narrow its rows the change permission is all it takes."""
    client = Client()
    client.force_login(editor)
    url = reverse("admin:taskclaim_pause", current_app=ALL_ROWS)
    for queue in ("all", "queue:t2-mail", "queue:t9-none"):
        resp = client.post(url, {"model": ERRAND, "queue": queue, "op": "pause"})
        assert resp.status_code == 302, queue
    assert [p.queue for p in QueuePause.objects.order_by("queue")] == ["", "t2-mail", "t9-none"]


def test_the_pages_show_a_narrowed_user_only_the_pauses_of_her_queues(tenants, editor):
    pause(Errand, "t2-mail", by="t2-ops", reason="tenant two's secret")
    pause(Errand, "t1-mail", by="t1-ops", reason="ours")
    client, _token = csrf_client(editor)
    page = client.get(reverse("admin:flowapp_errand_changelist", current_app=SITE))
    form = page.content.decode().split('id="taskclaim-pause"')[1].split("</form>")[0]
    assert '<option value="queue:t1-mail">' in form
    assert "t2-mail" not in form
    assert '<option value="all">' not in form  # every queue: not hers to pause
    html = client.get(reverse("admin:taskclaim_dashboard", current_app=SITE)).content.decode()
    assert "t1-mail" in html
    assert "t2-mail" not in html
    assert "tenant two&#x27;s secret" not in html
    assert 'id="taskclaim-pause-controls"' not in html  # the every-queue form
    listed = client.get(reverse("admin:taskclaim_queuepause_changelist", current_app=SITE))
    assert [p.queue for p in listed.context["cl"].result_list] == ["t1-mail"]
    pause(Errand, by="root", reason="maintenance")  # the whole model: hers to know
    html = client.get(reverse("admin:taskclaim_dashboard", current_app=SITE)).content.decode()
    assert "maintenance" in html


def test_an_admin_pause_of_a_queue_with_a_newline_is_logged_on_one_line(editor, caplog):
    forged = "t1-a\nINFO django_taskclaim.admin admin resume model=flowapp.Errand queue=None"
    Errand.objects.create(queue_name=forged)
    caplog.set_level(logging.INFO, logger="django_taskclaim")
    client, token = csrf_client(editor)
    assert post_pause(client, token, f"queue:{forged}", reason="a\nb").status_code == 302
    assert is_paused(Errand, forged)
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("django_taskclaim")]
    assert len(lines) == 2, lines  # flow.pause's and the admin's
    for line in lines:
        assert "\n" not in line, line
    assert any(line.startswith("admin pause model=flowapp.Errand queue='t1-a\\n") for line in lines)


def test_a_workers_page_names_the_running_rows_of_viewable_models_only(django_user_model):
    errand = Errand.objects.create(queue_name="t1-mail")
    doc = Document.objects.create(title="secret")
    running = [
        {"model": ERRAND, "pk": str(errand.pk), "age": 3.0},
        {"model": "testapp.Document", "pk": str(doc.pk), "age": 2.0},
    ]
    row = WorkerProcess.objects.create(
        worker_id="h:1", hostname="h", pid=1, in_flight=2, running=running
    )
    user = staff(django_user_model, "ops", "view_workerprocess", "view_errand")
    client = Client()
    client.force_login(user)
    url = reverse("admin:taskclaim_workerprocess_change", args=[row.pk], current_app=SITE)
    html = client.get(url).content.decode()
    assert f"flowapp.Errand #{errand.pk}" in html
    assert "testapp.Document" not in html
    assert "and 1 of models you may not view" in html
    both = staff(django_user_model, "both", "view_workerprocess", "view_errand", "view_document")
    client.force_login(both)
    assert f"testapp.Document #{doc.pk}" in client.get(url).content.decode()


def test_the_periodic_slots_page_lists_the_slots_of_viewable_models_only(django_user_model):
    slot = datetime(2026, 1, 1, tzinfo=UTC)
    PeriodicSlot.objects.create(schedule="errands", slot=slot, target=ERRAND, target_pk="1")
    PeriodicSlot.objects.create(
        schedule="documents", slot=slot, target="testapp.Document", target_pk="2"
    )
    PeriodicSlot.objects.create(schedule="nothing", slot=slot)  # created no row
    user = staff(django_user_model, "ops", "view_periodicslot", "view_errand")
    client = Client()
    client.force_login(user)
    page = client.get(reverse("admin:taskclaim_periodicslot_changelist", current_app=SITE))
    assert page.status_code == 200
    assert sorted(s.schedule for s in page.context["cl"].result_list) == ["errands", "nothing"]
    assert all(r["target"] != "testapp.Document" for r in page.context["taskclaim_schedules"])
