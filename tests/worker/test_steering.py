"""Workers an operator steers through the database: each worker's registry row lists the
bodies it runs (model, primary key, how long), and the admin's "Stop" action makes a
worker on any host finish what it runs, claim nothing more and exit 0 — permissioned and
logged like pause. Real worker processes on the suite's database."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission
from django.test import Client
from django.urls import reverse

from django_taskclaim.db import DbNow
from django_taskclaim.models import WorkerProcess
from django_taskclaim.worker.maintenance.registry import request_stop
from tests.support.helpers import wait_for
from tests.support.testapp.models import Document
from tests.support.worker_procs import WorkerProc, stop_all

pytestmark = pytest.mark.django_db(transaction=True)

GATED = "tests.worker.test_steering.gated"
WORKERS = "admin:taskclaim_workerprocess_changelist"


def gated(task: Any) -> dict[str, str]:
    """A body that runs until the test opens its gate (a file), for at most 60 s."""
    gate = Path(task.payload["gate"])
    wait_for(gate.exists, timeout=60, what="the test to open the gate")
    return {"result": "gated"}


@pytest.fixture
def procs():
    started: list[WorkerProc] = []
    yield started
    stop_all(started)


def staff_client(django_user_model, name: str, *codenames: str) -> Client:
    user = django_user_model.objects.create_user(name, password="pw", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(codename__in=codenames))
    client = Client()
    client.force_login(user)
    return client


def registry_row(worker_id: str) -> WorkerProcess | None:
    return WorkerProcess.objects.filter(worker_id=worker_id).first()


def running_pks(worker_id: str) -> list[str]:
    row = registry_row(worker_id)
    return [entry["pk"] for entry in (row.running or [])] if row else []


def start_gated(procs: list[WorkerProc], worker_id: str) -> WorkerProc:
    w = WorkerProc(
        "testapp.Document",
        "--concurrency",
        "1",
        "--batch",
        "1",
        "--grace",
        "60",
        "--worker-id",
        worker_id,
        claim_meta={"handler": GATED, "lease": 3},  # a registry refresh every second
    )
    procs.append(w)
    w.wait_started()
    return w


@pytest.mark.slow
def test_the_registry_lists_the_running_bodies_and_the_page_shows_them(
    procs, tmp_path, admin_client
):
    gate = tmp_path / "gate"
    doc = Document.objects.create(title="long", payload={"gate": str(gate)})
    w = start_gated(procs, "steer-list")
    wait_for(lambda: running_pks("steer-list") == [str(doc.pk)], what="the running body listed")
    row = registry_row("steer-list")
    assert row is not None
    entry = row.running[0]
    assert entry["model"] == "testapp.Document"
    assert entry["age"] >= 0
    page = admin_client.get(reverse("admin:taskclaim_workerprocess_change", args=[row.pk]))
    assert page.status_code == 200
    html = page.content.decode()
    assert f"testapp.Document #{doc.pk}" in html
    assert reverse("admin:testapp_document_change", args=[doc.pk]) in html
    # the task's own page says how long its body has run, from its holder's row
    task_page = admin_client.get(reverse("admin:testapp_document_change", args=[doc.pk]))
    assert "steer-list — running for" in task_page.content.decode()
    gate.write_text("open")
    wait_for(lambda: running_pks("steer-list") == [], what="the finished body no longer listed")
    assert Document.objects.get(pk=doc.pk).status == "done"
    assert w.stop() == 0


@pytest.mark.slow
def test_stop_from_the_admin_finishes_what_runs_claims_nothing_more_and_exits_zero(
    procs, tmp_path, django_user_model
):
    gate = tmp_path / "gate"
    running = Document.objects.create(title="running", payload={"gate": str(gate)})
    waiting = Document.objects.create(title="waiting", payload={"gate": str(gate)})
    w = start_gated(procs, "steer-stop")
    wait_for(lambda: running_pks("steer-stop") == [str(running.pk)], what="the first body")
    client = staff_client(django_user_model, "ops", "view_workerprocess", "change_workerprocess")
    row = registry_row("steer-stop")
    assert row is not None
    resp = client.post(
        reverse(WORKERS), {"action": "stop_workers", "_selected_action": [row.pk]}, follow=True
    )
    assert "1 asked to stop, 0 skipped" in resp.content.decode()
    # The worker sees the request while the body still runs (its gate is shut).
    w.stderr_count("stop requested by='ops'", 1)
    assert w.alive()
    assert Document.objects.get(pk=running.pk).status == "processing"
    gate.write_text("open")
    assert w.wait(60) == 0, w.stderr()[-3000:]
    assert Document.objects.get(pk=running.pk).status == "done"
    untouched = Document.objects.get(pk=waiting.pk)
    assert (untouched.status, untouched.attempts) == ("ready", 0)
    row.refresh_from_db()
    assert row.stopped_at is not None
    assert row.stop_requested_by == "ops"
    entry = LogEntry.objects.get(change_message__contains="steer-stop")
    assert entry.user.get_username() == "ops"
    assert entry.change_message == "Asked worker steer-stop to stop."


def test_stop_needs_the_registrys_change_permission(procs, django_user_model):
    WorkerProcess.objects.create(worker_id="w-perm", hostname="h", pid=1)
    client = staff_client(django_user_model, "viewer", "view_workerprocess")
    page = client.get(reverse(WORKERS))
    assert page.status_code == 200
    assert "stop_workers" not in page.content.decode()
    row = WorkerProcess.objects.get(worker_id="w-perm")
    client.post(reverse(WORKERS), {"action": "stop_workers", "_selected_action": [row.pk]})
    row.refresh_from_db()
    assert row.stop_requested_at is None
    assert not LogEntry.objects.exists()


def test_only_live_workers_not_yet_asked_are_asked(transactional_db):
    WorkerProcess.objects.create(worker_id="live", hostname="h", pid=1)
    WorkerProcess.objects.create(worker_id="gone", hostname="h", pid=2, stopped_at=DbNow())
    WorkerProcess.objects.create(
        worker_id="asked", hostname="h", pid=3, stop_requested_at=DbNow(), stop_requested_by="a"
    )
    assert request_stop(["live", "gone", "asked", "unknown"], "b") == 1
    assert request_stop(["live"], "c") == 0  # asked once: the first request stands
    by = dict(WorkerProcess.objects.values_list("worker_id", "stop_requested_by"))
    assert by == {"live": "b", "gone": "", "asked": "a"}


@pytest.mark.slow
def test_a_request_left_for_an_earlier_process_under_the_same_id_does_not_stop_the_next(
    procs, tmp_path
):
    WorkerProcess.objects.create(
        worker_id="steer-again",
        hostname="h",
        pid=1,
        stopped_at=DbNow(),
        stop_requested_at=DbNow(),
        stop_requested_by="ops",
    )
    gate = tmp_path / "gate"
    gate.write_text("open")
    docs = Document.objects.bulk_create(
        [Document(title=f"d{i}", payload={"gate": str(gate)}) for i in range(3)]
    )
    w = start_gated(procs, "steer-again")
    wait_for(
        lambda: Document.objects.filter(pk__in=[d.pk for d in docs], status="done").count() == 3,
        what="the three rows done",
    )
    row = registry_row("steer-again")
    assert row is not None
    assert (row.stop_requested_at, row.stop_requested_by, row.stopped_at) == (None, "", None)
    assert w.alive()
    assert w.stop() == 0


def _stop_message(client: Client, row: WorkerProcess) -> str:
    resp = client.post(
        reverse(WORKERS), {"action": "stop_workers", "_selected_action": [row.pk]}, follow=True
    )
    html = resp.content.decode()
    assert "1 asked to stop, 0 skipped" in html
    return html


def test_stop_of_a_worker_killed_a_second_ago_says_what_is_known_not_that_it_stops(
    procs, tmp_path, django_user_model
):
    """The admin cannot tell a worker killed a second ago from a live one: the message
    says when it was last heard from and what happens if it never beats again, and
    promises no stop."""
    gate = tmp_path / "gate"
    running = Document.objects.create(title="running", payload={"gate": str(gate)})
    w = start_gated(procs, "steer-killed")
    wait_for(lambda: running_pks("steer-killed") == [str(running.pk)], what="the body")
    w.kill()
    row = registry_row("steer-killed")
    assert row is not None
    client = staff_client(django_user_model, "ops", "view_workerprocess", "change_workerprocess")
    html = _stop_message(client, row)
    assert "stops at its next heartbeat" not in html
    assert "steer-killed: last heartbeat " in html
    assert "silent: presumed gone" not in html  # heard from recently: nothing more is known
    assert "One that does not beat again (killed, its host down) is shown silent 1m 00s" in html
    assert "its rows come back when their leases end" in html


def test_stop_of_a_silent_worker_says_it_is_presumed_gone(django_user_model):
    """A worker last heard from five minutes ago (longer than
    ``TASKCLAIM_WORKER_SILENT_AFTER``) is named as silent, presumed gone."""
    from datetime import timedelta

    row = WorkerProcess.objects.create(worker_id="w-stale", hostname="h", pid=1)
    WorkerProcess.objects.filter(pk=row.pk).update(last_seen=DbNow() - timedelta(seconds=300))
    fresh = WorkerProcess.objects.create(worker_id="w-fresh", hostname="h", pid=2)
    client = staff_client(django_user_model, "ops", "view_workerprocess", "change_workerprocess")
    html = _stop_message(client, row)
    assert "w-stale: last heartbeat 5m 0" in html
    assert "(silent: presumed gone unless it beats again)" in html
    html = _stop_message(client, fresh)
    # heard from within the minute: its age only, no guess (whatever the load made it)
    assert re.search(r"w-fresh: last heartbeat \d+s ago\. A worker that is running", html)
