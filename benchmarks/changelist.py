#!/usr/bin/env python
"""A claimable model's admin changelist with 1,000,000 rows: the page, a filter, a search.

    python benchmarks/changelist.py                   # 1,000,000 rows
    python benchmarks/changelist.py --rows 200000 --repeat 5

``tests.support.testapp.Document`` (its ``DocumentAdmin``: ``ClaimableAdminMixin``,
``search_fields = ["title"]``) gets ``--rows`` rows with one ``INSERT … SELECT
generate_series``: ``--failed-pct`` % ``failed``, ``--ready`` ``ready``, the rest ``done``,
finished over the last 24 h, then ``VACUUM ANALYZE`` (as autovacuum would), and the
per-minute history the workers would have written for them. A superuser's ``GET`` of
the changelist is timed with the test client, median of ``--repeat`` after one warm-up:
the plain page, the ``failed`` filter (``?taskclaim_status=failed``) and a search
(``?q=…``); with the statements each sends, slowest first. Then the same with the partial
index over the failed rows that docs/observability.md suggests, and then with Django's
``show_full_result_count = False`` on the admin as well. PostgreSQL only
(127.0.0.1:5432, ``TASKCLAIM_BENCH_PG_URL``), in a dedicated database (``--db``, default
``taskclaim_bench_changelist``) dropped and made anew, and dropped at the end. A table on
stdout, JSON under ``var/``. Compare the cases of one run only: the machine is noisy.
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
sys.path.insert(0, str(ROOT))

from benchmarks.timing import median_ms  # noqa: E402

ADMIN_URL = os.environ.get(
    "TASKCLAIM_BENCH_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)
#: Goals (issue: "what an operator sees"): the page, and a filter.
PAGE_TARGET_MS = 300.0
FILTER_TARGET_MS = 500.0


def log(msg: str) -> None:
    print(msg, flush=True)


def _database(name: str, *, drop_only: bool = False) -> None:
    import psycopg

    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        if not drop_only:
            conn.execute(f'CREATE DATABASE "{name}"')


def _load(rows: int, ready: int, failed_pct: float) -> float:
    """The rows (benchmark only: raw SQL through a cursor)."""
    from django.db import connection

    t0 = time.perf_counter()
    every = max(1, round(100 / failed_pct)) if failed_pct > 0 else 0
    finished = rows - ready
    with connection.cursor() as cur:
        cur.execute(
            "INSERT INTO testapp_document (status, version, locked_by, attempts, priority,"
            " created_at, finished_at, last_error, title, kind, payload, result)"
            " SELECT CASE WHEN %s > 0 AND g %% %s = 0 THEN 'failed' ELSE 'done' END, 2, '',"
            " 1, 0, now() - (86400000.0 * g / %s + 1000) * interval '1 ms',"
            " now() - (86400000.0 * g / %s) * interval '1 ms',"
            " CASE WHEN %s > 0 AND g %% %s = 0 THEN 'ValueError: bad page' ELSE '' END,"
            " 'document ' || g, 'pdf', '{}'::jsonb, ''"
            " FROM generate_series(1, %s) g",
            [every, every or 1, finished, finished, every, every or 1, finished],
        )
        cur.execute(
            "INSERT INTO testapp_document (status, version, locked_by, attempts, priority,"
            " last_error, title, kind, payload, result)"
            " SELECT 'ready', 1, '', 0, 0, '', 'new ' || g, 'pdf', '{}'::jsonb, ''"
            " FROM generate_series(1, %s) g",
            [ready],
        )
        cur.execute(
            "INSERT INTO taskclaim_taskhistory (model, queue, minute, done, failed)"
            " SELECT 'testapp.Document', '', date_trunc('minute', finished_at),"
            " count(*) FILTER (WHERE status = 'done'), count(*) FILTER (WHERE status = 'failed')"
            " FROM testapp_document WHERE finished_at IS NOT NULL GROUP BY 3"
        )
        cur.execute("VACUUM ANALYZE testapp_document")
        cur.execute("VACUUM ANALYZE taskclaim_taskhistory")
    return time.perf_counter() - t0


PAGES = {
    "changelist": "",
    "failed filter": "?taskclaim_status=failed",
    "search": "?q=document+123456",
}


def _measure(case: str, repeat: int) -> list[dict[str, Any]]:
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext
    from django.urls import reverse

    client = Client()
    client.force_login(get_user_model().objects.get(username="bench"))
    base = reverse("admin:testapp_document_changelist")
    out = []
    for page, query in PAGES.items():

        def get(query: str = query, page: str = page) -> None:
            response = client.get(base + query)
            if response.status_code != 200:
                raise SystemExit(f"{page} answered {response.status_code}")

        ms, runs = median_ms(get, repeat)
        with CaptureQueriesContext(connection) as queries:
            get()
        slowest = sorted(queries.captured_queries, key=lambda q: float(q["time"]), reverse=True)[:4]
        target = PAGE_TARGET_MS if page == "changelist" else FILTER_TARGET_MS
        row = {
            "case": case,
            "page": page,
            "ms": ms,
            "runs_ms": runs,
            "queries": len(queries.captured_queries),
            "slowest": [
                {"ms": round(float(q["time"]) * 1000, 1), "sql": q["sql"][:160]} for q in slowest
            ],
            "target_ms": target,
            "met": ms <= target,
        }
        log(f"{case:<22} {page:<14} {ms:>8.1f} ms  {row['queries']} queries")
        for q in row["slowest"]:
            log(f"      {q['ms']:>7.1f} ms  {q['sql'][:110]}")
        out.append(row)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--ready", type=int, default=10_000)
    parser.add_argument("--failed-pct", type=float, default=2.5)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--db", default="taskclaim_bench_changelist")
    parser.add_argument("--label", default="", help="a word for the JSON file (before / after)")
    args = parser.parse_args()
    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.support.settings"
    os.environ["TASKCLAIM_TEST_DB"] = "postgres"
    os.environ["TASKCLAIM_TEST_DB_NAME"] = args.db
    _database(args.db)
    try:
        import django

        django.setup()
        from django.contrib.auth import get_user_model
        from django.core.management import call_command
        from django.db import connection

        call_command("migrate", verbosity=0)
        get_user_model().objects.create_superuser("bench", "bench@example.com", "x")
        log(
            f"changelist benchmark: {args.rows:,} rows ({args.ready:,} ready, "
            f"{args.failed_pct:g} % failed); median of {args.repeat} renders"
        )
        load_s = _load(args.rows, args.ready, args.failed_pct)
        log(f"  loaded in {load_s:.0f} s (+ VACUUM ANALYZE)")
        rows = _measure("no failed index", args.repeat)
        with connection.cursor() as cur:
            cur.execute(
                "CREATE INDEX bench_document_failed ON testapp_document (id)"
                " WHERE status = 'failed'"
            )
            cur.execute("ANALYZE testapp_document")
        rows += _measure("failed rows' index", args.repeat)
        from tests.support.testapp.admin import DocumentAdmin

        DocumentAdmin.show_full_result_count = False  # Django's option: no "N total" count
        rows += _measure("… and no full count", args.repeat)
        result = {
            "benchmark": "changelist",
            "label": args.label,
            "when": datetime.now(UTC).isoformat(timespec="seconds"),
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
            "server": connection.pg_version,
            "args": vars(args),
            "load_s": round(load_s, 1),
            "cases": rows,
        }
        connection.close()
    finally:
        _database(args.db, drop_only=True)
    VAR.mkdir(exist_ok=True)
    suffix = f"-{args.label}" if args.label else ""
    path = VAR / f"bench-changelist{suffix}-{datetime.now(UTC):%Y%m%dT%H%M%S}.json"
    path.write_text(json.dumps(result, indent=2))
    log("")
    log("| case | page | ms (median) | queries | goal |")
    log("|---|---|---:|---:|---|")
    for r in rows:
        log(
            f"| {r['case']} | {r['page']} | {r['ms']:.1f} | {r['queries']} | "
            f"{'met' if r['met'] else 'NOT MET'} (≤ {r['target_ms']:.0f} ms) |"
        )
    log(f"JSON: {path}")


if __name__ == "__main__":
    main()
