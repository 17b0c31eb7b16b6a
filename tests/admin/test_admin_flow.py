"""Operator actions where people look: the Retry / Requeue / Cancel buttons of a task's
change page (fenced on the token the page showed), Pause / Resume on the dashboard and
each claimable model's changelist (per model, and per queue where the model has one),
the paused-queue admin, permissions, CSRF and the LogEntry each change writes."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib import admin
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.auth.models import Permission
from django.contrib.contenttypes.models import ContentType
from django.test import Client
from django.urls import path, reverse

from django_taskclaim import ClaimLost
from django_taskclaim.admin import ClaimableAdminMixin
from django_taskclaim.admin.own_models import QueuePauseAdmin
from django_taskclaim.admin.workers import WorkerProcessAdmin
from django_taskclaim.db import DbNow
from django_taskclaim.flow.pause import is_paused, pause
from django_taskclaim.models import QueuePause, WorkerProcess
from tests.support.flowapp.models import Errand
from tests.support.testapp.models import Document


class ErrandAdmin(ClaimableAdminMixin, admin.ModelAdmin):
    list_display = ["queue_name"]


#: An admin site of this module's own: the queue model of the flow tests with the mixin,
#: the dashboard (served by the worker registry's admin) and the paused queues.
flow_site = admin.AdminSite(name="flow_admin")
flow_site.register(Errand, ErrandAdmin)
flow_site.register(WorkerProcess, WorkerProcessAdmin)
flow_site.register(QueuePause, QueuePauseAdmin)
#: URLconf of the tests marked ``@pytest.mark.urls("tests.admin.test_admin_flow")``.
urlpatterns = [path("admin/", admin.site.urls), path("flow-admin/", flow_site.urls)]
on_flow_site = pytest.mark.urls("tests.admin.test_admin_flow")

ERRANDS = "admin:flowapp_errand_changelist"


def make(state: str, n: int = 1) -> list[Document]:
    """``n`` documents put in ``state`` directly in the database."""
    docs = Document.objects.bulk_create([Document(title=f"{state}-{i}") for i in range(n)])
    pks = [d.pk for d in docs]
    fields: dict = {"status": state}
    if state == "processing":
        fields.update(
            locked_until=DbNow() + timedelta(seconds=300), locked_by="w-other", attempts=1
        )
    if state in ("done", "failed", "cancelled"):
        fields.update(finished_at=DbNow(), attempts=5 if state == "failed" else 1)
    Document.objects.filter(pk__in=pks).update(**fields)
    return list(Document.objects.filter(pk__in=pks).order_by("pk"))


def change_url(doc: Document) -> str:
    return reverse("admin:testapp_document_change", args=[doc.pk])


def button_url(doc: Document) -> str:
    return reverse("admin:testapp_document_taskclaim", args=[doc.pk])


def press(client: Client, doc: Document, button: str, version: int | None = None, **kw):
    """POST a task button of ``doc``'s page, with the token the page showed."""
    data = {
        "taskclaim_button": button,
        "taskclaim_version": doc.version if version is None else version,
    }
    return client.post(button_url(doc), data, **kw)


def messages_of(response) -> list[str]:
    return [str(m) for m in response.context["messages"]]


def buttons_on(html: str) -> list[str]:
    return [b for b in ("retry", "requeue", "cancel") if f'id="taskclaim-{b}"' in html]


def entries(model, **filters) -> list[LogEntry]:
    ct = ContentType.objects.get_for_model(model, for_concrete_model=False)
    return list(LogEntry.objects.filter(content_type=ct, **filters).order_by("pk"))


def staff(django_user_model, name: str, *codenames: str):
    user = django_user_model.objects.create_user(name, password="pw", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(codename__in=codenames))
    return user


def client_for(user, **kwargs) -> Client:
    client = Client(**kwargs)
    client.force_login(user)
    return client


# -- a task's change page -------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("state", "offered"),
    [
        ("failed", ["retry"]),
        ("done", ["requeue"]),
        ("cancelled", ["requeue"]),
        ("ready", ["cancel"]),
        ("processing", ["cancel"]),
    ],
)
def test_buttons_follow_the_state_and_no_save_and_add_another(admin_client, state, offered):
    (doc,) = make(state)
    resp = admin_client.get(change_url(doc))
    assert resp.status_code == 200
    html = resp.content.decode()
    assert buttons_on(html) == offered
    assert f'name="taskclaim_version" value="{doc.version}"' in html
    assert 'name="csrfmiddlewaretoken"' in html.split('id="taskclaim-task-actions"')[1]
    assert 'name="_addanother"' not in html
    assert 'name="_continue"' in html  # the rest of the submit row is kept


