#!/usr/bin/env python
"""The admin dashboard's render time with a long history of finished rows, charts included.

    python benchmarks/dashboard.py                    # 1,000,000 finished rows, last 24 h
    python benchmarks/dashboard.py --finished 200000 --spread-hours 168

One claimable model with queues (``tests.support.flowapp.Errand``) gets ``--finished``
finished rows (2 % failed, over ``--queues`` queues, ``finished_at`` spread evenly over the
last ``--spread-hours`` hours: the default puts them all in the charts' day, the worst
case) with one ``INSERT … SELECT generate_series``, plus ``--ready`` ready rows, then
``VACUUM ANALYZE`` (as autovacuum would), and the per-minute history the workers would
have written for them (``taskclaim_taskhistory``, one ``INSERT … SELECT … GROUP BY``).
A superuser's ``GET`` of the dashboard
(``admin:taskclaim_dashboard``, every claimable model of the test settings, charts
included) is timed with the test client, median of ``--repeat`` renders after one warm-up;
so are the charts alone (:func:`~django_taskclaim.admin.charts.model_charts`) and the
dashboard's figures alone (``dashboard_context``). Then the same with the history table
emptied (the fallback to ``finished_at`` of a model no worker wrote history for), and
with an index on ``finished_at`` as well. PostgreSQL only
(127.0.0.1:5432, ``TASKCLAIM_BENCH_PG_URL``), in a dedicated ``taskclaim_bench_dashboard``
database dropped and made anew. A table on stdout, JSON under ``var/``. Compare the cases
of one run only: the machine is noisy.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
VAR = ROOT / "var"
DB_NAME = "taskclaim_bench_dashboard"
sys.path.insert(0, str(ROOT))

from benchmarks.timing import median_ms  # noqa: E402

os.environ["DJANGO_SETTINGS_MODULE"] = "tests.support.settings"
os.environ["TASKCLAIM_TEST_DB"] = "postgres"
os.environ["TASKCLAIM_TEST_DB_NAME"] = DB_NAME

import django  # noqa: E402
import psycopg  # noqa: E402

ADMIN_URL = os.environ.get(
    "TASKCLAIM_BENCH_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)
TARGET_MS = 200.0


def log(msg: str) -> None:
    print(msg, flush=True)


def _fresh_database() -> None:
    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{DB_NAME}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{DB_NAME}"')


def _load(finished: int, ready: int, queues: int, spread_hours: float) -> float:
    """Insert the history (benchmark only: raw SQL through a cursor)."""
    from django.db import connection

    t0 = time.perf_counter()
    step = 1_000_000
    spread_ms = spread_hours * 3600 * 1000
    with connection.cursor() as cur:
        for start in range(0, finished, step):
            count = min(step, finished - start)
            cur.execute(
                "INSERT INTO flowapp_errand (status, version, locked_by, attempts, priority,"
                " created_at, finished_at, last_error, queue_name, work)"
                " SELECT CASE WHEN g %% 50 = 0 THEN 'failed' ELSE 'done' END, 2, '', 1, 0,"
                " now() - (%s::float8 * g / %s + 1000) * interval '1 ms',"
                " now() - (%s::float8 * g / %s) * interval '1 ms',"
                " '', 'q' || (g %% %s), 0"
                " FROM generate_series(%s::bigint, %s::bigint) g",
                [spread_ms, finished, spread_ms, finished, queues, start + 1, start + count],
            )
            log(f"  history: {start + count:,} / {finished:,} rows")
        cur.execute(
            "INSERT INTO flowapp_errand (status, version, locked_by, attempts, priority,"
            " last_error, queue_name, work)"
            " SELECT 'ready', 1, '', 0, 0, '', 'q' || (g %% %s), 0"
            " FROM generate_series(1, %s) g",
            [queues, ready],
        )
        # The per-minute history the workers would have written for these rows (one
        # row per queue and minute, what their heartbeats' upserts add up to).
        cur.execute(
            "INSERT INTO taskclaim_taskhistory (model, queue, minute, done, failed)"
            " SELECT 'flowapp.Errand', queue_name, date_trunc('minute', finished_at),"
            " count(*) FILTER (WHERE status = 'done'), count(*) FILTER (WHERE status = 'failed')"
            " FROM flowapp_errand WHERE finished_at IS NOT NULL GROUP BY 2, 3"
        )
        cur.execute("VACUUM ANALYZE flowapp_errand")
        cur.execute("VACUUM ANALYZE taskclaim_taskhistory")
    return time.perf_counter() - t0


def _measure(case: str, repeat: int) -> dict[str, Any]:
    from django.contrib import admin
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.test import Client, RequestFactory
    from django.test.utils import CaptureQueriesContext
    from django.urls import reverse

    from django_taskclaim.admin.charts import model_charts
    from django_taskclaim.admin.dashboard import dashboard_context
    from tests.support.flowapp.models import Errand

    user = get_user_model().objects.get(username="bench")
    client = Client()
    client.force_login(user)
    url = reverse("admin:taskclaim_dashboard")

    def page() -> None:
        response = client.get(url)
        if response.status_code != 200 or b'data-model="flowapp.Errand"' not in response.content:
            raise SystemExit(f"dashboard answered {response.status_code} without the charts")

    request = RequestFactory().get(url)
    request.user = user
    page_ms, page_runs = median_ms(page, repeat)
    charts_ms, _ = median_ms(lambda: model_charts(Errand), repeat)
    figures_ms, _ = median_ms(lambda: dashboard_context(request, admin.site), repeat)
    with CaptureQueriesContext(connection) as queries:
        page()
    charts = model_charts(Errand)
    row = {
        "case": case,
        "page_ms": page_ms,
        "page_runs_ms": page_runs,
        "charts_ms": charts_ms,
        "figures_ms": figures_ms,
        "queries": len(queries.captured_queries),
        "day_done": charts.series[0].day.done,
        "day_failed": charts.series[0].day.failed,
        "met": page_ms <= TARGET_MS,
    }
    log(
        f"{case:<24} page {page_ms:>7.1f} ms  charts {charts_ms:>7.1f} ms  "
        f"figures {figures_ms:>7.1f} ms  {row['queries']} queries"
    )
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--finished", type=int, default=1_000_000)
    parser.add_argument("--ready", type=int, default=10_000)
    parser.add_argument("--queues", type=int, default=4)
    parser.add_argument("--spread-hours", type=float, default=24.0)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    _fresh_database()
    django.setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.db import connection

    call_command("migrate", verbosity=0)
    get_user_model().objects.create_superuser("bench", "bench@example.com", "x")
    log(
        f"dashboard benchmark: {args.finished:,} finished rows over {args.spread_hours:g} h, "
        f"{args.ready:,} ready, {args.queues} queues; median of {args.repeat} renders"
    )
    load_s = _load(args.finished, args.ready, args.queues, args.spread_hours)
    log(f"  loaded in {load_s:.0f} s (+ VACUUM ANALYZE)")
    rows = [_measure("history table", args.repeat)]
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM taskclaim_taskhistory")
        history_rows = cur.fetchone()[0]
        # No history: what a model no worker has written for yet falls back to.
        cur.execute("CREATE TABLE bench_history AS SELECT * FROM taskclaim_taskhistory")
        cur.execute("DELETE FROM taskclaim_taskhistory")
    rows.append(_measure("no history (finished_at)", args.repeat))
    with connection.cursor() as cur:
        cur.execute("CREATE INDEX bench_errand_finished ON flowapp_errand (finished_at)")
        cur.execute("ANALYZE flowapp_errand")
    rows.append(_measure("no history, finished_at index", args.repeat))
    with connection.cursor() as cur:
        cur.execute("SELECT pg_table_size('flowapp_errand')")
        table_mb = cur.fetchone()[0] // (1024 * 1024)
    result = {
        "benchmark": "dashboard",
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "server": connection.pg_version,
        "args": vars(args),
        "load_s": round(load_s, 1),
        "table_mb": table_mb,
        "history_rows": history_rows,
        "target_ms": TARGET_MS,
        "cases": rows,
    }
    VAR.mkdir(exist_ok=True)
    path = VAR / f"bench-dashboard-{datetime.now(UTC):%Y%m%dT%H%M%S}.json"
    path.write_text(json.dumps(result, indent=2))
    log("")
    log("| case | dashboard ms (median) | charts ms | figures ms | queries | target |")
    log("|---|---:|---:|---:|---:|---|")
    for r in rows:
        log(
            f"| {r['case']} | {r['page_ms']:.1f} | {r['charts_ms']:.1f} | "
            f"{r['figures_ms']:.1f} | {r['queries']} | "
            f"{'met' if r['met'] else 'NOT MET'} (≤ {TARGET_MS:.0f} ms) |"
        )
    log(f"table {table_mb} MB, {history_rows:,} history rows; JSON: {path}")


if __name__ == "__main__":
    main()
