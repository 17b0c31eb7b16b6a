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
from django_taskclaim.ops.figures import model_stats
from django_taskclaim.ops.metrics.gauges import queue_gauges
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


def _analyse_whole_table() -> None:
    """ANALYZE the errands with a sample of every row (statistics target 400: 120,000
    rows), so what the planner saw does not depend on chance."""
    with connection.cursor() as cursor:
        cursor.execute("SET default_statistics_target = 400")
        cursor.execute("ANALYZE flowapp_errand")
        cursor.execute("RESET default_statistics_target")


@pytest.mark.slow
def test_an_estimate_never_invents_rows_and_the_failed_count_is_count_star() -> None:
    # Only done and failed rows (5 %, interleaved), over three queues: no row is cancelled,
    # none waits (the model never used after=).
    Errand.objects.bulk_create(
        (
            Errand(queue_name=f"q{i % 3}", status="failed" if i % 20 == 0 else "done")
            for i in range(FINISHED)
        ),
        batch_size=10_000,
    )
    _analyse_whole_table()

    def figures() -> tuple[dict, list, str]:
        out, text = StringIO(), StringIO()
        call_command("taskclaim_stats", "flowapp.Errand", "--json", stdout=out)
        call_command("taskclaim_stats", "flowapp.Errand", stdout=text)
        (doc,) = json.loads(out.getvalue())["models"]
        stats = model_stats(Errand, fast=True)  # the dashboard's and the summary's
        assert (stats.counts, stats.estimated) == (doc["counts"], doc["estimated"])
        return doc["counts"], doc["estimated"], text.getvalue()

    counts, estimated, text = figures()
    assert (counts["cancelled"], counts["waiting"]) == (0, 0)
    assert "waiting" not in estimated  # exact: no fan-in counter, no waiting row
    assert "cancelled" in estimated  # no index counts it: the planner's, labelled
    assert "done" in estimated
    assert 0.9 * FINISHED < counts["done"] < 1.1 * FINISHED
    header, row = text.splitlines()[:2]
    shown = dict(zip(header.split(), row.split(), strict=False))
    assert (shown["cancelled"], shown["waiting"]) == ("≈0", "0")

    # One held row, which the sample sees once: it is not a most common value, so the
    # planner keeps its share apart for "other values". Spread over every status missing
    # from the most common ones, it made up cancelled and waiting rows ("≈34 cancelled"
    # at 1,000,000 rows); it is the held row's, counted exactly.
    Errand.objects.create(queue_name="q0", status="processing", locked_by="w-1")
    _analyse_whole_table()
    counts, estimated, _text = figures()
    assert (counts["processing"], counts["cancelled"], counts["waiting"]) == (1, 0, 0)
    assert counts["processing"] + counts["ready"] == 1

    # the failed gauge counts through the failed rows' index when there is one: COUNT(*)
    # (an index-only scan) rather than COUNT("id") (a read of every failed row's page)
    with CaptureQueriesContext(connection) as queries:
        gauges = queue_gauges(Errand, db_now(), using="default")
    assert sum(g.failed for g in gauges) == FINISHED // 20
    (failed_sql,) = [q["sql"] for q in queries.captured_queries if "'failed'" in q["sql"]]
    assert "COUNT(*)" in failed_sql, failed_sql
    assert 'COUNT("flowapp_errand"."id")' not in failed_sql, failed_sql