@pytest.mark.django_db
def test_retry_button_retries_the_row_and_logs_who_did_what(admin_client, admin_user):
    (doc,) = make("failed")
    resp = press(admin_client, doc, "retry")
    assert resp.status_code == 302
    assert resp["Location"] == change_url(doc)
    page = admin_client.get(resp["Location"])
    assert messages_of(page) == ["Retry: “failed-0” is now ready."]
    row = Document.objects.get(pk=doc.pk)
    assert (row.status, row.attempts, row.finished_at) == ("ready", 0, None)
    assert row.version == doc.version + 1
    (entry,) = entries(Document, object_id=str(doc.pk))
    assert (entry.user_id, entry.action_flag) == (admin_user.pk, CHANGE)
    assert entry.get_change_message() == "Retry: failed → ready"
    assert entry.object_repr == "failed-0"
    assert buttons_on(page.content.decode()) == ["cancel"]  # the page follows the new state


@pytest.mark.django_db
def test_requeue_and_cancel_buttons(admin_client):
    done, cancelled = make("done")[0], make("cancelled")[0]
    ready, held = make("ready")[0], make("processing")[0]
    for doc, button in ((done, "requeue"), (cancelled, "requeue")):
        assert press(admin_client, doc, button).status_code == 302
    for doc in (ready, held):
        assert press(admin_client, doc, "cancel").status_code == 302
    got = dict(Document.objects.values_list("pk", "status"))
    assert [got[d.pk] for d in (done, cancelled, ready, held)] == [
        "ready",
        "ready",
        "cancelled",
        "cancelled",
    ]
    assert len(entries(Document, object_id__isnull=False)) == 4


@pytest.mark.django_db
def test_cancel_button_fences_the_worker_holding_the_row(admin_client):
    Document.objects.create(title="held")
    (task,) = Document.objects.claim(1, worker="w1")
    page = admin_client.get(change_url(task))
    assert buttons_on(page.content.decode()) == ["cancel"]
    resp = press(admin_client, task, "cancel", follow=True)
    assert messages_of(resp) == ["Cancel task: “held” is now cancelled."]
    with pytest.raises(ClaimLost):
        task.complete(result="late")
    row = Document.objects.get(pk=task.pk)
    assert (row.status, row.result) == ("cancelled", "")


@pytest.mark.django_db
def test_row_claimed_by_a_worker_meanwhile_is_not_changed(admin_client):
    (doc,) = make("ready")
    page = admin_client.get(change_url(doc))
    assert buttons_on(page.content.decode()) == ["cancel"]  # the operator sees "ready"
    (task,) = Document.objects.filter(pk=doc.pk).claim(1, worker="w1")  # a worker, meanwhile
    resp = press(admin_client, doc, "cancel", follow=True)  # the token of the page
    assert messages_of(resp) == [
        "Cancel task: the row changed meanwhile (now processing), nothing done."
    ]
    row = Document.objects.get(pk=doc.pk)
    assert (row.status, row.version, row.locked_by) == ("processing", task.version, "w1")
    assert entries(Document) == []  # nothing done, nothing logged
    task.complete(result="ok")  # the worker keeps its claim
    assert Document.objects.get(pk=doc.pk).status == "done"


@pytest.mark.django_db
def test_retry_of_a_row_retried_and_claimed_meanwhile_is_not_repeated(admin_client):
    (doc,) = make("failed")
    Document.objects.filter(pk=doc.pk).requeue()  # another operator retried it
    (task,) = Document.objects.filter(pk=doc.pk).claim(1, worker="w1")
    task.fail(RuntimeError("again"))  # ... and it failed again: same state, new token
    resp = press(admin_client, doc, "retry", follow=True)
    assert messages_of(resp) == ["Retry: the row changed meanwhile (now failed), nothing done."]
    row = Document.objects.get(pk=doc.pk)
    assert (row.status, row.attempts) == ("failed", 1)


