"""A real browser (Debian's chromium driven by Playwright) against a live server:
log in, open the dashboard and a changelist, run "retry failed", see the counts change."""

from __future__ import annotations

import os
import shutil
from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connections

from django_taskclaim.db import DbNow
from django_taskclaim.models import WorkerProcess
from tests.support.testapp.models import Document

CHROMIUM = os.environ.get("TASKCLAIM_CHROMIUM", "/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parent / "artifacts"

#: What the admin draws and does in a browser does not depend on the database under it
#: (tests/admin checks every page and action on each database): the browser tests run
#: once, in the PostgreSQL pass.
ONCE = pytest.mark.skipif(
    getattr(settings, "DB_VENDOR", "sqlite") != "postgresql",
    reason="the browser tests run once, in the PostgreSQL pass (the pages they check are "
    "tested on every database in tests/admin)",
)
pytestmark = ONCE


def _skip_reason() -> str | None:
    if not (os.path.exists(CHROMIUM) or shutil.which(CHROMIUM)):
        return f"chromium not found at {CHROMIUM} (apt-get install chromium)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright Python package is not installed"
    return None


@pytest.fixture
def browser_page():
    reason = _skip_reason()
    if reason:
        print(f"\nSKIPPED browser test: {reason}")
        pytest.skip(reason)
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=CHROMIUM,
            args=["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"],
        )
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        # A deadline for each page action, not a speed check (a loaded machine's live
        # server took over 20 s to answer one login in a CI rehearsal, load 8).
        page.set_default_timeout(60_000)
        try:
            yield page
        finally:
            browser.close()
            # ORM calls made while Playwright's loop runs use connections of that
            # context: close them here, or the test database cannot be dropped.
            connections.close_all()


