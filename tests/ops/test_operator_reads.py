"""``taskclaim_stats`` over a large table reads no finished row (DESIGN: bounded operator
reads): every statement it sends about the model's rows is planned without a scan of
the table, on the real PostgreSQL with real statistics; ``--exact`` still counts them."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_taskclaim.db import db_now
from django_taskclaim.models import TaskHistory
from tests.support.flowapp.models import Errand

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL plans"),
]

FINISHED = 120_000  # above ops.figures.EXACT_UP_TO: a large table


def plans(sqls: list[str]) -> list[str]:
    out = []
    with connection.cursor() as cursor:
        for sql in sqls:
            cursor.execute(f"EXPLAIN {sql}")
            out.append("\n".join(row[0] for row in cursor.fetchall()))
    return out


@pytest.mark.slow
def test_taskclaim_stats_reads_no_finished_row_of_a_large_table() -> None:
    Errand.objects.bulk_create(
        (Errand(queue_name=f"q{i % 3}", status="done") for i in range(FINISHED)),
        batch_size=10_000,
    )
    Errand.objects.bulk_create(Errand(queue_name="q0") for _ in range(7))
    # what the workers' heartbeats write as they finish rows
    minute = db_now().replace(second=0, microsecond=0)
    TaskHistory.objects.create(model="flowapp.Errand", queue="q0", minute=minute, done=12)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE flowapp_errand")
    out = StringIO()
    with CaptureQueriesContext(connection) as queries:
        call_command("taskclaim_stats", "flowapp.Errand", "--json", stdout=out)
    (doc,) = json.loads(out.getvalue())["models"]
    assert doc["counts"]["ready"] == 7  # exact, through the claim index
    assert "done" in doc["estimated"]
    assert 0.8 * FINISHED < doc["counts"]["done"] < 1.2 * FINISHED
    assert doc["done_last"] == {"5m": 12, "60m": 12}  # from the history
    on_table = [q["sql"] for q in queries.captured_queries if '"flowapp_errand"' in q["sql"]]
    assert on_table
    for plan in plans(on_table):
        assert "Seq Scan on flowapp_errand" not in plan, plan
    text = StringIO()
    call_command("taskclaim_stats", "flowapp.Errand", stdout=text)
    assert "≈" in text.getvalue()
    exact = StringIO()
    call_command("taskclaim_stats", "flowapp.Errand", "--json", "--exact", stdout=exact)
    (doc,) = json.loads(exact.getvalue())["models"]
    assert (doc["counts"]["done"], doc["estimated"]) == (FINISHED, [])
