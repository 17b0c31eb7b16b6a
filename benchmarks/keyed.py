#!/usr/bin/env python
"""Throughput with a concurrency key beside the same rows without one, same run.

    python benchmarks/keyed.py                      # 5,000 rows, 50 keys, 4 workers
    python benchmarks/keyed.py --rows 20000 --workers 8 --repeat 3

Three models with the same fields and the same task body (a ledger row written at the
start and stamped at the end, database clock): ``PlainJob`` (no key), ``KeyedJob``
(``concurrency_key``, limit 1) and ``PairJob`` (limit 2). For each, the rows are
enqueued, then real ``taskclaim_worker`` processes drain them; throughput is rows over
the span from the first start to the last end in the ledger, so process start-up is not
counted. The ledger is also checked: no key ever had more holders than its limit.

PostgreSQL only (the server at 127.0.0.1:5432, ``TASKCLAIM_BENCH_PG_URL`` to override),
in a dedicated ``taskclaim_bench_keyed`` database. A table on stdout, JSON under
``var/``. Compare the three figures of one run only: the machine is shared and noisy.
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
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
VAR = ROOT / "var"
DB_NAME = "taskclaim_bench_keyed"
sys.path.insert(0, str(ROOT))
os.environ["DJANGO_SETTINGS_MODULE"] = "tests.support.settings"
os.environ["TASKCLAIM_TEST_DB"] = "postgres"
os.environ["TASKCLAIM_TEST_DB_NAME"] = DB_NAME

import django  # noqa: E402
import psycopg  # noqa: E402


def _create_database() -> None:
    url = os.environ.get("TASKCLAIM_BENCH_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
    with psycopg.connect(url, autocommit=True) as conn:
        found = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DB_NAME,))
        if not found.fetchone():
            conn.execute(f'CREATE DATABASE "{DB_NAME}"')


_create_database()
django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402

from tests.support.keyedapp.models import KeyedJob, KeyRun, PairJob, PlainJob  # noqa: E402

MODELS = [("no key", PlainJob, None), ("key, limit 1", KeyedJob, 1), ("key, limit 2", PairJob, 2)]


def log(msg: str) -> None:
    print(msg, flush=True)


def _max_holders(model: Any) -> int:
    """The most runs of one key that overlapped, by the ledger."""
    events: dict[Any, list[tuple[Any, int]]] = defaultdict(list)
    for key, start, end in KeyRun.objects.filter(model=model._meta.model_name).values_list(
        "key", "started_at", "ended_at"
    ):
        events[key] += [(start, 1), (end, -1)]
    peak = 0
    for ev in events.values():
        now = 0
        for _, step in sorted(ev, key=lambda e: (e[0], e[1])):
            now += step
            peak = max(peak, now)
    return peak


def one_run(model: Any, *, rows: int, keys: int, workers: int, args: list[str]) -> dict[str, Any]:
    model.objects.all().delete()
    KeyRun.objects.filter(model=model._meta.model_name).delete()
    model.objects.bulk_create(model(customer_id=i % keys) for i in range(rows))
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "django", "taskclaim_worker", model._meta.label, *args],
            env=env,
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(workers)
    ]
    deadline = time.monotonic() + 1800
    try:
        while model.objects.done().count() < rows:
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                raise SystemExit(f"{model._meta.label}: workers stopped or timed out")
            time.sleep(0.25)  # a progress poll of the benchmark, not a synchronisation
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(60)
    span = KeyRun.objects.filter(model=model._meta.model_name)
    first = span.order_by("started_at").values_list("started_at", flat=True)[0]
    last = span.order_by("-ended_at").values_list("ended_at", flat=True)[0]
    seconds = (last - first).total_seconds()
    return {"seconds": seconds, "per_second": rows / seconds, "max_holders": _max_holders(model)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=5000)
    parser.add_argument("--keys", type=int, default=50)
    parser.add_argument("--workers", type=int, default=4, help="worker processes")
    parser.add_argument("--concurrency", type=int, default=2, help="threads per worker")
    parser.add_argument("--batch", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=1)
    opts = parser.parse_args()
    call_command("migrate", verbosity=0)
    args = [
        "--concurrency", str(opts.concurrency), "--batch", str(opts.batch),
        "--poll", "0.05", "--ack-window", "0",
    ]  # fmt: skip
    results: dict[str, Any] = {}
    for name, model, limit in MODELS:
        runs = [
            one_run(model, rows=opts.rows, keys=opts.keys, workers=opts.workers, args=args)
            for _ in range(opts.repeat)
        ]
        results[name] = {
            "model": model._meta.label,
            "limit": limit,
            "per_second": statistics.median(r["per_second"] for r in runs),
            "max_holders": max(r["max_holders"] for r in runs),
            "runs": runs,
        }
        log(f"  {name}: {results[name]['per_second']:.0f} rows/s")
    base = results["no key"]["per_second"]
    log("")
    log(f"{'model':<16}{'limit':>6}{'rows/s':>10}{'vs no key':>11}{'max holders/key':>17}")
    for name, r in results.items():
        limit = "-" if r["limit"] is None else str(r["limit"])
        log(
            f"{name:<16}{limit:>6}{r['per_second']:>10.0f}{r['per_second'] / base:>10.0%}"
            f"{r['max_holders']:>17}"
        )
    VAR.mkdir(exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out = VAR / f"bench-keyed-{stamp}.json"
    out.write_text(
        json.dumps(
            {
                "when": stamp,
                "host": platform.node(),
                "cpus": os.cpu_count(),
                "database": f"PostgreSQL {connection.pg_version}",
                "options": vars(opts),
                "results": results,
            },
            indent=2,
        )
    )
    log(f"\nJSON: {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
