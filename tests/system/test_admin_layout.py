"""The admin pages an operator reads, in a real browser (Debian's chromium driven by
Playwright) at 1400 px and at a phone's 390 px, in light and dark mode: nothing overflows
sideways (at 390 px a wide table may scroll inside its own box, as Django's admin lays it
out, but the page may not), no header, link or cell text wraps inside a word, and every
text is legible (WCAG contrast of its colour against the background it is drawn on, from
``getComputedStyle``: 4.5:1, 3:1 for large text).

Screenshots land in ``var/admin-layout/`` for a human. The QueuedTask pages need the
tasks backend (``--ds=tests.support.settings_tasks``) and skip without it; they run in the
postgresql-tasks pass of ``make test`` (scripts/test.sh).
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.apps import apps
from django.db import connections
from django.urls import reverse

from django_taskclaim.db import DbNow, db_now
from django_taskclaim.models import (
    PeriodicRun,
    PeriodicSlot,
    QueueDepth,
    TaskAttempt,
    WorkerProcess,
)
from django_taskclaim.periodic import periodic, unregister
from tests.support.testapp.models import Document
from tests.system.test_browser import CHROMIUM, ONCE, _skip_reason

pytestmark = ONCE

VAR = Path(__file__).resolve().parents[2] / "var" / "admin-layout"
WIDTH = 1400
NARROW = 390
SCHEDULE = "layout.nightly"
PASSWORD = "layout-pw"

# Every problem on the page, as one line each: sideways overflow of the page or of a
# scrolling box in the content, a table header broken inside a word, a text whose
# contrast is below WCAG AA. Also returns how many texts it checked.
PROBLEMS_JS = (Path(__file__).parent / "admin_layout_checks.js").read_text()


def tasks_installed() -> bool:
    return apps.is_installed("django_taskclaim.contrib.tasks")


def nightly_report() -> dict[str, int]:
    """The function of the schedule the periodic pages show."""
    return {"rows": 3}


@pytest.fixture
def operator_page(live_server, django_user_model, monkeypatch):
    """A logged-in superuser's browser page (1400 px wide) on a database holding what an
    operator sees: tasks in every state, a finished one with its last holder, a live
    worker, a registered cron schedule with a slot and its run, and (with the tasks
    backend) finished and failed QueuedTasks."""
    reason = _skip_reason()
    if reason:
        print(f"\nSKIPPED browser test: {reason}")
        pytest.skip(reason)
    from playwright.sync_api import sync_playwright

    # Playwright's sync API runs an event loop in this thread; the ORM calls made here
    # between page actions are plain synchronous test code.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    django_user_model.objects.create_superuser("boss", "boss@example.com", PASSWORD)
    data = seed()
    periodic("30 3 * * 1-5", name=SCHEDULE, tz="Europe/Paris")(nightly_report)
    VAR.mkdir(parents=True, exist_ok=True)
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(
                executable_path=CHROMIUM,
                args=[
                    "--headless",
                    "--no-sandbox",
                    "--disable-gpu",
                    "--disable-background-networking",
                ],
            )
            page = browser.new_page(viewport={"width": WIDTH, "height": 900})
            # A deadline for each page action, not a speed check: a loaded machine's live
            # server took over 20 s to answer one login in a CI rehearsal (load 8).
            page.set_default_timeout(60_000)
            try:
                page.goto(f"{live_server.url}/admin/login/?next=/admin/")
                page.fill("#id_username", "boss")
                page.fill("#id_password", PASSWORD)
                page.click("input[type=submit]")
                page.wait_for_selector("#content-main")
                yield page, live_server.url, data
            finally:
                browser.close()
                connections.close_all()
    finally:
        unregister(SCHEDULE)


def seed() -> dict[str, Any]:
    """The rows of the pages; returns the primary keys the pages need."""
    docs = Document.objects.bulk_create(
        [Document(title=f"invoice {i:03d} for the quarterly report") for i in range(12)]
    )
    pks = [d.pk for d in docs]
    Document.objects.filter(pk__in=pks[:4]).update(
        status="done",
        claimed_at=DbNow() - timedelta(seconds=42),
        finished_at=DbNow(),
        attempts=1,
        locked_by="host-a:4242",
    )
    Document.objects.filter(pk__in=pks[4:7]).update(
        status="failed",
        claimed_at=DbNow() - timedelta(minutes=3),
        finished_at=DbNow(),
        attempts=5,
        locked_by="host-b:77",
        last_error="Traceback (most recent call last):\n  ...\n"
        "TimeoutError: OCR took too long on page 7 of the scanned invoice",
    )
    Document.objects.filter(pk__in=pks[7:9]).update(
        status="processing",
        locked_by="host-a:4242",
        attempts=1,
        locked_until=DbNow() + timedelta(seconds=240),
        claimed_at=DbNow() - timedelta(seconds=95),
    )
    worker = WorkerProcess.objects.create(
        worker_id="host-a:4242",
        hostname="host-a",
        pid=4242,
        concurrency=4,
        processed=12,
        in_flight=2,
        model_labels=["testapp.Document"],
        running=[
            {"model": "testapp.Document", "pk": str(pk), "age": 95.5 - 60 * i}
            for i, pk in enumerate(pks[7:9])
        ],
    )
    WorkerProcess.objects.create(  # a long host name, as cloud hosts have, asked to stop
        worker_id="ip-10-12-134-201.eu-west-1.compute.internal:1234567",
        hostname="ip-10-12-134-201.eu-west-1.compute.internal",
        pid=1234567,
        concurrency=16,
        processed=1_234_567,
        model_labels=["testapp.Document"],
        stop_requested_at=DbNow(),
        stop_requested_by="boss",
    )
    slot = db_now().replace(microsecond=0) - timedelta(hours=20)
    run = PeriodicRun.objects.create(
        schedule=SCHEDULE, slot=slot, function=f"{__name__}.nightly_report"
    )
    PeriodicRun.objects.filter(pk=run.pk).update(
        status="done", finished_at=DbNow(), attempts=1, locked_by="host-a:4242"
    )
    PeriodicSlot.objects.create(
        schedule=SCHEDULE,
        slot=slot,
        enqueued_by="host-a:4242",
        target="taskclaim.PeriodicRun",
        target_pk=str(run.pk),
    )
    for number, (outcome, error) in enumerate(
        [
            ("retried", "TimeoutError: OCR took too long on page 7"),
            ("retried", "ConnectionResetError: [Errno 104] Connection reset by peer"),
            ("failed", "TimeoutError: OCR took too long on page 7 of the scanned invoice"),
        ],
        start=1,
    ):
        TaskAttempt.objects.create(
            model="testapp.Document",
            row=str(pks[4]),
            number=number,
            worker="host-b:77",
            started_at=db_now() - timedelta(minutes=30 - 10 * number),
            runtime=31.5 + number,
            outcome=outcome,
            error=f"Traceback (most recent call last):\n  ...\n{error}",
        )
    minute = db_now().replace(second=0, microsecond=0)
    QueueDepth.objects.bulk_create(  # a day of queue depth samples, every 5 minutes
        [
            QueueDepth(
                model="testapp.Document",
                minute=minute - timedelta(minutes=m),
                ready=(m // 5) % 37 + (120 if 300 <= m < 420 else 0),
                processing=2 + (m // 5) % 4,
            )
            for m in range(0, 24 * 60, 5)
        ]
    )
    data: dict[str, Any] = {
        "done": pks[0],
        "failed": pks[4],
        "processing": pks[7],
        "worker": worker.pk,
    }
    if tasks_installed():
        from django_taskclaim.contrib.tasks.models import QueuedTask

        tasks = QueuedTask.objects.bulk_create(
            [
                QueuedTask(
                    task_path="tests.support.tasks_examples.send_the_monthly_statement_email",
                    queue_name="emails",
                    backend_name="default",
                    kwargs={"customer": i},
                )
                for i in range(6)
            ]
        )
        QueuedTask.objects.filter(pk__in=[t.pk for t in tasks[:3]]).update(
            status="done", finished_at=DbNow(), attempts=1, locked_by="host-a:4242"
        )
        QueuedTask.objects.filter(pk=tasks[3].pk).update(
            status="failed",
            finished_at=DbNow(),
            attempts=3,
            last_error="smtplib.SMTPServerDisconnected: Connection unexpectedly closed",
        )
        data["task"] = tasks[0].pk
    return data


PAGES = {
    "dashboard": lambda d: reverse("admin:taskclaim_dashboard"),
    "app-index": lambda d: reverse("admin:app_list", args=["taskclaim"]),
    "document-changelist": lambda d: reverse("admin:testapp_document_changelist"),
    "document-done": lambda d: reverse("admin:testapp_document_change", args=[d["done"]]),
    "document-failed": lambda d: reverse("admin:testapp_document_change", args=[d["failed"]]),
    "document-processing": lambda d: reverse(
        "admin:testapp_document_change", args=[d["processing"]]
    ),
    "workers": lambda d: reverse("admin:taskclaim_workerprocess_changelist"),
    "worker": lambda d: reverse("admin:taskclaim_workerprocess_change", args=[d["worker"]]),
    "periodicrun-changelist": lambda d: reverse("admin:taskclaim_periodicrun_changelist"),
    "periodicslot-changelist": lambda d: reverse("admin:taskclaim_periodicslot_changelist"),
    "queuedtask-changelist": lambda d: reverse("admin:taskclaim_tasks_queuedtask_changelist"),
    "queuedtask-done": lambda d: reverse(
        "admin:taskclaim_tasks_queuedtask_change", args=[d["task"]]
    ),
}


#: The QueuedTask pages skip before their fixture starts a browser without the backend.
NEEDS_TASKS = pytest.mark.skipif(
    not tasks_installed(),
    reason="the tasks backend is not installed (--ds=tests.support.settings_tasks)",
)


@pytest.mark.slow
@pytest.mark.parametrize(
    "name",
    [pytest.param(n, marks=NEEDS_TASKS) if n.startswith("queuedtask") else n for n in PAGES],
)
@pytest.mark.django_db(transaction=True)
def test_admin_page_fits_and_is_legible(name, operator_page):
    page, base, data = operator_page
    found = []
    for width in (WIDTH, NARROW):
        page.set_viewport_size({"width": width, "height": 900})
        for scheme in ("light", "dark"):
            # load the page in the scheme: switching afterwards would read colours
            # mid-transition
            page.emulate_media(color_scheme=scheme)
            page.goto(base + PAGES[name](data))
            page.wait_for_selector("#content")
            report = page.evaluate(PROBLEMS_JS, {"narrow": width == NARROW})
            suffix = "" if width == WIDTH else f"-{width}"
            page.screenshot(path=str(VAR / f"{name}-{scheme}{suffix}.png"), full_page=True)
            assert report["checked"] > 5, report  # the checks saw the page's text
            found += [f"{width} px, {scheme}: {p}" for p in report["problems"]]
    assert not found, "\n".join(found)
