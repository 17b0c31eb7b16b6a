"""The changelist's runtime column and the held row's "running for" line, from the rows'
own ``claimed_at`` (database clock): "running 1m 35s" for a held row, the time from its
claim to its end for a finished one, "—" for the others; no query per row."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from django_taskclaim.db import DbNow
from tests.support.testapp.models import Document, Job

pytestmark = pytest.mark.django_db

CHANGELIST = "admin:testapp_document_changelist"
CELL = re.compile(r'<td class="field-runtime">(.*?)</td>', re.S)
SPAN = re.compile(r'data-runtime="(\w+)" data-seconds="([\d.]+)"[^>]*>([^<]*)</span>')


def put(title: str, **fields) -> Document:
    """A document with ``fields`` written in one UPDATE (expressions on the database clock)."""
    doc = Document.objects.create(title=title)
    Document.objects.filter(pk=doc.pk).update(**fields)
    return doc


def runtime_cells(html: str) -> dict[str, str]:
    """title -> the runtime cell of its row, in the changelist's HTML."""
    cells = {}
    for row in html.split("<tr")[1:]:
        title = re.search(r'<th class="field-title">.*?>([^<]+)</a>', row, re.S)
        cell = CELL.search(row)
        if title and cell:
            cells[title.group(1)] = cell.group(1)
    return cells


def test_running_finished_and_other_rows(admin_client):
    put(
        "held",
        status="processing",
        attempts=1,
        locked_by="w1",
        locked_until=DbNow() + timedelta(minutes=5),
        claimed_at=DbNow() - timedelta(seconds=95.2),
    )
    put(
        "done",
        status="done",
        attempts=1,
        claimed_at=DbNow() - timedelta(seconds=42),
        finished_at=DbNow(),
    )
    put("failed", status="failed", claimed_at=DbNow() - timedelta(hours=2), finished_at=DbNow())
    put("ready", status="ready")
    put("retried", status="ready", claimed_at=DbNow() - timedelta(seconds=30))
    put("cancelled", status="cancelled", claimed_at=DbNow(), finished_at=DbNow())
    put("old done", status="done", finished_at=DbNow())  # claimed before the field existed
    html = admin_client.get(reverse(CHANGELIST)).content.decode()
    assert 'class="sortable column-runtime' in html or "column-runtime" in html
    cells = runtime_cells(html)
    kind, seconds, text = SPAN.search(cells["held"]).groups()
    assert kind == "running"
    assert 95 <= float(seconds) < 110
    assert re.fullmatch(r"running 1m (3[5-9]|4\d)s", text), text
    assert SPAN.search(cells["done"]).groups() == ("finished", "42.000", "42s")
    assert SPAN.search(cells["failed"]).group(3) == "2h 00m"
    for title in ("ready", "retried", "cancelled", "old done"):
        assert cells[title] == "—", (title, cells[title])


def test_no_query_per_row(admin_client):
    def queries_for(n: int) -> int:
        Document.objects.all().delete()
        for i in range(n):
            put(f"d{i}", status="done", claimed_at=DbNow(), finished_at=DbNow())
            put(f"h{i}", status="processing", claimed_at=DbNow(), locked_by="w")
        with CaptureQueriesContext(connection) as q:
            assert admin_client.get(reverse(CHANGELIST)).status_code == 200
        return len(q.captured_queries)

    assert queries_for(1) == queries_for(10)


def test_a_claim_and_its_completion_show_their_runtime(admin_client):
    Document.objects.create(title="real")
    (row,) = Document.objects.claim(1)
    cells = runtime_cells(admin_client.get(reverse(CHANGELIST)).content.decode())
    assert SPAN.search(cells["real"]).group(1) == "running"
    row.complete()
    cells = runtime_cells(admin_client.get(reverse(CHANGELIST)).content.decode())
    kind, seconds, _text = SPAN.search(cells["real"]).groups()
    assert kind == "finished"
    assert 0 <= float(seconds) < 60
    Document.objects.filter(pk=row.pk).requeue()
    cells = runtime_cells(admin_client.get(reverse(CHANGELIST)).content.decode())
    assert cells["real"] == "—"


def test_the_held_rows_page_says_since_when_without_the_registry(admin_client):
    doc = put(
        "held",
        status="processing",
        attempts=1,
        locked_by="w-gone",  # no registry row lists it
        locked_until=DbNow() + timedelta(minutes=5),
        claimed_at=DbNow() - timedelta(seconds=95.2),
    )
    html = admin_client.get(reverse("admin:testapp_document_change", args=[doc.pk])).content
    text = html.decode()
    assert re.search(
        r"w-gone — running for 1m \d\ds \(since \d{4}-\d\d-\d\d \d\d:\d\d:\d\d\)", text
    )
    assert "claimed at" in text.lower()  # the field itself, read-only on the task's page


def test_a_model_without_the_field_has_no_runtime_column(admin_client):
    Job.objects.create(name="j")
    html = admin_client.get(reverse("admin:testapp_job_changelist")).content.decode()
    assert "field-runtime" not in html


def test_the_operators_retry_clears_the_claim_time(admin_client):
    doc = put("failed", status="failed", claimed_at=DbNow(), finished_at=DbNow(), attempts=5)
    resp = admin_client.post(
        reverse(CHANGELIST),
        {"action": "taskclaim_retry_failed", "index": 0, "_selected_action": [str(doc.pk)]},
        follow=True,
    )
    assert resp.status_code == 200
    doc.refresh_from_db()
    assert (doc.status, doc.claimed_at, doc.finished_at) == ("ready", None, None)
    assert runtime_cells(resp.content.decode())["failed"] == "—"
