#!/usr/bin/env python
"""How fast a fleet drains rows recovered from dead workers, against fresh rows.

    python benchmarks/recovery.py [--workers 4] [--rows 2000] [--rounds 3] [--timeout 600]

One ``taskclaim_worker benchapp.BenchTask --processes N --concurrency 4 --batch 100``
fleet (no-op bodies, ``--no-reap``) on the PostgreSQL server at 127.0.0.1:5432, in a
database of its own (``taskclaim_bench_recovery``, created and dropped by this script).
Each round inserts ``--rows`` rows in the state a mass crash leaves them in, times the
fleet's drain of them, then does the same with as many rows recovered on their last two
attempts (3 of ``BenchTask``'s 5 used: each runs alone in its process) and with as many
fresh rows.

The recovered state is written directly, as the reaper writes it after every worker was
SIGKILLed (or as a supervisor writes it for a child it saw die): ``status = ready``,
``attempts = 1`` (the attempt that was lost), ``locked_until`` kept at the end of that
lost lease (here one second in the past), ``last_error`` saying why (the "alone" rows:
``attempts = 3``, as after three crashes). A claim tells a
recovered row only by that ``locked_until`` on a ready row
(:func:`django_taskclaim.claim.was_recovered`), so the worker's path is the one
it takes after a real crash, without the minutes of leases and kills it would cost to
get 2,000 rows there for real. Fresh rows are the same rows with ``locked_until`` NULL
and ``attempts = 0``.

Each phase starts with one ``pg_notify`` (the fleet wakes at once) and ends when every
row is ``done``; its rate is rows / (last ``finished_at`` − the insert's commit), both
on the database clock. The figure is the median over ``--rounds`` of recovered and fresh
rates and of their ratio. A table on stdout, JSON under ``benchmarks/results/``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
DB = "taskclaim_bench_recovery"
TABLE = "benchapp_benchtask"
HOST, PORT = "127.0.0.1", 5432


def connect(dbname: str = DB) -> psycopg.Connection:
    return psycopg.connect(host=HOST, port=PORT, user="postgres", dbname=dbname, autocommit=True)


def one(conn: psycopg.Connection, sql: str, params: list | None = None) -> Any:
    """The one row ``sql`` returns."""
    row = conn.execute(sql, params).fetchone()
    assert row is not None
    return row


def insert(conn: psycopg.Connection, n: int, *, attempts: int) -> tuple[int, float]:
    """Insert ``n`` rows in one statement and wake the fleet: recovered after
    ``attempts`` lost attempts, or fresh (0); return the first new id and the commit time
    (database clock, epoch seconds)."""
    first = one(conn, f"SELECT coalesce(max(id), 0) + 1 FROM {TABLE}")[0]
    if attempts:
        values = f"{attempts}, {attempts}, now() - interval '1 second', 'worker lost'"
    else:
        values = "0, 0, NULL, ''"
    conn.execute(
        f"INSERT INTO {TABLE} (status, version, attempts, locked_until, last_error, "
        "locked_by, priority, created_at, stamp) "
        f"SELECT 'ready', {values}, '', 0, now(), false FROM generate_series(1, %s)",
        [n],
    )
    at = one(conn, "SELECT extract(epoch FROM clock_timestamp())")[0]
    conn.execute("SELECT pg_notify('taskclaim', 'benchapp.BenchTask')")
    return first, float(at)


def drain(conn: psycopg.Connection, first: int, n: int, began: float, timeout: float) -> dict:
    """Wait until the ``n`` rows from ``first`` are done (or ``timeout``); their rate."""
    deadline = time.monotonic() + timeout
    while True:
        done, last, charged = one(
            conn,
            f"SELECT count(*), extract(epoch FROM max(finished_at)), "
            f"count(*) FILTER (WHERE attempts > 4) FROM {TABLE} "
            "WHERE id >= %s AND id < %s AND status = 'done'",
            [first, first + n],
        )
        if done == n or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    if done < n:  # timed out: the rate so far
        last = one(conn, "SELECT extract(epoch FROM clock_timestamp())")[0]
    span = float(last) - began if last is not None else timeout
    return {
        "rows": n,
        "done": done,
        "seconds": round(span, 3),
        "rows_per_s": round(done / span, 1) if span > 0 else 0.0,
        "charged_5": charged,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=4, help="worker processes")
    parser.add_argument("--rows", type=int, default=2000, help="rows per phase")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--timeout", type=float, default=600, help="seconds per phase at most")
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()

    with connect("postgres") as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
        admin.execute(f"CREATE DATABASE {DB}")
    env = dict(os.environ)
    env.update(
        DJANGO_SETTINGS_MODULE="benchmarks.settings",
        PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""),
        TASKCLAIM_BENCH_PG_URL=f"postgres://postgres@{HOST}:{PORT}/{DB}",
        TASKCLAIM_BENCH_DB_NAME=DB,
        TASKCLAIM_BENCH_NO_MARIADB="1",
    )
    django = [sys.executable, "-W", "ignore", "-m", "django"]
    log = tempfile.TemporaryFile()  # noqa: SIM115 - closed below
    worker = None
    rounds = []
    try:
        subprocess.run([*django, "migrate", "--run-syncdb", "-v0"], env=env, check=True)
        worker = subprocess.Popen(
            [*django, "taskclaim_worker", "benchapp.BenchTask", "--processes", str(args.workers),
             "--concurrency", str(args.concurrency), "--batch", str(args.batch), "--no-reap"],
            env=env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        with connect() as conn:
            first, at = insert(conn, args.workers * 50, attempts=0)  # warm-up
            drain(conn, first, args.workers * 50, at, args.timeout)
            for number in range(1, args.rounds + 1):
                phases = {}
                for phase, attempts in (("recovered", 1), ("alone", 3), ("fresh", 0)):
                    first, at = insert(conn, args.rows, attempts=attempts)
                    phases[phase] = drain(conn, first, args.rows, at, args.timeout)
                fresh = phases["fresh"]["rows_per_s"] or float("nan")
                rounds.append(
                    {"round": number, **phases,
                     "ratio": round(phases["recovered"]["rows_per_s"] / fresh, 3),
                     "alone_ratio": round(phases["alone"]["rows_per_s"] / fresh, 3)}
                )  # fmt: skip
                print(json.dumps(rounds[-1]), file=sys.stderr)
    finally:
        if worker is not None:
            worker.send_signal(signal.SIGTERM)
            try:
                worker.wait(60)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait()
        log.seek(0)
        tail = log.read().decode(errors="replace")[-2000:]
        log.close()
        with connect("postgres") as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")

    med = {
        "recovered": statistics.median(r["recovered"]["rows_per_s"] for r in rounds),
        "alone": statistics.median(r["alone"]["rows_per_s"] for r in rounds),
        "fresh": statistics.median(r["fresh"]["rows_per_s"] for r in rounds),
        "ratio": statistics.median(r["ratio"] for r in rounds),
        "alone_ratio": statistics.median(r["alone_ratio"] for r in rounds),
    }
    print(
        f"\n{args.workers} processes x --concurrency {args.concurrency} --batch {args.batch}, "
        f"{args.rows} rows per phase, no-op bodies\n"
    )
    print(
        "| round | recovered rows/s | fresh rows/s | recovered / fresh | "
        "alone rows/s | alone / fresh |"
    )
    print("|---:|---:|---:|---:|---:|---:|")

    def rate(phase: dict) -> str:
        partial = f" ({phase['done']} of {phase['rows']})" if phase["done"] < phase["rows"] else ""
        return f"{phase['rows_per_s']:,.1f}{partial}"

    for r in rounds:
        print(
            f"| {r['round']} | {rate(r['recovered'])} | {rate(r['fresh'])} | {r['ratio']:.0%} "
            f"| {rate(r['alone'])} | {r['alone_ratio']:.0%} |"
        )
    print(
        f"| median | {med['recovered']:,.1f} | {med['fresh']:,.1f} | {med['ratio']:.0%} "
        f"| {med['alone']:,.1f} | {med['alone_ratio']:.0%} |"
    )
    if any(r[p]["charged_5"] for r in rounds for p in ("recovered", "alone", "fresh")):
        print("\nrows done at their fifth attempt: see the JSON")
    if any(r[p]["done"] < r[p]["rows"] for r in rounds for p in ("recovered", "alone", "fresh")):
        print(f"\nworker log (tail):\n{tail}")
    result = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "load": os.getloadavg(),
        },
        "command": " ".join(sys.argv),
        "workers": args.workers,
        "concurrency": args.concurrency,
        "batch": args.batch,
        "rows": args.rows,
        "rounds": rounds,
        "median": med,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    target = args.output or RESULTS / f"recovery-{datetime.now(UTC):%Y%m%dT%H%M%S}.json"
    target.write_text(json.dumps(result, indent=2))
    print(f"\nJSON: {target.relative_to(ROOT) if target.is_relative_to(ROOT) else target}")


if __name__ == "__main__":
    main()
