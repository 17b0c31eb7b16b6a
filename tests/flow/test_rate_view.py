"""What an operator sees of the rate limits (docs/rate-limits.md, "Seeing it"): the read
function, the admin dashboard, ``taskclaim_stats`` and the metrics, after real claims on
the real database (slots charged by the claims themselves, times by the database clock)."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from io import StringIO

import pytest
from django.core.management import call_command
from django.urls import reverse

from django_taskclaim.flow.rate_view import describe, rate_report, rate_view
from django_taskclaim.models import RateSlot
from tests.flow.test_rate_limits import claim_meta
from tests.support.flowapp.models import Errand, KeyedErrand
from tests.support.helpers import wait_for
from tests.support.testapp.models import Document

pytestmark = pytest.mark.django_db(transaction=True)

DOC = "testapp.Document"
#: A tag of ours with a style attribute, or a <style> element styling our classes.
INLINE_STYLE = re.compile(r"<[^>]*taskclaim[^>]*\sstyle=|<style[^>]*>[^<]*taskclaim")


def rings_of(label: str) -> dict[str, object]:
    """scope -> ring, of the model ``label`` (which must be rate-limited)."""
    (rated,) = [m for m in rate_view() if m.model == label]
    return {ring.scope: ring for ring in rated.rings}


def full_document_ring() -> None:
    """``Document`` limited to 3/h, 5 rows, one claim: 3 started, the ring full."""
    Document.objects.bulk_create(Document(title=f"d{i}") for i in range(5))
    assert len(Document.objects.claim(5)) == 3


def test_the_read_function_counts_the_starts_of_the_window_on_the_database_clock() -> None:
    Document.objects.bulk_create(Document(title=f"d{i}") for i in range(5))
    assert rate_view() == []  # no model is rate-limited: nothing to show
    with claim_meta(Document, rate_limit="3/h"):
        (before,) = rate_view()  # limited, never claimed: the model's ring, all free
        assert (before.model, [r.starts for r in before.rings]) == (DOC, [0])
        assert len(Document.objects.claim(2)) == 2
        (ring,) = rings_of(DOC).values()
        assert (ring.scope, ring.limit, ring.count, ring.window) == ("", "3/h", 3, 3600.0)
        assert (ring.starts, ring.at_limit, ring.next_free) == (2, False, 0.0)
        assert describe(ring) == f"{DOC} 3/h: 2 of 3 starts in the window, 1 free"
        assert len(Document.objects.claim(5)) == 1  # the limit lends one more
        (ring,) = rings_of(DOC).values()
        assert (ring.starts, ring.at_limit) == (3, True)
        # the earliest start was a moment ago: its slot frees about an hour from now
        assert 3500 < ring.next_free <= 3600
        assert describe(ring).startswith(f"{DOC} 3/h: 3 of 3 starts in the window, at the limit")
        assert Document.objects.claim(5) == []  # what the view says, the claim does


def test_starts_leave_the_window_and_the_ring_frees() -> None:
    Document.objects.bulk_create(Document(title=f"d{i}") for i in range(4))
    with claim_meta(Document, rate_limit="2/0.5s"):
        assert len(Document.objects.claim(4)) == 2
        ring = rings_of(DOC)[""]  # full, or (a slow machine) its window already passed
        assert ring.starts <= 2
        assert 0.0 <= ring.next_free <= 0.5
        wait_for(lambda: rings_of(DOC)[""].starts == 0, what="the starts to leave the window")
        assert rings_of(DOC)[""].next_free == 0.0
        assert len(Document.objects.claim(4)) == 2  # and the claim agrees: two free


def test_one_ring_per_queue_and_per_key() -> None:
    Errand.objects.bulk_create(Errand(queue_name=q) for q in ("a", "a", "a", "b"))
    KeyedErrand.objects.bulk_create(KeyedErrand(customer_id=c) for c in (1, 1, 1, 2))
    with (
        claim_meta(Errand, rate_limit="3/h", rate_limit_per="queue"),
        claim_meta(KeyedErrand, key_rate_limit="2/h"),
    ):
        assert len(Errand.objects.claim(10)) == 4
        for _ in range(3):  # one processing per key: finish each at once, claim again
            for task in KeyedErrand.objects.claim(10):
                task.complete()
        assert [m.model for m in rate_view()] == ["flowapp.Errand", "flowapp.KeyedErrand"]
        queues = rings_of("flowapp.Errand")
        assert {s: (r.per, r.value, r.starts, r.at_limit) for s, r in queues.items()} == {
            "queue:a": ("queue", "a", 3, True),
            "queue:b": ("queue", "b", 1, False),
        }
        keys = rings_of("flowapp.KeyedErrand")
        assert {s: (r.option, r.starts, r.at_limit) for s, r in keys.items()} == {
            "key:1": ("key_rate_limit", 2, True),
            "key:2": ("key_rate_limit", 1, False),
        }
        report = {(r["model"], r["scope"]): r for r in rate_report()}
        assert report[("flowapp.KeyedErrand", "key:1")]["text"].startswith(
            "flowapp.KeyedErrand key 1 2/h: 2 of 2 starts in the window, at the limit"
        )
        # a ring of a limit the model no longer declares is not shown
        with claim_meta(Errand, rate_limit="3/h", rate_limit_per="model"):
            assert [r.starts for r in rings_of("flowapp.Errand").values()] == [0]


@pytest.mark.slow
def test_the_dashboard_shows_the_rings_only_when_a_model_is_limited(admin_client) -> None:
    url = reverse("admin:taskclaim_dashboard")
    html = admin_client.get(url).content.decode()
    assert 'id="taskclaim-queues"' in html
    assert 'id="taskclaim-rate-limits"' not in html
    with claim_meta(Document, rate_limit="3/h"):
        full_document_ring()
        resp = admin_client.get(url)
        html = resp.content.decode()
    assert 'id="taskclaim-rate-limits"' in html
    (row,) = resp.context["taskclaim_rates"]
    assert (row["label"], row["limits"], row["more"]) == (DOC, ["3/h"], 0)
    (ring,) = row["rings"]
    assert (ring["starts"], ring["count"], ring["at_limit"]) == (3, 3, True)
    assert 'data-model="testapp.Document" data-scope="" data-starts="3" data-count="3"' in html
    assert 'data-at-limit="1"' in html
    assert not INLINE_STYLE.search(html)


def test_the_dashboard_lists_a_limited_model_before_its_first_claim(admin_client) -> None:
    with claim_meta(Errand, rate_limit="3/h", rate_limit_per="queue"):
        resp = admin_client.get(reverse("admin:taskclaim_dashboard"))
    (row,) = resp.context["taskclaim_rates"]
    assert (row["label"], row["limits"], row["rings"]) == (
        "flowapp.Errand",
        ["3/h per queue"],
        [],
    )
    assert "no start recorded yet" in resp.content.decode()


def test_taskclaim_stats_has_one_line_per_ring() -> None:
    out = StringIO()
    call_command("taskclaim_stats", stdout=out)
    assert "rate limits" not in out.getvalue()  # no limited model, no section
    with claim_meta(Document, rate_limit="3/h"):
        full_document_ring()
        out = StringIO()
        call_command("taskclaim_stats", stdout=out)
        text = out.getvalue()
        out = StringIO()
        call_command("taskclaim_stats", DOC, "--json", stdout=out)
        data = json.loads(out.getvalue())
    assert "\nrate limits: 1\n" in text
    assert f"  {DOC} 3/h: 3 of 3 starts in the window, at the limit, next slot frees in" in text
    (ring,) = data["rate_limits"]
    assert (ring["model"], ring["scope"], ring["limit"]) == (DOC, "", "3/h")
    assert (ring["starts"], ring["count"], ring["at_limit"]) == (3, 3, True)
    assert 3500 < ring["next_free_seconds"] <= 3600


def test_the_metrics_have_the_starts_and_the_limit_per_ring() -> None:
    parser = pytest.importorskip("prometheus_client.parser")

    def scrape() -> dict[str, dict[tuple, float]]:
        out = StringIO()
        call_command("taskclaim_metrics", stdout=out)
        return {
            family.name: {tuple(sorted(s.labels.items())): s.value for s in family.samples}
            for family in parser.text_string_to_metric_families(out.getvalue())
        }

    KeyedErrand.objects.bulk_create(KeyedErrand(customer_id=c) for c in (1, 2))
    with (
        claim_meta(Document, rate_limit="3/h"),
        claim_meta(KeyedErrand, key_rate_limit="2/h"),
    ):
        full_document_ring()
        assert len(KeyedErrand.objects.claim(10)) == 2
        # customer 2's start as if it were long ago: its ring has no start in its window
        RateSlot.objects.filter(scope="key:2").update(last_start=datetime(2000, 1, 1, tzinfo=UTC))
        found = scrape()
    doc = (("model", DOC), ("scope", ""))
    key1 = (("model", "flowapp.KeyedErrand"), ("scope", "key:1"))
    assert found["taskclaim_rate_limit_starts"] == {doc: 3, key1: 1}
    # a per-key ring with no start in its window has no series (keys are unbounded)
    assert found["taskclaim_rate_limit"] == {doc: 3, key1: 2}
