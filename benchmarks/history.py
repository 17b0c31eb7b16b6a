#!/usr/bin/env python
"""Claim latency and throughput with a long history of finished rows, and without it.

    python benchmarks/history.py                          # 1,000,000 finished rows
    python benchmarks/history.py --finished 50000000      # the 50 M case (~1 h, ~20 GB)

One claimable model with an archive (``tests.support.archiveapp.Report``, ``ClaimMeta.archive``)
is measured three times in one run, the same ``--ready`` rows drained each time by
``--processes`` processes that loop ``claim_next()`` + ``complete()`` (each claim timed):

1. **empty** — the table holds no finished rows;
2. **history in table** — ``--finished`` done rows were added (one ``INSERT … SELECT
   generate_series``, then ``VACUUM ANALYZE``, as autovacuum would);
3. **history archived** — those rows were moved to the archive table by
   ``archive_finished()`` (the move is timed: rows/s), then ``VACUUM ANALYZE`` (not
   ``FULL``: the table keeps its size, its pages free for new rows).

For each: claim p50/p99 (ms), throughput (rows/s, from the first claim to the last
completion), ``state_counts()`` (the admin dashboard's query) time, and the sizes of the
table and its indexes. PostgreSQL only (127.0.0.1:5432, ``TASKCLAIM_BENCH_PG_URL``), in a
dedicated ``taskclaim_bench_history`` database dropped and made anew. A table on
stdout, JSON under ``var/``. Compare the cases of one run only: the machine is noisy.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
VAR = ROOT / "var"
DB_NAME = "taskclaim_bench_history"
sys.path.insert(0, str(ROOT))
os.environ["DJANGO_SETTINGS_MODULE"] = "tests.support.settings"
os.environ["TASKCLAIM_TEST_DB"] = "postgres"
os.environ["TASKCLAIM_TEST_DB_NAME"] = DB_NAME

import django  # noqa: E402
import psycopg  # noqa: E402

ADMIN_URL = os.environ.get(
    "TASKCLAIM_BENCH_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)


def log(msg: str) -> None:
    print(msg, flush=True)


def _fresh_database() -> None:
    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{DB_NAME}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{DB_NAME}"')


def child(go: Path, out: Path) -> None:
    """One claimer process: wait for ``go``, then claim and complete until the queue is
    empty; write each claim's latency and the first/last instants."""
    django.setup()
    from tests.support.archiveapp.models import Report

    Report.objects.exists()  # connect before the start
    while not go.exists():
        time.sleep(0.001)
    lat: list[float] = []
    first = time.time()
    while True:
        t0 = time.perf_counter()
        task = Report.objects.claim_next()
        lat.append((time.perf_counter() - t0) * 1000)
        if task is None:
            break
        task.complete()
    out.write_text(json.dumps({"lat": lat[:-1], "first": first, "last": time.time()}))


