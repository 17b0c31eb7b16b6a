"""The admin's charts: done and failed tasks per minute (last hour) and per 10 minutes
(last day) from the rows' ``finished_at``, split by queue, with the ready depth now, on
the dashboard and each claimable model's changelist; bars hold exactly the rows whose
``finished_at`` falls in them (timestamps set from the database clock), the empty state,
a model without ``finished_at``, time zones, and who may see them."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib import admin
from django.contrib.auth.models import Permission
from django.db import connection
from django.test import Client, override_settings
from django.test.utils import CaptureQueriesContext
from django.urls import path, reverse

from django_taskclaim.admin import ClaimableAdminMixin
from django_taskclaim.admin.workers import WorkerProcessAdmin
from django_taskclaim.db import DbNow, db_now
from django_taskclaim.models import TaskAttempt, TaskHistory, WorkerProcess
from tests.support.flowapp.models import Errand
from tests.support.testapp.models import Document, Job


class ErrandAdmin(ClaimableAdminMixin, admin.ModelAdmin):
    list_display = ["queue_name"]


class QuietErrandAdmin(ClaimableAdminMixin, admin.ModelAdmin):
    claim_charts = False


#: This module's admin site: the queue model with the mixin, and the dashboard (served by
#: the worker registry's admin).
charts_site = admin.AdminSite(name="charts_admin")
charts_site.register(Errand, ErrandAdmin)
charts_site.register(WorkerProcess, WorkerProcessAdmin)
quiet_site = admin.AdminSite(name="quiet_admin")
quiet_site.register(Errand, QuietErrandAdmin)
urlpatterns = [
    path("admin/", admin.site.urls),
    path("charts-admin/", charts_site.urls),
    path("quiet-admin/", quiet_site.urls),
]
pytestmark = [pytest.mark.django_db, pytest.mark.urls("tests.admin.test_admin_charts")]

CHANGELIST = "admin:flowapp_errand_changelist"
DASHBOARD = "admin:taskclaim_dashboard"


def minute_of(value: datetime) -> datetime:
    return value.astimezone(UTC).replace(second=0, microsecond=0)


def ten_of(minute: datetime) -> datetime:
    return minute.replace(minute=minute.minute - minute.minute % 10)


def errands(queue: str, state: str, n: int, finished_at: datetime | None = None) -> None:
    """``n`` errands of ``queue`` put in ``state`` (finished at ``finished_at``)."""
    rows = Errand.objects.bulk_create([Errand(queue_name=queue) for _ in range(n)])
    fields: dict = {"status": state}
    if finished_at is not None:
        fields["finished_at"] = finished_at
    Errand.objects.filter(pk__in=[r.pk for r in rows]).update(**fields)


@pytest.fixture
def history() -> dict:
    """Finished errands at chosen minutes before the database's ``now()``, two queues.

    Returns the minutes (UTC) with the expected ``(done, failed)`` of every queue and of
    the total."""
    base = minute_of(db_now())
    at = {k: base - timedelta(minutes=k) for k in (5, 30, 120, 25 * 60)}
    errands("emails", "done", 3, at[5] + timedelta(seconds=10))
    errands("emails", "failed", 1, at[5] + timedelta(seconds=20))
    errands("emails", "done", 2, at[30] + timedelta(seconds=59))
    errands("reports", "done", 4, at[5] + timedelta(seconds=30))
    errands("reports", "failed", 2, at[120])
    errands("reports", "done", 7, at[25 * 60] + timedelta(seconds=1))  # older than a day
    errands("emails", "cancelled", 5, at[5])  # finished, but neither done nor failed
    errands("emails", "ready", 2)
    errands("reports", "ready", 1)
    errands("reports", "processing", 3)
    return {
        "hour": {
            "": {at[5]: (7, 1), at[30]: (2, 0)},
            "emails": {at[5]: (3, 1), at[30]: (2, 0)},
            "reports": {at[5]: (4, 0)},
        },
        "day": {
            "": {ten_of(at[5]): (7, 1), ten_of(at[30]): (2, 0), ten_of(at[120]): (0, 2)},
            "emails": {ten_of(at[5]): (3, 1), ten_of(at[30]): (2, 0)},
            "reports": {ten_of(at[5]): (4, 0), ten_of(at[120]): (0, 2)},
        },
        "ready": {"": 3, "emails": 2, "reports": 1},
    }


def model_section(html: str, label: str) -> str:
    """The charts of model ``label`` in a page ('' when absent)."""
    parts = html.split('<div class="taskclaim-chart-model" data-model="')
    for part in parts[1:]:
        if part.startswith(f'{label}"'):
            return part.split('class="taskclaim-muted taskclaim-chart-note"')[0]
    return ""


def series(section: str) -> dict[str, dict]:
    """queue ('' = all) -> {"ready": int, "hour": bars, "day": bars, ...} of a section."""
    found = {}
    for chunk in section.split('<div class="taskclaim-series" ')[1:]:
        queue, ready = re.match(r'data-queue="([^"]*)" data-ready="([^"]*)"', chunk).groups()
        entry: dict = {"ready": int(ready) if ready else None}
        for fig in chunk.split("<figure ")[1:]:
            window = re.search(r'data-window="(\w+)"', fig).group(1)
            head = re.search(r'data-done="(\d+)" data-failed="(\d+)"', fig).groups()
            entry[f"{window}_totals"] = tuple(int(x) for x in head)
            entry[window] = {
                datetime.fromisoformat(start): (int(d), int(f))
                for start, d, f in re.findall(
                    r'<g class="tc-bar" data-start="([^"]+)" data-done="(\d+)" '
                    r'data-failed="(\d+)">',
                    fig,
                )
            }
            entry[f"{window}_svg"] = fig
        found[queue] = entry
    return found


def test_changelist_charts_count_each_minute_per_queue(admin_client, history):
    html = admin_client.get(reverse(CHANGELIST, current_app="charts_admin")).content.decode()
    got = series(model_section(html, "flowapp.Errand"))
    assert set(got) == {"", "emails", "reports"}
    for queue in got:
        assert got[queue]["hour"] == history["hour"][queue], queue
        assert got[queue]["day"] == history["day"][queue], queue
        assert got[queue]["ready"] == history["ready"][queue], queue
    assert got[""]["hour_totals"] == (9, 1)
    assert got[""]["day_totals"] == (9, 3)
    svg = got[""]["hour_svg"]
    assert '<svg xmlns="http://www.w3.org/2000/svg" role="img" aria-label="' in svg
    assert "last hour: 9 done, 1 failed; at most 8 in a minute" in svg
    assert svg.count('class="tc-failed"') == 1
    assert svg.count('class="tc-done"') == 2
    # The tallest bar (8) fills the 60-unit plot, stacked; the numbers are on hover.
    tallest = re.search(r"<title>\d\d:\d\d: 7 done, 1 failed</title>(.*?)</g>", svg).group(1)
    assert 'class="tc-done" x="' in tallest
    assert 'y="13.5" width="5.0" height="52.5"' in tallest
    assert 'y="6.0" width="5.0" height="7.5"' in tallest


def test_dashboard_charts_every_visible_model(admin_client, history):
    Document.objects.create(title="waiting")
    html = admin_client.get(reverse(DASHBOARD, current_app="charts_admin")).content.decode()
    got = series(model_section(html, "flowapp.Errand"))
    assert got[""]["hour"] == history["hour"][""]
    assert got["reports"]["day"] == history["day"]["reports"]
    # A model without history gets the empty state, with its ready depth.
    document = model_section(html, "testapp.Document")
    assert "No task finished in the last 24 hours. Ready now: 1." in document
    assert "<svg" not in document


def test_empty_state_and_no_svg(admin_client):
    errands("emails", "ready", 4)
    html = admin_client.get(reverse(CHANGELIST, current_app="charts_admin")).content.decode()
    section = model_section(html, "flowapp.Errand")
    assert "No task finished in the last 24 hours. Ready now: 4." in section
    assert "<svg" not in section


def test_a_model_without_finished_at_says_so(admin_client):
    Job.objects.create(name="j")
    html = admin_client.get(reverse("admin:testapp_job_changelist")).content.decode()
    section = model_section(html, "testapp.Job")
    assert "No history to chart: this model has no finished_at field. Ready now: 1." in section


def test_an_admin_can_turn_the_charts_off(admin_client, history):
    response = admin_client.get(reverse(CHANGELIST, current_app="quiet_admin"))
    assert response.status_code == 200
    assert 'id="taskclaim-charts"' not in response.content.decode()


@override_settings(TIME_ZONE="Asia/Kathmandu")  # UTC+05:45: local minutes, UTC buckets
def test_times_are_shown_in_the_current_time_zone(admin_client, history):
    html = admin_client.get(reverse(CHANGELIST, current_app="charts_admin")).content.decode()
    got = series(model_section(html, "flowapp.Errand"))
    assert got[""]["hour"] == history["hour"][""]
    assert got[""]["day"] == history["day"][""]
    (five,) = [m for m, v in history["hour"][""].items() if v == (7, 1)]
    local = (five + timedelta(hours=5, minutes=45)).strftime("%H:%M")
    assert f"<title>{local}: 7 done, 1 failed</title>" in got[""]["hour_svg"]


def staff(django_user_model, *perms: str) -> Client:
    user = django_user_model.objects.create_user("viewer", password="x", is_staff=True)
    for codename in perms:
        user.user_permissions.add(Permission.objects.get(codename=codename))
    client = Client()
    client.force_login(user)
    return client


def test_only_staff_who_may_view_the_model_see_its_charts(django_user_model, history):
    client = staff(django_user_model, "view_document", "view_workerprocess")
    html = client.get(reverse(DASHBOARD, current_app="charts_admin")).content.decode()
    assert model_section(html, "testapp.Document")
    assert not model_section(html, "flowapp.Errand")
    assert "emails" not in html
    assert client.get(reverse(CHANGELIST, current_app="charts_admin")).status_code == 403

    client.logout()
    other = django_user_model.objects.get(username="viewer")
    other.user_permissions.add(Permission.objects.get(codename="view_errand"))
    client.force_login(other)
    html = client.get(reverse(CHANGELIST, current_app="charts_admin")).content.decode()
    assert series(model_section(html, "flowapp.Errand"))[""]["hour"] == history["hour"][""]


def test_each_chart_gives_its_failure_rate_and_the_day_chart_dates_its_ends(admin_client, history):
    html = admin_client.get(reverse(CHANGELIST, current_app="charts_admin")).content.decode()
    got = series(model_section(html, "flowapp.Errand"))
    # 9 done, 1 failed in the hour: 10 %; 9 done, 3 failed in the day: 25 %
    assert 'data-rate="10 %">(10 % failed)' in got[""]["hour_svg"]
    assert 'data-rate="25 %">(25 % failed)' in got[""]["day_svg"]
    day_ends = re.findall(
        r'<text class="tc-text" x="[\d.]+" y="[\d.]+"[^>]*>([^<]+)</text>', got[""]["day_svg"]
    )
    dated = [t for t in day_ends if re.fullmatch(r"\d\d \w{3} \d\d:\d\d", t)]
    assert len(dated) == 2, day_ends
    assert dated[0] != dated[1]  # the two ends: the same hour of two days
    hour_ends = re.findall(r">(\d\d:\d\d)</text>", got[""]["hour_svg"])
    assert len(hour_ends) == 2  # the hour chart: times only
    assert "attempts finished by workers" in html  # what the charts leave out, said on them


def test_runtime_percentiles_come_from_the_attempts_journal(admin_client, history, settings):
    html = admin_client.get(reverse(CHANGELIST, current_app="charts_admin")).content.decode()
    # not every attempt recorded: the rows' claimed_at, which none of these has
    assert "claim time (claimed_at) known" in model_section(html, "flowapp.Errand")
    settings.TASKCLAIM_ATTEMPT_LOG = "all"
    now = db_now()
    TaskAttempt.objects.bulk_create(
        [
            TaskAttempt(
                model="flowapp.Errand",
                row=str(i),
                number=1,
                started_at=now - timedelta(minutes=5),
                runtime=float(i),
                outcome="done",
            )
            for i in range(1, 101)  # runtimes 1 s … 100 s
        ]
        + [  # started before the hour: not counted
            TaskAttempt(
                model="flowapp.Errand",
                row="old",
                number=1,
                started_at=now - timedelta(minutes=90),
                runtime=9999.0,
                outcome="done",
            )
        ]
    )
    html = admin_client.get(reverse(CHANGELIST, current_app="charts_admin")).content.decode()
    section = model_section(html, "flowapp.Errand")
    assert "p50 50.000 s · p95 95.000 s · p99 99.000 s, of 100 attempts" in section


def runtime_reads(queries) -> list[str]:
    """The reads of the rows' runtimes among captured queries."""
    found = re.compile(r'claimed_at["`]? IS NOT NULL')
    return [q["sql"] for q in queries.captured_queries if found.search(q["sql"])]


