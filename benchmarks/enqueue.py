#!/usr/bin/env python
"""The producer's side: rows/s enqueued, and enqueue → start on an idle worker.

    TASKCLAIM_BENCH_DB_NAME=taskclaim_bench_enqueue python benchmarks/enqueue.py
    python benchmarks/enqueue.py --quick                 # smoke run, about a minute
    python benchmarks/enqueue.py --only rate --batches 1 100 1000

Sections (PostgreSQL only, like ``peers.py``):

* rate — rows/s enqueued by one producer thread, per batch size B (a producer that has B
  rows at hand): ``create()`` per row (B rows in one ``atomic()``, B = 1 in autocommit),
  plain ``bulk_create()`` of B instances (no wake-up sent), ``enqueue_many()`` of B dicts
  (one INSERT and one ``NOTIFY`` after the commit) and of B instances, PgQueuer's
  ``Queries.enqueue`` with lists of B (its sync psycopg driver: one statement), and, for
  reference only, a raw ``COPY … FROM STDIN`` of B rows (no primary keys back, no
  wake-up). Also the producer's CPU per row (``time.process_time``: Python + driver).
  The table is truncated before each measurement; figures are medians of --repeat runs.
* latency — enqueue → start on an idle worker (``taskclaim_worker``, 1 process, 1
  thread, batch 1, LISTENing; the row enqueued by ``create()`` — its ``post_save`` hook
  sends the ``NOTIFY`` — and by ``enqueue_many([row])``) and on an idle PgQueuer
  (``pgqueuer.run()``, batch 1, its table trigger), each sample the wall-clock time
  (``time.time()``, one machine: a shared clock) from just before the enqueue call to
  the first line of the task body. --runs runs, each every system in turn, of --samples
  samples each.

Prints Markdown tables; writes JSON to benchmarks/results/enqueue-<time>.json and
var/bench-enqueue.json. Set ``TASKCLAIM_BENCH_DB_NAME`` to keep off other runs' database.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.settings")

from django.db import connections, transaction  # noqa: E402

import benchmarks.run  # noqa: E402, F401  (sets Django up)
from benchmarks.benchapp.models import BenchTask  # noqa: E402
from benchmarks.peers import (  # noqa: E402
    PgQueuerPeer,
    default_driver,
    idle_rss,
    latency_pgq,
    pause,
    pgqueuer_missing,
    pick_alias,
)
from benchmarks.run import (  # noqa: E402
    RESULTS,
    fill,
    idle_worker,
    log,
    machine,
    med,
    pct,
    server_version,
    table,
    table_sql,
    wait_started,
    worker_available,
)
from django_taskclaim import enqueue_many  # noqa: E402

VAR = ROOT / "var"
LATEST = VAR / "bench-enqueue.json"
SECTIONS = ("rate", "latency")
METHODS = (
    "create() per row",
    "bulk_create()",
    "enqueue_many(dicts)",
    "enqueue_many(instances)",
    "PgQueuer Queries.enqueue(lists)",
    "COPY (raw, reference)",
)


# -- section: rate -----------------------------------------------------------------------------


def producers(alias: str, peer: PgQueuerPeer | None) -> dict[str, Callable[[int], None]]:
    """One call enqueues B rows, each way."""
    manager = BenchTask.objects.using(alias)
    table_name = table_sql(alias)

    def create(b: int) -> None:
        if b == 1:
            manager.create()
            return
        with transaction.atomic(using=alias):
            for _ in range(b):
                manager.create()

    def bulk(b: int) -> None:
        manager.bulk_create([BenchTask() for _ in range(b)])

    def many_dicts(b: int) -> None:
        manager.enqueue_many([{} for _ in range(b)])

    def many_objs(b: int) -> None:
        enqueue_many(BenchTask, [BenchTask() for _ in range(b)], using=alias)

    def copy(b: int) -> None:
        conn = connections[alias]
        conn.ensure_connection()
        with (
            conn.connection.cursor() as cur,
            cur.copy(f"COPY {table_name} (stamp) FROM STDIN") as cp,
        ):
            for _ in range(b):
                cp.write_row((False,))
        if not conn.get_autocommit():
            conn.connection.commit()

    ways: dict[str, Callable[[int], None]] = {
        METHODS[0]: create,
        METHODS[1]: bulk,
        METHODS[2]: many_dicts,
        METHODS[3]: many_objs,
    }
    if peer is not None:
        queries = peer.queries

        def pgq(b: int) -> None:
            queries.enqueue(["noop"] * b, [None] * b, [0] * b)

        ways[METHODS[4]] = pgq
    ways[METHODS[5]] = copy
    return ways


def rows_for(batch: int, quick: bool) -> int:
    """Rows per measurement: enough calls to smooth a round trip, few enough for 2 cores."""
    if quick:
        return {1: 300, 100: 3_000}.get(batch, 5_000)
    return {1: 1_500, 100: 15_000}.get(batch, 30_000)


def measure(call: Callable[[int], None], batch: int, rows: int) -> tuple[float, float]:
    """(rows/s, producer CPU ms per row) for ``rows`` rows in calls of ``batch``."""
    calls = max(1, rows // batch)
    cpu0, t0 = time.process_time(), time.perf_counter()
    for _ in range(calls):
        call(batch)
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    n = calls * batch
    return n / wall, cpu * 1000 / n


def bench_rate(args: argparse.Namespace, alias: str, peer: PgQueuerPeer | None) -> dict[str, Any]:
    ways = producers(alias, peer)
    out: dict[str, Any] = {"rows": []}
    for batch in args.batches:
        rows = rows_for(batch, args.quick)
        for name, call in ways.items():
            if name.startswith("COPY") and batch == 1:
                continue  # a COPY per row is not what anyone would send
            rates, cpus = [], []
            for _ in range(args.repeat):
                fill(alias, 0)
                if peer is not None:
                    peer.clean()
                call(batch)  # warm: first statement of this shape
                rate, cpu = measure(call, batch, rows)
                rates.append(rate)
                cpus.append(cpu)
            row = {
                "method": name,
                "batch": batch,
                "rows": rows,
                "rows_per_s": med(rates),
                "runs_rows_per_s": [round(r) for r in rates],
                "cpu_ms_per_row": med(cpus),
            }
            out["rows"].append(row)
            log(
                f"  B={batch:<5} {name:<34} {row['rows_per_s']:>9,.0f} rows/s "
                f"cpu {row['cpu_ms_per_row']:.3f} ms/row"
            )
    fill(alias, 0)
    if peer is not None:
        peer.clean()
    return out


# -- section: latency --------------------------------------------------------------------------


def enqueue_one(alias: str, how: str) -> tuple[int, float]:
    """Enqueue one stamped row ``how`` (``create`` / ``enqueue_many``): (pk, time before)."""
    t0 = time.time()
    if how == "create":
        pk = BenchTask.objects.using(alias).create(stamp=True).pk
    else:
        (row,) = BenchTask.objects.using(alias).enqueue_many([{"stamp": True}])
        pk = row.pk
    return pk, t0


def latency_ours(args: argparse.Namespace, alias: str, how: str, n: int) -> dict[str, Any]:
    fill(alias, 0)
    with idle_worker(alias, notify=True, poll=5.0) as proc:
        rss = idle_rss(proc, args.idle_seconds)
        samples, enqueues = [], []
        for i in range(n):
            pause(i)
            item = enqueue_one(alias, how)
            enqueues.append((time.time() - item[1]) * 1000)
            samples.append(wait_started(alias, item, timeout=30, proc=proc))
    fill(alias, 0)
    return {
        "system": f"taskclaim, {how}()",
        "samples_ms": samples,
        "enqueue_ms": enqueues,
        "idle_rss_mb": rss,
    }


def bench_latency(
    args: argparse.Namespace, alias: str, peer: PgQueuerPeer | None
) -> dict[str, Any]:
    runs: list[list[dict[str, Any]]] = []
    for r in range(args.runs):
        parts = [latency_ours(args, alias, how, args.samples) for how in ("create", "enqueue_many")]
        if peer is not None:
            got = latency_pgq(args, peer, args.samples)
            got["system"] = "PgQueuer, Queries.enqueue"
            parts.append(got)
        for p in parts:
            after = [s - e for s, e in zip(p["samples_ms"], p["enqueue_ms"], strict=True)]
            p.update(
                run=r + 1,
                n=len(p["samples_ms"]),
                p50_ms=pct(p["samples_ms"], 50),
                p95_ms=pct(p["samples_ms"], 95),
                enqueue_p50_ms=pct(p["enqueue_ms"], 50),
                after_enqueue_p50_ms=pct(after, 50),
            )
            log(
                f"  run {r + 1} {p['system']}: p50={p['p50_ms']:.2f} ms p95={p['p95_ms']:.2f} ms "
                f"(enqueue call {p['enqueue_p50_ms']:.2f} ms, then "
                f"{p['after_enqueue_p50_ms']:.2f} ms) idle rss {p['idle_rss_mb']:.1f} MB"
            )
        runs.append(parts)
    return {"runs": runs}


# -- report ------------------------------------------------------------------------------------


def report(data: dict[str, Any]) -> str:
    parts = []
    rate = data.get("rate")
    if rate:
        batches = sorted({r["batch"] for r in rate["rows"]})
        by = {(r["method"], r["batch"]): r for r in rate["rows"]}
        rows = []
        for name in METHODS:
            cells = [name]
            for b in batches:
                r = by.get((name, b))
                cells.append(
                    "—" if r is None else f"{r['rows_per_s']:,.0f} ({r['cpu_ms_per_row']:.3f})"
                )
            if any(c != "—" for c in cells[1:]):
                rows.append(cells)
        parts.append(
            table(
                "Rows/s enqueued by one producer (producer CPU ms per row)",
                ["method", *[f"B = {b:,}" for b in batches]],
                rows,
            )
        )
    lat = data.get("latency")
    if lat:
        rows = []
        for parts_of_run in lat["runs"]:
            for p in parts_of_run:
                rows.append(
                    [
                        p["run"],
                        p["system"],
                        p["n"],
                        f"{p['p50_ms']:.2f}",
                        f"{p['p95_ms']:.2f}",
                        f"{p['enqueue_p50_ms']:.2f}",
                        f"{p['after_enqueue_p50_ms']:.2f}",
                    ]
                )
        parts.append(
            table(
                "enqueue → start on an idle worker (ms, shared wall clock)",
                [
                    "run",
                    "system",
                    "samples",
                    "p50",
                    "p95",
                    "enqueue call p50",
                    "after it p50",
                ],
                rows,
            )
        )
    return "\n".join(parts)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="small sizes, one repeat")
    p.add_argument("--only", nargs="+", choices=SECTIONS, help="sections to run")
    p.add_argument("--batches", nargs="+", type=int, default=[1, 100, 1000])
    p.add_argument("--repeat", type=int, default=None, help="runs per rate figure (3; quick 1)")
    p.add_argument("--runs", type=int, default=None, help="latency runs (3; quick 1)")
    p.add_argument("--samples", type=int, default=None, help="samples per run (200; quick 20)")
    p.add_argument("--idle-seconds", type=float, default=3.0, help="idle time before RSS")
    p.add_argument("--database", help="benchmark database alias (PostgreSQL)")
    p.add_argument("--pgq-driver", choices=("asyncpg", "psycopg"))
    p.add_argument("--output", type=Path)
    p.add_argument("--render", type=Path, help="re-print the tables of a JSON result")
    args = p.parse_args(argv)
    args.repeat = args.repeat or (1 if args.quick else 3)
    args.runs = args.runs or (1 if args.quick else 3)
    args.samples = args.samples or (20 if args.quick else 200)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.render:
        print(report(json.loads(args.render.read_text())))
        return 0
    sections = args.only or list(SECTIONS)
    alias, reason = pick_alias(args)
    if alias is None:
        log(f"enqueue benchmark skipped: {reason}")
        return 0
    worker_reason = worker_available()
    if "latency" in sections and worker_reason:
        log(f"latency skipped: {worker_reason}")
        sections = [s for s in sections if s != "latency"]
    driver = args.pgq_driver or default_driver()
    pgq_reason = pgqueuer_missing(driver)
    peer = None
    if pgq_reason:
        log(f"PgQueuer parts skipped: {pgq_reason}")
    else:
        peer = PgQueuerPeer(alias, driver)
        log(f"PgQueuer {peer.version} ({driver} driver); schema {peer.schema}")
    started = time.monotonic()
    data: dict[str, Any] = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "argv": sys.argv,
        "quick": args.quick,
        "repeat": args.repeat,
        "machine": machine(),
        "server": server_version(alias),
        "database": alias,
        "pgqueuer": {"skipped": pgq_reason}
        if peer is None
        else {"version": peer.version, "driver": peer.driver},
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    VAR.mkdir(parents=True, exist_ok=True)
    stamp = f"{datetime.now(UTC):%Y%m%dT%H%M%S}{'-quick' if args.quick else ''}"
    target = args.output or RESULTS / f"enqueue-{stamp}.json"

    def save() -> None:
        text = json.dumps(data, indent=2, default=str)
        target.write_text(text)
        LATEST.write_text(text)

    try:
        if "rate" in sections:
            log("rows/s enqueued…")
            data["rate"] = bench_rate(args, alias, peer)
            save()
        if "latency" in sections:
            log("enqueue→start on an idle worker…")
            data["latency"] = bench_latency(args, alias, peer)
            save()
    finally:
        fill(alias, 0)
        if peer is not None:
            peer.clean()
            peer.close()
    data["seconds"] = time.monotonic() - started
    data["load_avg_after"] = os.getloadavg()
    print(report(data))
    print(f"\n(total {data['seconds']:.0f} s)")
    save()
    print(f"results written to {target} and {LATEST}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