@pytest.mark.django_db
def test_a_button_the_state_does_not_offer_does_nothing(admin_client):
    (doc,) = make("failed")
    resp = press(admin_client, doc, "cancel", follow=True)
    assert messages_of(resp) == [
        "Cancel task: the row changed meanwhile (now failed), nothing done."
    ]
    resp = press(admin_client, doc, "delete", follow=True)
    assert messages_of(resp) == ["Unknown task action; nothing done."]
    resp = admin_client.post(button_url(doc), {"taskclaim_button": "retry"}, follow=True)
    assert messages_of(resp) == ["Retry: the page sent no claim token; nothing done."]
    assert admin_client.get(button_url(doc)).status_code == 405
    assert Document.objects.get(pk=doc.pk).status == "failed"


@pytest.mark.django_db
def test_staff_without_change_permission_sees_no_buttons_and_gets_403(django_user_model):
    viewer = client_for(staff(django_user_model, "viewer", "view_document"))
    (doc,) = make("failed")
    page = viewer.get(change_url(doc))
    assert page.status_code == 200
    html = page.content.decode()
    assert "taskclaim-task-actions" not in html
    assert buttons_on(html) == []
    assert press(viewer, doc, "retry").status_code == 403
    assert Document.objects.get(pk=doc.pk).status == "failed"
    assert entries(Document) == []


@pytest.mark.django_db
def test_buttons_need_the_csrf_token(admin_user):
    client = client_for(admin_user, enforce_csrf_checks=True)
    (doc,) = make("failed")
    assert press(client, doc, "retry").status_code == 403
    assert Document.objects.get(pk=doc.pk).status == "failed"
    page = client.get(change_url(doc))
    token = page.context["csrf_token"]
    data = {"taskclaim_button": "retry", "taskclaim_version": doc.version}
    resp = client.post(button_url(doc), {**data, "csrfmiddlewaretoken": token})
    assert resp.status_code == 302
    assert Document.objects.get(pk=doc.pk).status == "ready"


@pytest.mark.django_db
def test_changelist_action_writes_a_log_entry(admin_client, admin_user):
    failed = make("failed", 2)
    done = make("done", 1)
    data = {
        "action": "taskclaim_retry_failed",
        "index": 0,
        "_selected_action": [d.pk for d in failed + done],
    }
    admin_client.post(reverse("admin:testapp_document_changelist"), data)
    (entry,) = entries(Document)
    assert (entry.user_id, entry.object_id, entry.action_flag) == (admin_user.pk, None, CHANGE)
    assert entry.change_message == (
        "Retry failed: 2 done, 1 skipped (1 done: only failed tasks are retried)."
    )


# -- pause / resume -------------------------------------------------------------------


def errands(**per_queue: int) -> None:
    Errand.objects.bulk_create(
        [Errand(queue_name=q) for q, n in per_queue.items() for _ in range(n)]
    )


def pause_post(client: Client, model: str, queue: str, op: str, *, site="flow_admin", **extra):
    url = reverse("admin:taskclaim_pause", current_app=site)
    return client.post(url, {"model": model, "queue": queue, "op": op, **extra})