def test_runtime_percentiles_come_from_the_rows_claimed_at_otherwise(admin_client, settings):
    """Without the journal of every attempt, a model with ``claimed_at`` charted from its
    rows gets the percentiles of ``finished_at - claimed_at`` over the rows finished in
    the last hour, said to be that."""
    settings.TASKCLAIM_ATTEMPT_LOG = "errors"
    rows = Errand.objects.bulk_create([Errand(queue_name="emails") for _ in range(103)])
    five_ago = DbNow() - timedelta(minutes=5)
    for i, row in enumerate(rows[:100], start=1):  # runtimes 1 s … 100 s
        Errand.objects.filter(pk=row.pk).update(
            status="done" if i % 10 else "failed",
            claimed_at=five_ago - timedelta(seconds=i),
            finished_at=five_ago,
        )
    Errand.objects.filter(pk=rows[100].pk).update(  # finished before the hour
        status="done",
        claimed_at=DbNow() - timedelta(hours=3),
        finished_at=DbNow() - timedelta(hours=2),
    )
    Errand.objects.filter(pk=rows[101].pk).update(status="done", finished_at=five_ago)  # no claim
    Errand.objects.filter(pk=rows[102].pk).update(  # cancelled: not a runtime
        status="cancelled", claimed_at=DbNow() - timedelta(hours=1), finished_at=five_ago
    )
    with CaptureQueriesContext(connection) as queries:
        html = admin_client.get(reverse(CHANGELIST, current_app="charts_admin")).content.decode()
    assert len(runtime_reads(queries)) == 1  # one query for the percentiles
    section = model_section(html, "flowapp.Errand")
    assert 'data-n="100" data-source="rows"' in section
    assert "from the claim of their last attempt to its end" in section
    assert "p50 50.000 s · p95 95.000 s · p99 99.000 s, of 100 tasks" in section
    # the workers' history is there: no second scan of the finished rows for runtimes
    TaskHistory.objects.create(model="flowapp.Errand", queue="emails", minute=db_now(), done=1)
    with CaptureQueriesContext(connection) as queries:
        html = admin_client.get(reverse(CHANGELIST, current_app="charts_admin")).content.decode()
    section = model_section(html, "flowapp.Errand")
    assert 'TASKCLAIM_ATTEMPT_LOG = "all"' in section
    assert runtime_reads(queries) == []
