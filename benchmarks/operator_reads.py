#!/usr/bin/env python
"""What an operator's reads cost with a long history and many idle rate-limit keys.

    python benchmarks/operator_reads.py               # 1,000,000 finished rows, 200,000 keys
    python benchmarks/operator_reads.py --finished 200000 --keys 50000

One claimable model with queues and a concurrency key (``tests.support.flowapp.KeyedErrand``,
``key_rate_limit = "5/m"``) gets ``--finished`` finished rows (``--failed-pct`` of them
``failed``, the rest ``done``; one ``INSERT … SELECT generate_series``), ``--ready``
ready rows, and a ring of 5 slots for each of ``--keys`` keys, every slot last used an
hour ago (a key used once, long ago), plus ``--busy`` keys with starts in the current
window; the per-minute history the workers would have written for the finished rows;
then ``VACUUM ANALYZE`` (as autovacuum would). Timed,
median of ``--repeat`` after one warm-up:

- for the model alone (the figures of the goal, ≤ 100 ms): **scrape**, the gauges of
  ``KeyedErrand`` as Prometheus text (``render(collect([KeyedErrand]))``, what the view
  does per model); **dashboard**, the admin dashboard (``admin:taskclaim_dashboard``) of a
  staff user who may view that model only; **stats**, ``manage.py taskclaim_stats
  flowapp.KeyedErrand``, and with ``--exact`` (which counts every row);
- for every claimable model of the test settings (about 40, nearly all empty: the cost
  of the project's models, not of the history): the Prometheus view (``GET``, bearer
  token), a superuser's dashboard, ``taskclaim_stats``.

First with every idle ring in the table, then after the worker's maintenance pruned the
idle rings (:func:`~django_taskclaim.flow.rate_prune.prune_idle_rings`, as one worker
runs it once per reap interval; timed too); then with a partial index over the failed
rows as well (docs/observability.md). PostgreSQL only (127.0.0.1:5432,
``TASKCLAIM_BENCH_PG_URL``), in a dedicated ``taskclaim_bench_operator`` database dropped
and made anew (``--db`` to name another). A table on stdout, JSON under ``var/``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from io import StringIO
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
VAR = ROOT / "var"
sys.path.insert(0, str(ROOT))

from benchmarks.timing import median_ms  # noqa: E402

TARGET_MS = 100.0
TOKEN = "bench-token"


def log(msg: str) -> None:
    print(msg, flush=True)


def _load(finished: int, failed_pct: int, ready: int, keys: int, busy: int, slots: int) -> float:
    """Insert the history and the rings (benchmark only: raw SQL through a cursor)."""
    from django.db import connection

    t0 = time.perf_counter()
    step = 1_000_000
    with connection.cursor() as cur:
        for start in range(0, finished, step):
            count = min(step, finished - start)
            cur.execute(
                "INSERT INTO flowapp_keyederrand (status, version, locked_by, attempts,"
                " priority, created_at, finished_at, last_error, queue_name, customer_id,"
                " work)"
                " SELECT CASE WHEN g %% 100 < %s THEN 'failed' ELSE 'done' END, 2, '', 1, 0,"
                " now() - interval '2 hours' + g * interval '1 ms',"
                " now() - interval '1 hour' + g * interval '1 ms', '', 'q' || (g %% 4),"
                " g %% %s, 0 FROM generate_series(%s::bigint, %s::bigint) g",
                [failed_pct, max(keys, 1), start + 1, start + count],
            )
            log(f"  history: {start + count:,} / {finished:,} rows")
        cur.execute(
            "INSERT INTO flowapp_keyederrand (status, version, locked_by, attempts, priority,"
            " last_error, queue_name, customer_id, work)"
            " SELECT 'ready', 1, '', 0, 0, '', 'q' || (g %% 4), g, 0"
            " FROM generate_series(1, %s) g",
            [ready],
        )
        # Every key's ring, used once an hour ago; the busy keys' used now.
        cur.execute(
            "INSERT INTO taskclaim_rateslot (model, scope, slot, last_start)"
            " SELECT 'flowapp.KeyedErrand', 'key:' || k, s, now() - interval '1 hour'"
            " FROM generate_series(1, %s) k, generate_series(0, %s) s",
            [keys, slots - 1],
        )
        cur.execute(
            "INSERT INTO taskclaim_rateslot (model, scope, slot, last_start)"
            " SELECT 'flowapp.KeyedErrand', 'key:busy' || k, s, now()"
            " FROM generate_series(1, %s) k, generate_series(0, %s) s",
            [busy, slots - 1],
        )
        # The per-minute history the workers would have written for these rows (what
        # the dashboard's charts and "done, last N min" read).
        cur.execute(
            "INSERT INTO taskclaim_taskhistory (model, queue, minute, done, failed)"
            " SELECT 'flowapp.KeyedErrand', queue_name, date_trunc('minute', finished_at),"
            " count(*) FILTER (WHERE status = 'done'), count(*) FILTER (WHERE status = 'failed')"
            " FROM flowapp_keyederrand WHERE finished_at IS NOT NULL GROUP BY 2, 3"
        )
        cur.execute("VACUUM ANALYZE taskclaim_taskhistory")
        cur.execute("VACUUM ANALYZE flowapp_keyederrand")
        cur.execute("VACUUM ANALYZE taskclaim_rateslot")
    return time.perf_counter() - t0


def _refresh_busy() -> None:
    """The busy keys' starts moved to now: in the window while the case is timed."""
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute(
            "UPDATE taskclaim_rateslot SET last_start = now() WHERE scope LIKE 'key:busy%%'"
        )