def _drain(ready: int, processes: int) -> dict[str, Any]:
    from tests.support.archiveapp.models import Report

    Report.objects.bulk_create((Report(title=f"r{i}") for i in range(ready)), batch_size=5000)
    run = VAR / "history-run"
    run.mkdir(parents=True, exist_ok=True)
    go = run / "go"
    go.unlink(missing_ok=True)
    outs = [run / f"out{i}.json" for i in range(processes)]
    for o in outs:
        o.unlink(missing_ok=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [
        subprocess.Popen([sys.executable, __file__, "--child", str(go), str(o)], env=env, cwd=ROOT)
        for o in outs
    ]
    time.sleep(2)  # let the children connect: not a synchronisation, only a warm-up
    go.write_text("go")
    for p in procs:
        if p.wait(timeout=3600) != 0:
            raise SystemExit("a claimer process failed")
    parts = [json.loads(o.read_text()) for o in outs]
    lat = sorted(x for p in parts for x in p["lat"])
    span = max(p["last"] for p in parts) - min(p["first"] for p in parts)
    left = Report.objects.ready().count()
    if left or len(lat) != ready:
        raise SystemExit(f"drain incomplete: {len(lat)} claims, {left} ready left")
    return {
        "claims": len(lat),
        "claim_p50_ms": round(statistics.median(lat), 3),
        "claim_p99_ms": round(lat[int(len(lat) * 0.99) - 1], 3),
        "throughput": round(ready / span, 1),
    }


def _sizes() -> dict[str, Any]:
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute(
            "SELECT pg_table_size('archiveapp_report'), pg_indexes_size('archiveapp_report'),"
            " pg_total_relation_size('archiveapp_reportarchive')"
        )
        table, indexes, archive = cur.fetchone()
    mb = 1024 * 1024
    return {"table_mb": table // mb, "indexes_mb": indexes // mb, "archive_mb": archive // mb}


def _counts_ms() -> float:
    from tests.support.archiveapp.models import Report

    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        Report.objects.state_counts()
        times.append((time.perf_counter() - t0) * 1000)
    return round(statistics.median(times), 1)


def _vacuum() -> None:
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("VACUUM ANALYZE archiveapp_report")


def _measure(case: str, args: argparse.Namespace) -> dict[str, Any]:
    from tests.support.archiveapp.models import Report

    runs = [_drain(args.ready, args.processes) for _ in range(args.repeat)]
    # The drained rows are deleted, so every case starts from the same table.
    Report.objects.filter(title__startswith="r").delete()
    row = {
        "case": case,
        "claim_p50_ms": statistics.median(r["claim_p50_ms"] for r in runs),
        "claim_p99_ms": statistics.median(r["claim_p99_ms"] for r in runs),
        "throughput": statistics.median(r["throughput"] for r in runs),
        "runs": runs,
        "state_counts_ms": _counts_ms(),
        **_sizes(),
    }
    log(
        f"{case:<18} p50 {row['claim_p50_ms']:>7.2f} ms  p99 {row['claim_p99_ms']:>7.2f} ms  "
        f"{row['throughput']:>8.1f} rows/s  counts {row['state_counts_ms']:>9.1f} ms  "
        f"table {row['table_mb']} MB  indexes {row['indexes_mb']} MB  "
        f"archive {row['archive_mb']} MB"
    )
    return row


def _load_history(n: int) -> float:
    from django.db import connection

    t0 = time.perf_counter()
    step = 5_000_000
    with connection.cursor() as cur:
        for start in range(0, n, step):
            count = min(step, n - start)
            cur.execute(
                "INSERT INTO archiveapp_report (status, version, locked_until, locked_by,"
                " attempts, run_after, priority, created_at, finished_at, last_error,"
                " report_title, payload, shelf_id)"
                " SELECT 'done', 2, NULL, 'host:1', 1, NULL, 0,"
                " now() - interval '60 days' + g * interval '10 ms',"
                " now() - interval '30 days' + g * interval '10 ms', '', 'h' || g,"
                " '{\"n\": 1}'::jsonb, NULL"
                " FROM generate_series(%s::bigint, %s::bigint) g",
                [start + 1, start + count],
            )
            log(f"  history: {start + count:,} / {n:,} rows")
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--finished", type=int, default=1_000_000)
    parser.add_argument("--ready", type=int, default=20_000)
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--archive-batch", type=int, default=5000)
    parser.add_argument("--child", nargs=2, metavar=("GO", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(Path(args.child[0]), Path(args.child[1]))
        return
    _fresh_database()
    django.setup()
    from django.core.management import call_command
    from django.db import connection

    from django_taskclaim.recovery.archive import archive_finished
    from tests.support.archiveapp.models import Report, ReportArchive

    call_command("migrate", verbosity=0)
    log(
        f"history benchmark: {args.finished:,} finished rows, {args.ready:,} ready rows "
        f"drained by {args.processes} processes, {args.repeat} repeat(s)"
    )
    rows = [_measure("empty", args)]
    load_s = _load_history(args.finished)
    _vacuum()
    log(f"  history loaded in {load_s:.0f} s (+ VACUUM ANALYZE)")
    rows.append(_measure("history in table", args))
    t0 = time.perf_counter()
    moved = archive_finished(Report, older_than=timedelta(days=1), batch_size=args.archive_batch)
    move_s = time.perf_counter() - t0
    if moved != args.finished or ReportArchive.objects.count() != args.finished:
        raise SystemExit(f"archive moved {moved} rows, expected {args.finished}")
    log(f"  archived {moved:,} rows in {move_s:.0f} s ({moved / move_s:,.0f} rows/s)")
    _vacuum()
    rows.append(_measure("history archived", args))
    result = {
        "benchmark": "history",
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "server": connection.pg_version,
        "args": {k: v for k, v in vars(args).items() if k != "child"},
        "history_load_s": round(load_s, 1),
        "archive_rows_per_s": round(moved / move_s, 1),
        "archive_s": round(move_s, 1),
        "cases": rows,
    }
    VAR.mkdir(exist_ok=True)
    path = VAR / f"bench-history-{datetime.now(UTC):%Y%m%dT%H%M%S}.json"
    path.write_text(json.dumps(result, indent=2))
    log("")
    log("| case | claim p50 ms | claim p99 ms | rows/s | state_counts ms | table MB | indexes MB |")
    log("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        log(
            f"| {r['case']} | {r['claim_p50_ms']:.2f} | {r['claim_p99_ms']:.2f} | "
            f"{r['throughput']:.0f} | {r['state_counts_ms']:.0f} | {r['table_mb']} | "
            f"{r['indexes_mb']} |"
        )
    log(f"archive move: {result['archive_rows_per_s']:,.0f} rows/s; JSON: {path}")


if __name__ == "__main__":
    main()
