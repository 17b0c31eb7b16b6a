"""``claimed_at``: every claim stamps it with the database clock in the claim's own
statement (no extra round trip), completion keeps it (a finished row's runtime is
``finished_at - claimed_at``), the operator's requeue clears it, and a model without the
field claims as before."""

from __future__ import annotations

import re

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from django_taskclaim.claim import STRATEGIES
from django_taskclaim.db import DbNow
from tests.support.helpers import claim_queries
from tests.support.keyedapp.models import KeyedJob
from tests.support.testapp.models import ColumnTask, Document, Job

pytestmark = pytest.mark.django_db(transaction=True)

SET_CLAIMED = re.compile(r"claimed_at[\"`]? = ")
ALL = ["skip_locked", "cas", "advisory", "serializable", "hold"]


def db_now(model=Document):
    """The database clock, read through a row of ``model`` (there must be one)."""
    return model.objects.annotate(now=DbNow()).values_list("now", flat=True)[:1].get()


def claim(qs, n=1, strategy="auto"):
    if strategy == "hold":
        with transaction.atomic():
            return qs.claim(n, strategy="hold")
    return qs.claim(n, strategy=strategy)


@pytest.mark.parametrize("strategy", ALL)
@pytest.mark.parametrize("model", [Document, ColumnTask], ids=["plain", "db_column"])
def test_every_strategy_stamps_the_claim_with_the_database_clock(strategy, model):
    if not STRATEGIES[strategy].supported("default"):
        pytest.skip(f"{strategy} not supported on {connection.vendor}")
    model.objects.bulk_create([model() for _ in range(3)])
    before = db_now(model)
    rows = claim(model.objects, 2, strategy)
    after = db_now(model)
    assert len(rows) == 2
    for row in rows:
        assert before <= row.claimed_at <= after  # on the instance, or loaded from the row
    stored = dict(model.objects.values_list("pk", "claimed_at"))
    assert sorted(v is None for v in stored.values()) == [False, False, True]


def test_a_keyed_claim_stamps_it_too():
    KeyedJob.objects.create(customer_id=1)
    before = db_now(KeyedJob)
    (row,) = KeyedJob.objects.claim(5)
    row.refresh_from_db()
    assert before <= row.claimed_at <= db_now(KeyedJob)


def test_the_claim_costs_no_extra_round_trip():
    Document.objects.bulk_create([Document() for _ in range(5)])
    Job.objects.bulk_create([Job() for _ in range(5)])
    with CaptureQueriesContext(connection) as q:
        Job.objects.claim(5)  # no claimed_at field: the baseline
    with CaptureQueriesContext(connection) as stamped:
        rows = Document.objects.claim(5)
    assert len(rows) == 5
    assert len(claim_queries(stamped)) == len(claim_queries(q))
    written = [s["sql"] for s in claim_queries(stamped) if SET_CLAIMED.search(s["sql"])]
    assert len(written) == 1  # stamped in the claim's UPDATE itself


def test_completion_keeps_it_a_reclaim_moves_it_and_requeue_clears_it():
    Document.objects.create(title="a")
    (row,) = Document.objects.claim(1)
    row.complete()
    row.refresh_from_db()
    first = row.claimed_at
    assert first is not None
    assert row.finished_at >= first
    assert Document.objects.filter(pk=row.pk).requeue() == 1
    row.refresh_from_db()
    assert (row.claimed_at, row.finished_at) == (None, None)
    (again,) = Document.objects.claim(1)
    again.refresh_from_db()
    assert again.claimed_at >= first


def test_a_retried_row_keeps_its_last_attempts_start_until_the_next_claim():
    Document.objects.create(title="a")
    (row,) = Document.objects.claim(1)
    row.retry(delay=0, error="again")
    row.refresh_from_db()
    assert row.status == "ready"
    assert row.claimed_at is not None


def test_a_plain_save_never_clobbers_it_and_producers_cannot_set_it():
    Document.objects.create(title="a")
    (row,) = Document.objects.claim(1)
    row.refresh_from_db()
    stamped = row.claimed_at
    stale = Document.objects.get(pk=row.pk)
    stale.claimed_at = None
    stale.title = "edited"
    stale.save()
    row.refresh_from_db()
    assert (row.title, row.claimed_at) == ("edited", stamped)
    with pytest.raises(ValueError, match="claimed_at"):
        Document.objects.enqueue_many([{"title": "b", "claimed_at": stamped}])
    with pytest.raises(ValueError, match="claimed_at"):
        row.complete(claimed_at=None)


def test_a_model_without_the_field_claims_and_completes_as_before():
    Job.objects.create()
    (row,) = Job.objects.claim(1)
    row.complete()
    assert Job.objects.done().count() == 1
    assert not hasattr(row, "claimed_at")
