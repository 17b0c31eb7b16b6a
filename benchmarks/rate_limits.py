#!/usr/bin/env python
"""A rate-limited model reaches its limit when the backlog allows, and never exceeds it.

    python benchmarks/rate_limits.py                     # 100/s, 300/s, 500/2s; 10 s each
    python benchmarks/rate_limits.py --rates 50/s 2000/s --seconds 20 --workers 8

For each rate, ``testapp.Document`` gets ``ClaimMeta.rate_limit`` (in the worker
processes, through the test entry point), a backlog of ``rate × (seconds + 1)`` rows is
enqueued, and real ``taskclaim_worker`` processes drain it. Each task body records its
claim time (the database clock value its claim wrote the lease from) at once. From that
ledger: the starts in the whole windows from the first start (each may hold at most
``N``) as a share of the limit (target ≥ 95 %), and the busiest sliding window (must
be ≤ ``N``). The same fleet and body without a limit is run first: a limit above what
the machine allows cannot be reached and is marked ``n/a``.

PostgreSQL by default (the server at 127.0.0.1:5432); ``TASKCLAIM_TEST_DB=mariadb`` or
``sqlite`` for the others. A dedicated ``taskclaim_bench_rate`` database. A table on
stdout, JSON under ``var/``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
VAR = ROOT / "var"
DB_NAME = "taskclaim_bench_rate"
sys.path.insert(0, str(ROOT))
os.environ["DJANGO_SETTINGS_MODULE"] = "tests.support.settings"
os.environ.setdefault("TASKCLAIM_TEST_DB", "postgres")
VENDOR = os.environ["TASKCLAIM_TEST_DB"]
if VENDOR == "sqlite":
    os.environ["TASKCLAIM_TEST_DB_NAME"] = str(VAR / f"{DB_NAME}.sqlite3")
else:
    os.environ["TASKCLAIM_TEST_DB_NAME"] = DB_NAME

import django  # noqa: E402


def _create_database() -> None:
    if VENDOR == "postgres":
        import psycopg

        url = os.environ.get(
            "TASKCLAIM_BENCH_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
        )
        with psycopg.connect(url, autocommit=True) as conn:
            found = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DB_NAME,))
            if not found.fetchone():
                conn.execute(f'CREATE DATABASE "{DB_NAME}"')
    elif VENDOR in ("mariadb", "mysql"):
        import MySQLdb

        conn = MySQLdb.connect(host="127.0.0.1", port=3306, user="root")
        conn.cursor().execute(f"CREATE DATABASE IF NOT EXISTS `{DB_NAME}` CHARACTER SET utf8mb4")
        conn.close()


_create_database()
django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402

from django_taskclaim.config.rate_limits import parse_rate  # noqa: E402
from django_taskclaim.models import RateSlot  # noqa: E402
from tests.support.keyedapp.models import KeyRun  # noqa: E402
from tests.support.testapp.models import Document  # noqa: E402

LEASE = 60.0
TARGET = 0.95


def log(msg: str) -> None:
    print(msg, flush=True)


def busiest(starts: list[datetime], window: float) -> int:
    """The most starts in any window ``[t, t + window)``."""
    best, low, span = 0, 0, timedelta(seconds=window)
    for high, t in enumerate(starts):
        while t - starts[low] >= span:
            low += 1
        best = max(best, high - low + 1)
    return best


def one_run(rate: str, *, seconds: float, workers: int, args: list[str]) -> dict[str, Any]:
    count, window = parse_rate(rate, "--rates")
    rows = int(count / window * seconds) + count
    Document.objects.all().delete()
    KeyRun.objects.all().delete()
    RateSlot.objects.all().delete()
    Document.objects.bulk_create(Document() for _ in range(rows))
    meta = {
        "rate_limit": rate,
        "lease": LEASE,
        "handler": "tests.support.rate_handlers.record_start",
    }
    env = dict(
        os.environ,
        PYTHONPATH=str(ROOT),
        PYTHONUNBUFFERED="1",
        TASKCLAIM_T_CLAIMMETA=json.dumps(meta),
    )
    argv = [sys.executable, "-m", "tests.support.worker_entry", "taskclaim_worker"]
    procs = [
        subprocess.Popen(
            [*argv, "testapp.Document", *args],
            env=env,
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(workers)
    ]
    deadline = time.monotonic() + seconds * 4 + 120
    try:
        while Document.objects.done().count() < rows:
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                raise SystemExit(f"{rate}: workers stopped or timed out")
            time.sleep(0.25)  # a progress poll of the benchmark, not a synchronisation
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(60)
    lease = timedelta(seconds=LEASE)
    starts = sorted(u - lease for u in KeyRun.objects.values_list("claimed_until", flat=True))
    # Whole windows from the first start, all while the backlog lasted: at most N starts
    # each, so the share of the limit is at most 100 %.
    whole = int((starts[-1] - starts[0]).total_seconds() // window)
    end = starts[0] + timedelta(seconds=whole * window)
    inside = sum(1 for t in starts if t < end)
    limit_per_second = count / window
    per_second = inside / (whole * window) if whole else 0.0
    return {
        "rate": rate,
        "rows": rows,
        "limit_per_second": limit_per_second,
        "per_second": per_second,
        "share": per_second / limit_per_second,
        "busiest_window": busiest(starts, window),
        "limit": count,
        "windows": whole,
    }


def capacity(*, workers: int, args: list[str]) -> float:
    """Starts per second of the same fleet and body without a limit (what the machine
    allows: a limit above it cannot be reached)."""
    rows = 3000
    Document.objects.all().delete()
    KeyRun.objects.all().delete()
    Document.objects.bulk_create(Document() for _ in range(rows))
    env = dict(
        os.environ,
        PYTHONPATH=str(ROOT),
        TASKCLAIM_T_CLAIMMETA=json.dumps(
            {"lease": LEASE, "handler": "tests.support.rate_handlers.record_start"}
        ),
    )
    argv = [sys.executable, "-m", "tests.support.worker_entry", "taskclaim_worker"]
    procs = [
        subprocess.Popen(
            [*argv, "testapp.Document", *args],
            env=env,
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(workers)
    ]
    try:
        while Document.objects.done().count() < rows:
            time.sleep(0.25)  # a progress poll of the benchmark, not a synchronisation
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(60)
    lease = timedelta(seconds=LEASE)
    starts = sorted(u - lease for u in KeyRun.objects.values_list("claimed_until", flat=True))
    return len(starts) / max((starts[-1] - starts[0]).total_seconds(), 1e-6)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", nargs="+", default=["100/s", "300/s", "500/2s"])
    parser.add_argument("--seconds", type=float, default=10.0, help="steady seconds per run")
    parser.add_argument("--workers", type=int, default=4, help="worker processes")
    parser.add_argument("--concurrency", type=int, default=8, help="threads per worker")
    parser.add_argument("--batch", type=int, default=10)
    opts = parser.parse_args()
    call_command("migrate", verbosity=0)
    args = [
        "--concurrency", str(opts.concurrency), "--batch", str(opts.batch),
        "--poll", "0.5", "--ack-window", "0.05",
    ]  # fmt: skip
    ceiling = capacity(workers=opts.workers, args=args)
    log(f"  no limit: {ceiling:.0f} starts/s (this fleet and body on this machine)")
    results = []
    for rate in opts.rates:
        r = one_run(rate, seconds=opts.seconds, workers=opts.workers, args=args)
        results.append(r)
        log(f"  {rate}: {r['per_second']:.0f} starts/s ({r['share']:.1%} of the limit)")
    log("")
    log(f"{'limit':<10}{'starts/s':>10}{'of limit':>10}{'target':>8}{'busiest window':>16}")
    for r in results:
        if r["limit_per_second"] > ceiling * TARGET:
            ok = "n/a"  # the fleet cannot go that fast here, limit or not
        else:
            ok = "ok" if r["share"] >= TARGET else "MISS"
        if r["busiest_window"] > r["limit"]:
            ok = "OVER"
        log(
            f"{r['rate']:<10}{r['per_second']:>10.0f}{r['share']:>10.1%}{ok:>8}"
            f"{r['busiest_window']:>10} ≤ {r['limit']}"
        )
    VAR.mkdir(exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out = VAR / f"bench-rate-limits-{stamp}.json"
    out.write_text(
        json.dumps(
            {
                "when": stamp,
                "host": platform.node(),
                "cpus": os.cpu_count(),
                "database": connection.vendor,
                "options": vars(opts),
                "target_share": TARGET,
                "no_limit_per_second": ceiling,
                "results": results,
            },
            indent=2,
        )
    )
    log(f"\nJSON: {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