def summary_count(page, state: str) -> int:
    return int(
        page.locator(f'#taskclaim-summary [data-state="{state}"]').get_attribute("data-count")
    )


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_retry_failed_from_the_browser(live_server, django_user_model, browser_page, monkeypatch):
    # Playwright's sync API runs an event loop in this thread; the ORM calls made here
    # between page actions are plain synchronous test code.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    django_user_model.objects.create_superuser("boss", "boss@example.com", "browser-pw")
    docs = Document.objects.bulk_create([Document(title=f"invoice {i:03d}") for i in range(30)])
    pks = [d.pk for d in docs]
    Document.objects.filter(pk__in=pks[:12]).update(status="done", finished_at=DbNow(), attempts=1)
    Document.objects.filter(pk__in=pks[12:19]).update(
        status="failed",
        finished_at=DbNow(),
        attempts=5,
        last_error="Traceback (most recent call last):\n  ...\nTimeoutError: OCR took too long",
    )
    Document.objects.filter(pk__in=pks[19:22]).update(
        status="processing",
        locked_by="host-a:4242",
        attempts=1,
        locked_until=DbNow() + timedelta(seconds=240),
    )
    WorkerProcess.objects.create(
        worker_id="host-a:4242",
        hostname="host-a",
        pid=4242,
        concurrency=4,
        processed=12,
        in_flight=3,
        model_labels=["testapp.Document"],
    )
    page = browser_page
    base = live_server.url

    page.goto(f"{base}/admin/login/?next=/admin/")
    page.fill("#id_username", "boss")
    page.fill("#id_password", "browser-pw")
    page.click("input[type=submit]")
    page.wait_for_selector("#content-main")

    # the admin index links to the app index, which carries the dashboard
    page.click('a[href="/admin/taskclaim/"]')
    page.wait_for_selector("#taskclaim-queues")
    page.click("#taskclaim-open-dashboard")
    page.wait_for_selector("#taskclaim-workers")
    row = page.locator('#taskclaim-queues tr[data-model="testapp.Document"]')
    assert row.locator('[data-state="failed"]').get_attribute("data-count") == "7"
    assert row.locator('[data-state="done"]').get_attribute("data-count") == "12"
    assert page.locator('tr.taskclaim-worker[data-worker="host-a:4242"]').count() == 1
    page.screenshot(path=str(ARTIFACTS / "dashboard.png"), full_page=True)

    # from the dashboard to the failed rows of the changelist
    row.locator('[data-state="failed"] a').click()
    page.wait_for_selector("#result_list")
    assert summary_count(page, "failed") == 7
    assert summary_count(page, "ready") == 8
    assert page.locator("#result_list tbody tr").count() == 7
    # the styles come from the static stylesheet, served and applied
    badge = page.locator("#result_list .taskclaim-badge.taskclaim-failed").first
    assert badge.evaluate("e => getComputedStyle(e).backgroundColor") == "rgb(254, 226, 226)"
    assert page.locator("#taskclaim-summary").evaluate("e => getComputedStyle(e).display") == (
        "flex"
    )
    page.screenshot(path=str(ARTIFACTS / "changelist-before.png"), full_page=True)

    page.check("#action-toggle")  # select every row on the page
    page.select_option("select[name=action]", "taskclaim_retry_failed")
    page.click("button[name=index]")
    page.wait_for_selector("ul.messagelist li")
    message = page.locator("ul.messagelist li").first.inner_text()
    assert "Retry failed: 7 done, 0 skipped." in message
    assert summary_count(page, "failed") == 0
    assert summary_count(page, "ready") == 15
    page.screenshot(path=str(ARTIFACTS / "changelist-after.png"), full_page=True)

    assert Document.objects.failed().count() == 0
    assert Document.objects.filter(pk__in=pks[12:19], status="ready", attempts=0).count() == 7

    # the dashboard shows the new numbers too
    page.goto(f"{base}/admin/taskclaim/workerprocess/dashboard/")
    row = page.locator('#taskclaim-queues tr[data-model="testapp.Document"]')
    assert row.locator('[data-state="failed"]').get_attribute("data-count") == "0"
    assert row.locator('[data-state="ready"]').get_attribute("data-count") == "15"


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_task_buttons_and_pause_from_the_browser(
    live_server, django_user_model, browser_page, monkeypatch
):
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    django_user_model.objects.create_superuser("boss", "boss@example.com", "browser-pw")
    failed = Document.objects.create(title="invoice 042")
    Document.objects.filter(pk=failed.pk).update(
        status="failed", finished_at=DbNow(), attempts=5, last_error="ValueError: bad page 7"
    )
    Document.objects.bulk_create([Document(title=f"waiting {i}") for i in range(3)])
    page = browser_page
    base = live_server.url
    page.goto(f"{base}/admin/login/?next=/admin/")
    page.fill("#id_username", "boss")
    page.fill("#id_password", "browser-pw")
    page.click("input[type=submit]")
    page.wait_for_selector("#content-main")

    # Retry on the failed task's page
    page.goto(f"{base}/admin/testapp/document/{failed.pk}/change/")
    assert page.locator("#taskclaim-task-actions").get_attribute("data-state") == "failed"
    assert page.locator('input[name="_addanother"]').count() == 0
    page.screenshot(path=str(ARTIFACTS / "task-page-before.png"), full_page=True)
    page.click("#taskclaim-retry")
    page.wait_for_selector("ul.messagelist li")
    assert "Retry: “invoice 042” is now ready." in page.locator("ul.messagelist li").inner_text()
    assert page.locator("#taskclaim-task-actions").get_attribute("data-state") == "ready"
    assert page.locator("#taskclaim-retry").count() == 0
    assert page.locator("#taskclaim-cancel").count() == 1
    page.screenshot(path=str(ARTIFACTS / "task-page-after.png"), full_page=True)
    page.emulate_media(color_scheme="dark")  # the admin's own classes follow its dark theme
    cancel = page.locator("#taskclaim-cancel")
    colours = cancel.evaluate(
        "e => [getComputedStyle(e).color, getComputedStyle(e).backgroundColor]"
    )
    assert colours[0] != colours[1]
    page.screenshot(path=str(ARTIFACTS / "task-page-dark.png"), full_page=True)
    page.emulate_media(color_scheme="light")
    row = Document.objects.get(pk=failed.pk)
    assert (row.status, row.attempts) == ("ready", 0)

    # Pause, then Resume, the model from the dashboard
    page.goto(f"{base}/admin/taskclaim/workerprocess/dashboard/")
    assert page.locator(".taskclaim-none-paused").count() == 1
    form = page.locator("#taskclaim-pause-controls")  # one form: pick the model
    form.locator('select[name="model"]').select_option("testapp.Document")
    form.locator('input[name="reason"]').fill("month-end close")
    form.locator('button[value="pause"]').click()
    page.wait_for_selector("#taskclaim-paused tr.taskclaim-pause-row")
    assert "Paused testapp.Document, all queues" in page.locator("ul.messagelist li").inner_text()
    paused = page.locator('#taskclaim-paused tr[data-model="testapp.Document"]')
    assert "month-end close" in paused.inner_text()
    assert "boss" in paused.inner_text()
    assert paused.locator("[data-backlog]").get_attribute("data-backlog") == "4"
    assert Document.objects.claim(1, worker="browser-test") == []  # claims see the pause
    page.screenshot(path=str(ARTIFACTS / "dashboard-paused.png"), full_page=True)
    page.emulate_media(color_scheme="dark")
    page.screenshot(path=str(ARTIFACTS / "dashboard-paused-dark.png"), full_page=True)
    page.emulate_media(color_scheme="light")
    paused.locator('button[value="resume"]').click()
    page.wait_for_selector(".taskclaim-none-paused")
    assert "Resumed testapp.Document, all queues." in (
        page.locator("ul.messagelist li").inner_text()
    )
    assert len(Document.objects.claim(1, worker="browser-test")) == 1