@on_flow_site
@pytest.mark.django_db(transaction=True)  # a resume reaches this process's claims on commit
def test_changelist_pauses_and_resumes_one_queue(admin_client, admin_user):
    errands(emails=3, reports=2)
    changelist = reverse(ERRANDS, current_app="flow_admin")
    html = admin_client.get(changelist).content.decode()
    form = html.split('id="taskclaim-pause"')[1].split("</form>")[0]
    for value in ("all", "queue:emails", "queue:reports"):
        assert f'<option value="{value}">' in form
    assert 'name="csrfmiddlewaretoken"' in form

    resp = pause_post(
        admin_client, "flowapp.Errand", "queue:emails", "pause", reason="smtp down", next=changelist
    )
    assert resp.status_code == 302
    assert resp["Location"] == changelist
    page = admin_client.get(changelist)
    (text,) = messages_of(page)
    assert text.startswith("Paused flowapp.Errand, queue “emails” (since ")
    assert text.endswith(", by admin).")
    (row,) = QueuePause.objects.all()
    assert (row.model, row.queue, row.paused_by, row.reason) == (
        "flowapp.Errand",
        "emails",
        "admin",
        "smtp down",
    )
    assert 'class="taskclaim-badge taskclaim-cancelled taskclaim-paused" data-queue="emails"' in (
        page.content.decode()
    )
    # the pause is the library's: claims leave the queue's rows alone
    claimed = Errand.objects.claim(10, worker="w1")
    assert sorted(e.queue_name for e in claimed) == ["reports", "reports"]
    (entry,) = entries(Errand)
    assert (entry.user_id, entry.change_message) == (admin_user.pk, text)
    # pausing it again changes nothing: said so, not logged, the first pause kept
    resp = pause_post(
        admin_client, "flowapp.Errand", "queue:emails", "pause", reason="again", next=changelist
    )
    (again,) = messages_of(admin_client.get(resp["Location"]))
    assert again.startswith("flowapp.Errand, queue “emails” was already paused (since ")
    assert again.endswith(", by admin); nothing done.")
    assert len(entries(Errand)) == 1
    assert QueuePause.objects.get().reason == "smtp down"

    resp = pause_post(admin_client, "flowapp.Errand", "queue:emails", "resume", next=changelist)
    assert messages_of(admin_client.get(resp["Location"])) == [
        "Resumed flowapp.Errand, queue “emails”."
    ]
    assert not QueuePause.objects.exists()
    assert len(Errand.objects.claim(10, worker="w1")) == 3
    resp = pause_post(admin_client, "flowapp.Errand", "queue:emails", "resume", next=changelist)
    assert messages_of(admin_client.get(resp["Location"])) == [
        "flowapp.Errand, queue “emails” was not paused; nothing done."
    ]
    assert len(entries(Errand)) == 2  # the no-op is not logged


@on_flow_site
@pytest.mark.django_db
def test_dashboard_pauses_a_model_and_lists_paused_queues_with_backlog(admin_client):
    errands(emails=3, reports=2)
    Errand.objects.filter(queue_name="reports").claim(1, worker="w1")  # one not ready
    dashboard = reverse("admin:taskclaim_dashboard", current_app="flow_admin")
    html = admin_client.get(dashboard).content.decode()
    assert 'class="taskclaim-muted taskclaim-none-paused"' in html
    controls = html.split('id="taskclaim-pause-controls"')[1]
    assert 'data-model="flowapp.Errand"' in controls

    pause_post(admin_client, "flowapp.Errand", "all", "pause", reason="deploy", next=dashboard)
    pause("flowapp.Errand", "reports", by="ops-bot")
    page = admin_client.get(dashboard)
    assert messages_of(page)[0].startswith("Paused flowapp.Errand, all queues (since ")
    html = page.content.decode()
    paused = html.split('id="taskclaim-paused"')[1].split("</table>")[0]
    whole = paused.split('data-model="flowapp.Errand" data-queue=""')[1].split("</tr>")[0]
    assert "admin" in whole
    assert "deploy" in whole
    assert 'data-backlog="4"' in whole  # every ready row of the model
    one = paused.split('data-model="flowapp.Errand" data-queue="reports"')[1].split("</tr>")[0]
    assert "ops-bot" in one
    assert 'data-backlog="1"' in one  # the queue's ready rows
    assert 'value="resume"' in one
    row = html.split('id="taskclaim-queues"')[1].split('tr data-model="flowapp.Errand"')[1]
    assert "taskclaim-paused" in row.split("</th>")[0]  # marked in the figures too

    resp = pause_post(admin_client, "flowapp.Errand", "queue:reports", "resume", next=dashboard)
    assert messages_of(admin_client.get(resp["Location"])) == [
        "Resumed flowapp.Errand, queue “reports”. Every queue of flowapp.Errand is still paused."
    ]
    assert is_paused(Errand)
    assert not QueuePause.objects.filter(queue="reports").exists()


