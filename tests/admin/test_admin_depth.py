"""The queue depth chart on a model's changelist and the dashboard: the workers' samples
of the last 24 hours (``taskclaim.QueueDepth``) drawn as a ready and a processing line,
the last sample said in words, gaps left open, one query; nothing for an admin that
narrows its rows (the samples count all of them); a hint where no sample exists."""

from __future__ import annotations

import re
from datetime import UTC, timedelta

import pytest
from django.contrib import admin
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import path, reverse

from django_taskclaim.admin import ClaimableAdminMixin
from django_taskclaim.admin.depth_chart import depth_chart
from django_taskclaim.db import db_now
from django_taskclaim.models import QueueDepth
from tests.support.testapp.models import Document

LABEL = "testapp.Document"


class NarrowDocumentAdmin(ClaimableAdminMixin, admin.ModelAdmin):
    def get_queryset(self, request):
        return super().get_queryset(request).filter(kind="invoice")


narrow_site = admin.AdminSite(name="narrow_admin")
narrow_site.register(Document, NarrowDocumentAdmin)
urlpatterns = [path("admin/", admin.site.urls), path("narrow-admin/", narrow_site.urls)]
pytestmark = [pytest.mark.django_db, pytest.mark.urls("tests.admin.test_admin_depth")]


def depth_section(html: str) -> str:
    found = re.search(r'<div class="taskclaim-depth".*?</div>', html, re.S)
    return found.group(0) if found else ""


def sample(minutes_ago: float, ready: int, processing: int, model: str = LABEL) -> None:
    now = db_now().astimezone(UTC).replace(second=0, microsecond=0)
    QueueDepth.objects.create(
        model=model,
        minute=now - timedelta(minutes=minutes_ago),
        ready=ready,
        processing=processing,
    )


def test_the_changelist_draws_the_days_samples(admin_client):
    for ago, ready in ((30, 5), (29, 6), (28, 7)):  # one run of samples
        sample(ago, ready, 1)
    sample(10, 8, 2)  # after a gap: a line of its own
    sample(1, 3, 0)  # the last sample
    sample(25 * 60, 99, 99)  # before the day: not drawn
    sample(5, 50, 50, model="testapp.Job")  # another model's
    with CaptureQueriesContext(connection) as q:
        html = admin_client.get(reverse("admin:testapp_document_changelist")).content.decode()
    section = depth_section(html)
    assert 'data-samples="5"' in section
    assert "ready 3, processing 2" not in section
    assert 'data-ready="3" data-processing="0"' in section
    assert "ready 3, processing 0 at the last sample" in section
    assert 'data-peak="8" data-peak-ready="8"' in section
    assert section.count('<polyline class="tc-ready"') == 3  # gaps are not joined
    assert section.count('<polyline class="tc-processing"') == 3
    assert "about once a minute (database clock)" in section  # what it measures
    reads = [s for s in q.captured_queries if "taskclaim_queuedepth" in s["sql"]]
    assert len(reads) == 1


def test_the_peak_sample_touches_the_top_and_zero_the_axis():
    sample(20, 4, 0)
    sample(19, 0, 0)
    chart = depth_chart(LABEL, db_now(), "default", who="documents")
    assert chart is not None
    ys = [float(p.split(",")[1]) for p in chart.ready_lines[0].split()]
    assert ys == [chart.plot_top, chart.plot_bottom]
    assert chart.label.startswith("documents, last 24 hours: ready rows 0 at the last sample")


def test_without_samples_the_chart_says_how_they_come(admin_client):
    html = admin_client.get(reverse("admin:testapp_document_changelist")).content.decode()
    section = depth_section(html)
    assert "taskclaim-depth-none" in section
    assert "TASKCLAIM_DEPTH_SAMPLE_INTERVAL" in section


def test_an_admin_that_narrows_its_rows_gets_no_depth(admin_client):
    sample(3, 10, 1)
    html = admin_client.get(
        reverse("admin:testapp_document_changelist", current_app="narrow_admin")
    ).content.decode()
    assert "taskclaim-chart-model" in html  # its charts are there
    assert depth_section(html) == ""


def test_the_dashboard_shows_it_too(admin_client):
    Document.objects.create(title="a")
    sample(2, 7, 1)
    html = admin_client.get(reverse("admin:taskclaim_dashboard")).content.decode()
    assert "ready 7, processing 1 at the last sample" in html