def _measure(case: str, repeat: int) -> dict[str, Any]:
    from django.contrib.auth import get_user_model
    from django.core.management import CommandError, call_command
    from django.test import Client
    from django.urls import reverse

    from django_taskclaim.ops.metrics.exposition import render
    from django_taskclaim.ops.metrics.gauges import collect
    from tests.support.flowapp.models import KeyedErrand

    _refresh_busy()
    users = get_user_model().objects
    everything, one_model = Client(), Client()
    everything.force_login(users.get(username="bench"))
    one_model.force_login(users.get(username="operator"))
    scraper = Client(HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    dashboard_url = reverse("admin:taskclaim_dashboard")

    def scrape_model() -> None:
        if "taskclaim_rate_limit" not in render(collect([KeyedErrand])):
            raise SystemExit("the gauges have no rate limit")

    def scrape_view() -> None:
        response = scraper.get("/metrics/taskclaim")
        if response.status_code != 200 or b"taskclaim_rate_limit" not in response.content:
            raise SystemExit(f"the scrape answered {response.status_code} without the rings")

    def dashboard(client: Client) -> Callable[[], None]:
        def get() -> None:
            response = client.get(dashboard_url)
            if response.status_code != 200 or b"taskclaim-rate-limits" not in response.content:
                raise SystemExit(f"the dashboard answered {response.status_code} without rings")

        return get

    def stats(*args: str) -> None:
        out = StringIO()
        call_command("taskclaim_stats", *args, stdout=out)
        if "rate limits" not in out.getvalue():
            raise SystemExit("taskclaim_stats printed no rate limit")

    label = "flowapp.KeyedErrand"
    row: dict[str, Any] = {"case": case}
    for name, fn in (
        ("scrape", scrape_model),
        ("dashboard", dashboard(one_model)),
        ("stats", lambda: stats(label)),
        ("stats_exact", lambda: stats(label, "--exact")),
        ("scrape_view_all", scrape_view),
        ("dashboard_all", dashboard(everything)),
        ("stats_all", stats),
    ):
        try:
            row[f"{name}_ms"], row[f"{name}_runs_ms"] = median_ms(fn, repeat)
        except CommandError:  # an older tree: taskclaim_stats without --exact
            row[f"{name}_ms"], row[f"{name}_runs_ms"] = float("nan"), []
    row["met"] = all(row[f"{n}_ms"] <= TARGET_MS for n in ("scrape", "dashboard", "stats"))
    log(
        f"{case:<26} the model: scrape {row['scrape_ms']:>7.1f}  dashboard "
        f"{row['dashboard_ms']:>7.1f}  stats {row['stats_ms']:>7.1f}  --exact "
        f"{row['stats_exact_ms']:>7.1f} ms; all models: view {row['scrape_view_all_ms']:>7.1f}"
        f"  dashboard {row['dashboard_all_ms']:>7.1f}  stats {row['stats_all_ms']:>7.1f} ms"
    )
    return row


def _slot_rows() -> int:
    from django_taskclaim.models import RateSlot

    return RateSlot.objects.count()


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--finished", type=int, default=1_000_000)
    parser.add_argument("--failed-pct", type=int, default=1, help="of the finished rows")
    parser.add_argument("--ready", type=int, default=1_000)
    parser.add_argument("--keys", type=int, default=200_000)
    parser.add_argument("--busy", type=int, default=50)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--db", default="taskclaim_bench_operator")
    parser.add_argument("--keep", action="store_true", help="Do not drop the database.")
    args = parser.parse_args()
    from benchmarks import suite_db

    suite_db.setup(args.db)
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.db import connection, connections
    from django.test.utils import override_settings

    from tests.flow.test_rate_limits import claim_meta
    from tests.support.flowapp.models import KeyedErrand

    get_user_model().objects.create_superuser("bench", "bench@example.com", "x")
    from django.contrib.auth.models import Permission

    operator = get_user_model().objects.create_user("operator", is_staff=True)
    operator.user_permissions.add(
        Permission.objects.get(codename="view_keyederrand", content_type__app_label="flowapp")
    )
    slots = 5
    log(
        f"operator reads: {args.finished:,} finished rows ({args.failed_pct} % failed), "
        f"{args.ready:,} ready, {args.keys:,} idle keys ({args.keys * slots:,} slot rows, "
        f"used an hour ago), {args.busy} busy keys; key_rate_limit 5/m; "
        f"median of {args.repeat}"
    )
    load_s = _load(args.finished, args.failed_pct, args.ready, args.keys, args.busy, slots)
    log(f"  loaded in {load_s:.0f} s (+ VACUUM ANALYZE)")
    rows = []
    prune: dict[str, Any] = {}
    with (
        claim_meta(KeyedErrand, key_rate_limit=f"{slots}/m"),
        override_settings(
            ROOT_URLCONF="tests.support.metrics_urls",
            TASKCLAIM_METRICS_TOKEN=TOKEN,
            ALLOWED_HOSTS=[*settings.ALLOWED_HOSTS, "testserver"],
        ),
    ):
        rows.append(_measure(f"{_slot_rows():,} slot rows", args.repeat))
        try:
            from django_taskclaim.flow.rate_prune import prune_idle_rings
        except ImportError:
            log("  (no pruning in this tree)")
        else:
            t0 = time.perf_counter()
            removed, calls = 0, 0
            while True:  # one call per reap interval in a worker; here back to back
                calls += 1
                step = prune_idle_rings([KeyedErrand], using="default")
                removed += step
                if not step:
                    break
            seconds = round(time.perf_counter() - t0, 2)
            prune = {"seconds": seconds, "removed": removed, "calls": calls}
            log(f"  pruned {removed:,} slot rows in {seconds:.1f} s ({calls} calls)")
            with connection.cursor() as cur:
                cur.execute("VACUUM ANALYZE taskclaim_rateslot")
            rows.append(_measure(f"pruned: {_slot_rows():,} slot rows", args.repeat))
        with connection.cursor() as cur:
            # What docs/observability.md suggests where failed rows pile up: their count
            # read through a partial index instead of a scan of the table.
            cur.execute(
                "CREATE INDEX bench_keyederrand_failed ON flowapp_keyederrand (queue_name)"
                " WHERE status = 'failed'"
            )
            cur.execute("ANALYZE flowapp_keyederrand")
        rows.append(_measure("and a failed-rows index", args.repeat))
        with connection.cursor() as cur:
            cur.execute("SELECT pg_table_size('flowapp_keyederrand')")
            table_mb = cur.fetchone()[0] // (1024 * 1024)
        server = connection.pg_version
    result = {
        "benchmark": "operator_reads",
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "server": server,
        "args": vars(args),
        "load_s": round(load_s, 1),
        "table_mb": table_mb,
        "prune": prune,
        "target_ms": TARGET_MS,
        "cases": rows,
    }
    VAR.mkdir(exist_ok=True)
    path = VAR / f"bench-operator-reads-{datetime.now(UTC):%Y%m%dT%H%M%S}.json"
    path.write_text(json.dumps(result, indent=2))
    log("")
    log(
        "| case | scrape ms | dashboard ms | taskclaim_stats ms | stats --exact ms | ≤ 100 ms "
        "| all models: scrape view ms | dashboard ms | stats ms |"
    )
    log("|---|---:|---:|---:|---:|---|---:|---:|---:|")
    for r in rows:
        log(
            f"| {r['case']} | {r['scrape_ms']:.1f} | {r['dashboard_ms']:.1f} | "
            f"{r['stats_ms']:.1f} | {r['stats_exact_ms']:.1f} | "
            f"{'met' if r['met'] else 'NOT MET'} | {r['scrape_view_all_ms']:.1f} | "
            f"{r['dashboard_all_ms']:.1f} | {r['stats_all_ms']:.1f} |"
        )
    log(f"table {table_mb} MB; JSON: {path}")
    for conn in connections.all():
        conn.close()
    if not args.keep:
        suite_db.drop(args.db)


if __name__ == "__main__":
    main()