@on_flow_site
@pytest.mark.django_db
def test_pause_needs_the_change_permission(django_user_model):
    errands(emails=1)
    viewer = client_for(
        staff(django_user_model, "viewer", "view_errand", "view_workerprocess", "view_queuepause")
    )
    dashboard = reverse("admin:taskclaim_dashboard", current_app="flow_admin")
    html = viewer.get(dashboard).content.decode()
    assert 'data-model="flowapp.Errand"' in html  # the figures are shown
    assert "taskclaim-pause-controls" not in html
    html = viewer.get(reverse(ERRANDS, current_app="flow_admin")).content.decode()
    assert "taskclaim-pause-form" not in html
    assert pause_post(viewer, "flowapp.Errand", "all", "pause").status_code == 403
    assert not QueuePause.objects.exists()
    pause(Errand, by="ops")
    assert pause_post(viewer, "flowapp.Errand", "all", "resume").status_code == 403
    assert is_paused(Errand)
    assert entries(Errand) == []

    editor = client_for(staff(django_user_model, "editor", "view_errand", "change_errand"))
    assert pause_post(editor, "flowapp.Errand", "all", "resume").status_code == 302
    assert not is_paused(Errand)


@on_flow_site
@pytest.mark.django_db
def test_pause_needs_the_csrf_token(admin_user):
    client = client_for(admin_user, enforce_csrf_checks=True)
    assert pause_post(client, "flowapp.Errand", "all", "pause").status_code == 403
    assert not QueuePause.objects.exists()


@on_flow_site
@pytest.mark.django_db
def test_pause_refuses_bad_input_with_a_message(admin_client):
    dashboard = reverse("admin:taskclaim_dashboard", current_app="flow_admin")

    def outcome(model, queue, op="pause", **extra):
        resp = pause_post(admin_client, model, queue, op, **extra)
        assert resp.status_code == 302
        return resp["Location"], messages_of(admin_client.get(resp["Location"]))

    _, msgs = outcome("testapp.Document", "queue:emails")  # no queue_name field
    assert msgs[0].startswith("testapp.Document, queue “emails”: testapp.Document has no")
    assert msgs[0].endswith("Nothing done.")
    assert outcome("nosuch.Model", "all")[1] == ["Unknown model “nosuch.Model”; nothing done."]
    assert outcome("flowapp.Errand", "emails")[1] == ["Pick a queue or “all queues”; nothing done."]
    assert outcome("flowapp.Errand", "all", "explode")[1] == ["Unknown operation; nothing done."]
    location, _ = outcome("flowapp.Errand", "all", "resume", next="https://evil.example/")
    assert location == dashboard  # never sent off-site
    assert not QueuePause.objects.exists()
    assert (
        admin_client.get(reverse("admin:taskclaim_pause", current_app="flow_admin")).status_code
        == 405
    )


@on_flow_site
@pytest.mark.django_db
def test_paused_queue_admin_lists_and_resumes(admin_client, django_user_model):
    pause(Errand, "emails", by="ops", reason="smtp down")
    pause(Document, by="ops")
    url = reverse("admin:taskclaim_queuepause_changelist", current_app="flow_admin")
    resp = admin_client.get(url)
    html = resp.content.decode()
    assert [(p.model, p.queue) for p in resp.context["cl"].result_list] == [
        ("flowapp.Errand", "emails"),
        ("testapp.Document", ""),
    ]
    assert "smtp down" in html
    assert "all queues" in html
    assert 'value="resume_selected"' in html
    assert 'value="delete_selected"' not in html  # resume instead: it wakes the workers
    # a user who may view and change errands only: the document pause is not listed
    # for her, and a resume of it is skipped (not in her list)
    editor = client_for(
        staff(django_user_model, "editor", "view_queuepause", "view_errand", "change_errand")
    )
    listed = editor.get(url).context["cl"].result_list
    assert [(p.model, p.queue) for p in listed] == [("flowapp.Errand", "emails")]
    data = {
        "action": "resume_selected",
        "index": 0,
        "_selected_action": [p.pk for p in QueuePause.objects.all()],
    }
    resp = editor.post(url, data, follow=True)
    assert messages_of(resp) == ["Resume: 1 resumed, 0 skipped."]
    assert [(p.model, p.queue) for p in QueuePause.objects.all()] == [("testapp.Document", "")]
    (entry,) = entries(Errand)
    assert entry.change_message == "Resumed flowapp.Errand, queue “emails”."
    viewer = client_for(staff(django_user_model, "viewer", "view_queuepause", "view_document"))
    html = viewer.get(url).content.decode()
    assert "testapp.Document" in html
    assert 'value="resume_selected"' not in html
    # the pauses of models she may not view are not listed to her
    blind = client_for(staff(django_user_model, "blind", "view_queuepause"))
    assert list(blind.get(url).context["cl"].result_list) == []
