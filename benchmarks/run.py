#!/usr/bin/env python
"""django-taskclaim benchmarks: one entry point, a table on stdout, JSON in results/.

    python benchmarks/run.py --quick          # CI smoke, < 2 minutes
    python benchmarks/run.py                  # the full run (see --help for the matrix)
    python benchmarks/run.py --only throughput --strategies skip_locked --batches 100

Sections: round trips per task, throughput of the real worker command against the pgbench
ceiling (same claim and complete SQL, same concurrency, same database, same run),
claim_next() latency by backlog size, enqueue→start latency, worker resources, reaper.
Every figure is the median of --repeat runs; compare ratios from one run only: the
machine is shared and noisy. Targets are printed next to each measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.settings")

import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connections  # noqa: E402
from django.db.models import Max, Min  # noqa: E402
from django.test.utils import CaptureQueriesContext, override_settings  # noqa: E402

from benchmarks.benchapp.models import BenchTask  # noqa: E402
from benchmarks.procstat import TICKS, proc_tree, rss_mb, tree_cpu_ticks  # noqa: E402
from django_taskclaim.db import DbNow  # noqa: E402
from django_taskclaim.settle.outcome import run_task  # noqa: E402

LABEL = "benchapp.BenchTask"
NOTIFY_HOOKED = True
TABLE = BenchTask._meta.db_table
PY = sys.executable

# -- targets (issue "Benchmarks and race lab") ------------------------------------------
TARGET_BEST = 25_000.0  # no-op tasks/s, best configuration
TARGET_BATCH_CEILING = 0.25  # of the pgbench batch ceiling
TARGET_SINGLE_CEILING = 0.60  # of the pgbench single-claim ceiling, batch 1
TARGET_CLAIM_P50_MS = 1.0
TARGET_P99_SPREAD = 1.5
TARGET_NOTIFY_P50_MS = 10.0
TARGET_IDLE_CPU = 1.0  # percent
TARGET_RSS_MB = 60.0
TARGET_REAP_S = 5.0
TARGET_REAP_STMT_S = 1.0


def table_sql(alias: str) -> str:
    """The benchmark table's name, quoted for the database of ``alias``."""
    return connections[alias].ops.quote_name(TABLE)


def log(msg: str) -> None:
    print(msg, flush=True)


def med(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def mark(ok: bool | None) -> str:
    return "-" if ok is None else ("met" if ok else "NOT MET")


def table(title: str, header: list[str], rows: list[list[Any]]) -> str:
    """A Markdown table, padded so that it also reads well in a terminal."""
    cells = [[str(c) for c in header]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]

    def line(r: list[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |"

    out = [f"\n### {title}\n", line(cells[0])]
    out.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    out.extend(line(r) for r in cells[1:])
    return "\n".join(out)


# -- databases --------------------------------------------------------------------------


def vendor(alias: str) -> str:
    return connections[alias].vendor


def ensure_database(alias: str) -> None:
    """Create the dedicated benchmark database if missing, then its tables."""
    conn = connections[alias]
    name = conn.settings_dict["NAME"]
    if conn.vendor == "postgresql":
        with conn._nodb_cursor() as cur:
            cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name])
            if not cur.fetchone():
                cur.execute(f"CREATE DATABASE {conn.ops.quote_name(name)}")
    elif conn.vendor == "mysql":
        with conn._nodb_cursor() as cur:
            cur.execute(
                f"CREATE DATABASE IF NOT EXISTS {conn.ops.quote_name(name)} CHARACTER SET utf8mb4"
            )
    call_command("migrate", database=alias, run_syncdb=True, verbosity=0)


def server_version(alias: str) -> str:
    conn = connections[alias]
    with conn.cursor() as cur:
        if conn.vendor == "postgresql":
            cur.execute("SHOW server_version")
            return f"PostgreSQL {cur.fetchone()[0]}"
        if conn.vendor == "mysql":
            cur.execute("SELECT VERSION()")
            return f"MariaDB/MySQL {cur.fetchone()[0]}"
        cur.execute("SELECT sqlite_version()")
        return f"SQLite {cur.fetchone()[0]}"


def fill(alias: str, ready: int, *, done: int = 0, expired: int = 0) -> None:
    """Empty the table, then insert ``done``, ``expired`` (processing, lease over), ``ready``."""
    conn = connections[alias]
    name = table_sql(alias)
    with conn.cursor() as cur:
        if conn.vendor == "postgresql":
            cur.execute(f"TRUNCATE {name} RESTART IDENTITY")
            parts = [
                (done, "'done'", "NULL", "now()", 1, 1),
                (expired, "'processing'", "now() - interval '1 minute'", "NULL", 1, 1),
                (ready, "'ready'", "NULL", "NULL", 0, 0),
            ]
            for n, status, until, finished, version, attempts in parts:
                if n:
                    cur.execute(
                        f"INSERT INTO {name} (status, version, attempts, locked_until, "
                        "locked_by, priority, created_at, finished_at, last_error, stamp) "
                        f"SELECT {status}, {version}, {attempts}, {until}, 'dead:1', 0, "
                        f"now() + g * interval '1 microsecond', {finished}, '', false "
                        "FROM generate_series(1, %s) g",
                        [n],
                    )
            cur.execute(f"VACUUM ANALYZE {name}")
            return
    BenchTask.objects.using(alias).all().delete()

    for n, kw in (
        (done, {"status": "done", "finished_at": DbNow(), "version": 1, "attempts": 1}),
        (ready, {}),
    ):
        for start in range(0, n, 5000):
            BenchTask.objects.using(alias).bulk_create(
                [BenchTask(**kw) for _ in range(min(5000, n - start))]
            )
    if expired:
        for start in range(0, expired, 5000):
            BenchTask.objects.using(alias).bulk_create(
                [
                    BenchTask(status="processing", version=1, attempts=1, locked_by="dead:1")
                    for _ in range(min(5000, expired - start))
                ]
            )
        from datetime import timedelta

        BenchTask.objects.using(alias).filter(status="processing").update(
            locked_until=DbNow() - timedelta(minutes=1)
        )


def top_up_ready(alias: str, ready: int) -> None:
    """Add ``ready`` rows until the table holds ``ready`` of them (done rows stay)."""
    missing = ready - BenchTask.objects.using(alias).filter(status="ready").count()
    if missing <= 0:
        return
    conn = connections[alias]
    name = table_sql(alias)
    if conn.vendor == "postgresql":
        with conn.cursor() as cur:
            cur.execute(
                f"INSERT INTO {name} (status, version, attempts, locked_by, priority, "
                "created_at, last_error, stamp) SELECT 'ready', 0, 0, '', 0, "
                "now() + g * interval '1 microsecond', '', false FROM generate_series(1, %s) g",
                [missing],
            )
            cur.execute(f"VACUUM ANALYZE {name}")
        return
    for start in range(0, missing, 5000):
        BenchTask.objects.using(alias).bulk_create(
            [BenchTask() for _ in range(min(5000, missing - start))]
        )


def drained_rate(alias: str) -> tuple[int, float]:
    """(done rows, jobs/s over the span of their finished_at stamps)."""
    agg = (
        BenchTask.objects.using(alias)
        .filter(status="done")
        .aggregate(first=Min("finished_at"), last=Max("finished_at"))
    )
    done = BenchTask.objects.using(alias).filter(status="done").count()
    if not done or agg["first"] is None:
        return done, 0.0
    span = (agg["last"] - agg["first"]).total_seconds()
    return done, (done - 1) / span if span > 0 else float("inf")


# -- processes ---------------------------------------------------------------------------


def child_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["DJANGO_SETTINGS_MODULE"] = "benchmarks.settings"
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


def worker_argv(alias: str, *, threads: int, processes: int, batch: int, burst: bool) -> list[str]:
    argv = [PY, "-m", "django", "taskclaim_worker", LABEL, "--database", alias]
    argv += ["--concurrency", str(threads), "--batch", str(batch), "--no-reap"]
    if processes > 1:
        argv += ["--processes", str(processes)]
    if burst:
        argv.append("--burst")
    return argv


def worker_available() -> str | None:
    """``None`` if the worker command exists, else the reason it cannot be used."""
    from django.core.management import get_commands

    if "taskclaim_worker" not in get_commands():
        return "manage.py taskclaim_worker is not available in this tree"
    return None


class Sampler:
    """CPU (percent of one core) and RSS of a process tree, sampled while it runs."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.t0 = time.monotonic()
        self.pids = proc_tree(pid)
        self.c0 = tree_cpu_ticks(self.pids)
        self.max_rss = 0.0
        self.max_proc_rss = 0.0

    def sample(self) -> None:
        self.pids = sorted(set(self.pids) | set(proc_tree(self.pid)))
        sizes = [rss_mb(p) for p in self.pids]
        self.max_rss = max(self.max_rss, sum(sizes))
        self.max_proc_rss = max([self.max_proc_rss, *sizes])

    def cpu_percent(self) -> float:
        elapsed = time.monotonic() - self.t0
        return 100.0 * (tree_cpu_ticks(self.pids) - self.c0) / TICKS / elapsed if elapsed else 0.0


def run_worker_burst(
    alias: str, *, threads: int, processes: int, batch: int, strategy: str, timeout: float
) -> dict[str, Any]:
    argv = worker_argv(alias, threads=threads, processes=processes, batch=batch, burst=True)
    env = child_env(TASKCLAIM_BENCH_STRATEGY=strategy)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    # Output goes to a file, never a pipe nobody reads while the worker runs (a full
    # pipe would block the worker's logging and stall it).
    log_file = tempfile.TemporaryFile()  # noqa: SIM115 - closed below, after the wait
    proc = subprocess.Popen(argv, env=env, stdout=log_file, stderr=subprocess.STDOUT)
    sampler = Sampler(proc.pid)
    while proc.poll() is None:
        sampler.sample()
        if time.monotonic() - t0 > timeout:
            proc.kill()
            proc.wait()
            raise RuntimeError(f"worker did not drain within {timeout:g}s: {' '.join(argv)}")
        time.sleep(0.1)
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    used = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    cpu = 100.0 * used / wall
    log_file.seek(0)
    out = log_file.read().decode(errors="replace")
    log_file.close()
    if proc.returncode != 0:
        raise RuntimeError(f"worker exited {proc.returncode}: {' '.join(argv)}\n{out[-2000:]}")
    return {
        "wall_s": wall,
        "cpu_percent": cpu,
        "rss_mb": sampler.max_rss,
        "rss_per_process_mb": sampler.max_proc_rss,
    }


# -- section: round trips ----------------------------------------------------------------


def bench_round_trips(alias: str) -> list[dict[str, Any]]:
    """Queries per task on the hot path, counted with ``CaptureQueriesContext``."""
    fill(alias, 400)
    conn = connections[alias]
    qs = BenchTask.objects.using(alias)
    rows = []

    def count(what: str, tasks: int, fn: Callable[[], Any]) -> Any:
        with CaptureQueriesContext(conn) as ctx:
            value = fn()
        rows.append(
            {
                "vendor": conn.vendor,
                "operation": what,
                "queries": len(ctx.captured_queries),
                "per_task": round(len(ctx.captured_queries) / tasks, 3),
            }
        )
        return value

    # The process's first claim also reads the pause table (a snapshot kept for one poll
    # interval): read it before counting, as a running worker has.
    from django_taskclaim.claim.paused import snapshot

    snapshot(alias)
    one = count("claim_next()", 1, qs.claim_next)
    count("complete() (no-op run_task)", 1, lambda: run_task(one))
    many = count("claim(100)", 100, lambda: qs.claim(100))
    count("run_task() x100 (no-op, complete each)", 100, lambda: [run_task(t) for t in many])
    batch = qs.claim(100)
    acks: list[Any] = []
    count(
        "run_task(defer) x100 + complete_many()",
        100,
        lambda: ([run_task(t, defer=acks.append) for t in batch], qs.complete_many(acks)),
    )
    held = qs.claim(100)
    count("extend_leases(100 tasks) heartbeat", 100, lambda: qs.extend_leases(held))
    count("renew_leases(100 tasks) worker heartbeat", 100, lambda: qs.renew_leases(held))
    count("task.extend_lease() heartbeat", 1, lambda: held[0].extend_lease())
    return rows


# -- section: throughput ---------------------------------------------------------------


def complete_sql(alias: str) -> str:
    """The exact SQL the worker's batched completion (``complete_many``) sends, captured,
    with ``{ids}`` and ``{vs}`` in place of its two array parameters."""
    fill(alias, 2)
    conn = connections[alias]
    tasks = BenchTask.objects.using(alias).claim(2, worker="pgbench")
    with CaptureQueriesContext(conn) as ctx:
        BenchTask.objects.using(alias).complete_many(tasks)
    updates = [q["sql"] for q in ctx.captured_queries if q["sql"].startswith("UPDATE")]
    arrays = re.compile(r"'\{[0-9,]*\}'(::\w+\[\])*::bigint\[\]")  # psycopg: '{..}'::int2[]
    if len(updates) != 1 or len(arrays.findall(updates[0])) != 2:
        raise RuntimeError(f"complete_many() did not send one UPDATE from two arrays: {updates}")
    sql = arrays.sub("\0", updates[0], count=2).replace("{", "{{").replace("}", "}}")
    return sql.replace("\0", "{ids}::bigint[]", 1).replace("\0", "{vs}::bigint[]", 1)


def pgbench_binary() -> str | None:
    candidates = []
    try:
        from django_taskclaim import embedded

        candidates.append(embedded.bin_dir() / "pgbench")
    except Exception:
        pass
    candidates.append(Path("/usr/lib/postgresql/15/bin/pgbench"))
    found = shutil.which("pgbench")
    if found:
        candidates.append(Path(found))
    for path in candidates:
        if (
            path.exists()
            and subprocess.run([str(path), "--version"], capture_output=True).returncode == 0
        ):
            return str(path)
    return None


def pgbench_version() -> str:
    binary = pgbench_binary()
    if binary is None:
        return "pgbench not found"
    out = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout.strip()
    return f"{out} ({binary})"


def claim_sql(alias: str, batch: int, *, gate: bool = False) -> tuple[str, str]:
    """The exact SQL ``claim(batch)`` sends (captured), to replay in pgbench: ``(gate,
    claim)``, the claim gate's statement (``""`` without ``gate``) and the claim's."""
    fill(alias, batch)
    conn = connections[alias]
    with (
        override_settings(TASKCLAIM_CLAIM_GATE=1 if gate else None),
        CaptureQueriesContext(conn) as ctx,
    ):
        BenchTask.objects.using(alias).claim(batch, worker="pgbench")
    claims = [q["sql"] for q in ctx.captured_queries if "UPDATE" in q["sql"]]
    if len(claims) != 1:
        raise RuntimeError(f"claim({batch}) did not send one UPDATE: {ctx.captured_queries}")
    first, _, claim = claims[0].strip().rstrip(";").rpartition("; WITH ")
    if bool(first) != gate:
        raise RuntimeError(f"claim({batch}) gate={gate} sent: {claims[0][:200]}")
    return first, ("WITH " + claim) if first else claim


def pgbench_ceiling(
    alias: str,
    pgbench: str,
    *,
    clients: int,
    batch: int,
    rows: int,
    cpu: Any = None,
    gate: bool | None = None,
) -> dict:
    """Run the library's own claim statement + one fenced completion per batch in pgbench.

    ``cpu`` (``peers.PgCpu``): started right before pgbench, stopped right after; its
    figures are added to the result as ``cpu``. ``gate`` (``True`` / ``False``): the claim
    with or without its claim gate, both sent as the worker sends them (simple query
    protocol, the gate and the claim in one query); ``None``: the claim without a gate as
    a prepared statement (the ceiling)."""
    conn = connections[alias]
    qn = conn.ops.quote_name
    gate_sql, claim = claim_sql(alias, batch, gate=bool(gate))
    script = (
        (f"{gate_sql} \\; " if gate_sql else "")
        + f"WITH u AS ({claim}) SELECT coalesce(array_agg(u.{qn('id')}), '{{}}') AS ids, "
        f"coalesce(array_agg(u.{qn('version')}), '{{}}') AS vs FROM u\n\\gset\n"
        + complete_sql(alias).format(
            # pgbench passes :variables as parameters when prepared, as text when simple
            ids=":ids" if gate is None else "':ids'",
            vs=":vs" if gate is None else "':vs'",
        )
        + ";\n"
    )
    per_client = max(1, rows // (clients * batch))
    fill(alias, per_client * clients * batch)
    s = conn.settings_dict
    with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as fh:
        fh.write(script)
        path = fh.name
    mode = "prepared" if gate is None else "simple"
    argv = [pgbench, "-n", "-M", mode, "-f", path, "-c", str(clients)]
    argv += ["-j", str(min(clients, 2)), "-t", str(per_client)]
    argv += ["-h", s["HOST"] or "127.0.0.1", "-U", s["USER"] or "postgres", s["NAME"]]
    if s.get("PORT"):
        argv[-1:-1] = ["-p", str(s["PORT"])]
    used = None
    tuples: dict[str, float] | None = None
    try:
        if cpu is None:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=600)
        else:  # sampled while it runs: pgbench's backends exit before it does
            before = _tuple_counts(alias)
            cpu.start()
            with subprocess.Popen(
                argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            ) as running:
                deadline = time.monotonic() + 600
                while running.poll() is None and time.monotonic() < deadline:
                    cpu.sample()
                    time.sleep(0.02)  # the sampling period, not a synchronisation
                out, err = running.communicate(timeout=60)
            proc = subprocess.CompletedProcess(argv, running.returncode, out, err)
            used = cpu.stop()  # waits until pgbench's backends have exited (their stats flushed)
            after = _tuple_counts(alias)
            tuples = {k: after[k] - before[k] for k in before}
    finally:
        os.unlink(path)
    found = re.search(r"tps = ([\d.]+) \(without initial connection time\)", proc.stdout)
    if proc.returncode != 0 or not found:
        raise RuntimeError(f"pgbench failed: {' '.join(argv)}\n{proc.stdout}\n{proc.stderr}")
    tps = float(found.group(1))
    done = BenchTask.objects.using(alias).filter(status="done").count()
    seconds = per_client * clients / tps
    out = {"jobs_s": done / seconds, "done": done, "tps": tps, "cpu": used}
    if tuples is not None and done:
        out["tuples_per_job"] = {k: v / done for k, v in tuples.items()}
    return out


def _tuple_counts(alias: str) -> dict[str, float]:
    """``pg_stat_database``'s tuple counters of the benchmark database: index entries and
    rows read (``returned``), live rows fetched by index scans (``fetched``), rows
    updated. Read after the sessions that did the work have ended."""
    conn = connections[alias]
    with conn.cursor() as cur:
        cur.execute("SELECT pg_stat_clear_snapshot()")
        cur.execute(
            "SELECT tup_returned, tup_fetched, tup_updated FROM pg_stat_database "
            "WHERE datname = current_database()"
        )
        returned, fetched, updated = cur.fetchone()
    return {"returned": returned, "fetched": fetched, "updated": updated}


def drain_batched_ack(alias: str, batch: int) -> int:
    """Claim ``batch``, run each task with its completion deferred, then acknowledge the
    batch with ONE fenced UPDATE (``complete_many``): the worker's hot path, in-process."""
    qs = BenchTask.objects.using(alias)
    tasks = qs.claim(batch)
    if not tasks:
        return 0
    acks: list[Any] = []
    for t in tasks:
        run_task(t, defer=acks.append)
    lost = qs.complete_many(acks)
    if lost:
        raise RuntimeError(f"{len(lost)} claims lost in a single-claimer benchmark")
    return len(tasks)


def throughput_configs(args: argparse.Namespace) -> list[tuple[str, int, int, int]]:
    configs = []
    for strategy in args.strategies:
        for threads in args.concurrency:
            for batch in args.batches:
                configs.append((strategy, threads, 1, batch))
        for procs in args.processes:
            if procs > 1:
                for batch in args.batches:
                    configs.append((strategy, args.threads_per_process, procs, batch))
    return configs


def bench_throughput(args: argparse.Namespace, aliases: list[str]) -> dict[str, Any]:
    reason = worker_available()
    out: dict[str, Any] = {
        "worker": [],
        "ceiling": [],
        "inprocess": [],
        "batched_ack": [],
        "skipped": reason,
    }
    pgbench = pgbench_binary()
    pg = [a for a in aliases if vendor(a) == "postgresql"]
    # The ceiling, at each concurrency x batch measured for the worker.
    if pg and pgbench:
        wanted = sorted(
            {(t * p, b) for _, t, p, b in throughput_configs(args)}
            | {(c, b) for c in args.ceiling_clients for b in args.batches}
        )
        for clients, batch in wanted:
            runs = []
            for _ in range(args.repeat):
                rows = args.tasks if batch > 1 else min(args.tasks, args.single_tasks)
                runs.append(
                    pgbench_ceiling(pg[0], pgbench, clients=clients, batch=batch, rows=rows)
                )
            out["ceiling"].append(
                {
                    "vendor": "postgresql",
                    "clients": clients,
                    "batch": batch,
                    "jobs_s": med([r["jobs_s"] for r in runs]),
                    "runs": [round(r["jobs_s"]) for r in runs],
                }
            )
            log(f"  ceiling clients={clients} batch={batch}: {out['ceiling'][-1]['jobs_s']:,.0f}/s")
    elif pg:
        out["ceiling_skipped"] = "pgbench not found"
    # The library alone, in one thread of this process (no worker).
    for alias in pg if args.quick else aliases:
        for batch in args.batches:
            runs = []
            for _ in range(args.repeat):
                n = args.tasks if batch > 1 else min(args.tasks, args.single_tasks)
                fill(alias, n)
                qs = BenchTask.objects.using(alias)
                t0 = time.perf_counter()
                while True:
                    tasks = qs.claim(batch)
                    if not tasks:
                        break
                    for task in tasks:
                        run_task(task)
                runs.append(n / (time.perf_counter() - t0))
            out["inprocess"].append(
                {
                    "vendor": vendor(alias),
                    "batch": batch,
                    "jobs_s": med(runs),
                    "runs": [round(r) for r in runs],
                }
            )
            log(f"  in-process loop {vendor(alias)} batch={batch}: {med(runs):,.0f}/s")
            if batch > 1:
                runs = []
                for _ in range(args.repeat):
                    n = args.tasks
                    fill(alias, n)
                    t0 = time.perf_counter()
                    while drain_batched_ack(alias, batch):
                        pass
                    runs.append(n / (time.perf_counter() - t0))
                out["batched_ack"].append(
                    {
                        "vendor": vendor(alias),
                        "batch": batch,
                        "jobs_s": med(runs),
                        "runs": [round(r) for r in runs],
                    }
                )
                log(
                    f"  in-process loop, batched ack {vendor(alias)} batch={batch}: "
                    f"{med(runs):,.0f}/s"
                )
    if reason:
        log(f"  worker throughput skipped: {reason}")
        return out
    for alias in aliases:
        configs = throughput_configs(args)
        if vendor(alias) != "postgresql":
            # Representative rows only (no ceiling there): the vendor's default strategy,
            # one process, the largest thread count up to 4, every batch size.
            strategy = "cas" if vendor(alias) == "sqlite" else "skip_locked"
            threads = max([t for t in args.concurrency if t <= 4] or args.concurrency[:1])
            configs = [(strategy, threads, 1, b) for b in args.batches]
        for strategy, threads, procs, batch in configs:
            runs, res = [], []
            for _ in range(args.repeat):
                n = args.tasks if batch > 1 else min(args.tasks, args.single_tasks)
                fill(alias, n)
                r = run_worker_burst(
                    alias,
                    threads=threads,
                    processes=procs,
                    batch=batch,
                    strategy=strategy,
                    timeout=args.worker_timeout,
                )
                done, rate = drained_rate(alias)
                if done != n:
                    raise RuntimeError(f"worker left {n - done} of {n} tasks undone")
                runs.append(rate)
                res.append(r)
            clients = threads * procs
            ceiling = next(
                (
                    c["jobs_s"]
                    for c in out["ceiling"]
                    if c["clients"] == clients and c["batch"] == batch
                ),
                None,
            )
            row = {
                "vendor": vendor(alias),
                "strategy": strategy,
                "threads": threads,
                "processes": procs,
                "batch": batch,
                "jobs_s": med(runs),
                "runs": [round(x) for x in runs],
                "wall_s": med([r["wall_s"] for r in res]),
                "cpu_percent": med([r["cpu_percent"] for r in res]),
                "rss_mb": max(r["rss_mb"] for r in res),
                "rss_per_process_mb": max(r["rss_per_process_mb"] for r in res),
                "ceiling_jobs_s": ceiling if vendor(alias) == "postgresql" else None,
            }
            out["worker"].append(row)
            log(
                f"  worker {row['vendor']} {strategy} threads={threads} processes={procs} "
                f"batch={batch}: {row['jobs_s']:,.0f}/s"
            )
    return out


# -- section: latency -----------------------------------------------------------------------


def bench_claim_latency(args: argparse.Namespace, alias: str) -> list[dict[str, Any]]:
    rows = []
    qs = BenchTask.objects.using(alias)
    conn = connections[alias]
    floor = []
    fill(alias, 1)
    with conn.cursor() as cur:
        for i in range(args.latency_samples + 20):
            t0 = time.perf_counter()
            cur.execute(f"UPDATE {table_sql(alias)} SET priority = %s", [i % 2])
            if i >= 20:
                floor.append((time.perf_counter() - t0) * 1000)
    rows.append(
        {
            "vendor": vendor(alias),
            "ready": 0,
            "done": 0,
            "what": "commit floor: 1-row UPDATE, autocommit",
            "p50_ms": pct(floor, 50),
            "p99_ms": pct(floor, 99),
        }
    )
    log(f"  commit floor: p50={rows[-1]['p50_ms']:.2f} ms")
    fill(alias, 0, done=args.done_rows)
    for ready in sorted(args.latency_sizes):
        top_up_ready(alias, ready)
        for _ in range(20):  # warm the connection and the plan
            qs.claim_next()
        p50s, p99s = [], []
        for _round in range(args.repeat):
            samples = []
            for _ in range(args.latency_samples):
                t0 = time.perf_counter()
                task = qs.claim_next()
                samples.append((time.perf_counter() - t0) * 1000)
                if task is None:
                    raise RuntimeError("claim_next() found no ready row")
            p50s.append(pct(samples, 50))
            p99s.append(pct(samples, 99))
        rows.append(
            {
                "vendor": vendor(alias),
                "ready": ready,
                "done": args.done_rows,
                "rounds": [[round(a, 3), round(b, 3)] for a, b in zip(p50s, p99s, strict=True)],
                "what": "claim_next()",
                "p50_ms": med(p50s),
                "p99_ms": med(p99s),
            }
        )
        log(
            f"  claim_next ready={ready:,} done={args.done_rows:,}: p50={rows[-1]['p50_ms']:.2f} ms"
        )
    return rows


@contextmanager
def idle_worker(alias: str, *, notify: bool | str, poll: float) -> Iterator[subprocess.Popen]:
    argv = worker_argv(alias, threads=1, processes=1, batch=1, burst=False)
    argv += ["--poll", str(poll)]
    env = child_env(
        TASKCLAIM_BENCH_NOTIFY="trigger" if notify == "trigger" else str(int(bool(notify)))
    )
    err = tempfile.TemporaryFile()  # noqa: SIM115 - a file, not a pipe: see run_worker_burst
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=err)
    proc.log_file = err  # type: ignore[attr-defined]
    try:
        # A first task proves the worker is up and has its connection open.
        wait_started(alias, enqueue(alias), timeout=60, proc=proc)
        yield proc
    finally:
        stop_process(proc)


def stop_process(proc: subprocess.Popen) -> None:
    """SIGTERM a worker (a graceful stop), SIGKILL it if it has not exited in 30 s."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _notify_hooked() -> bool:
    from django.db.models.signals import post_save

    from django_taskclaim.wakeup import notify

    return any(key[0] == notify._DISPATCH_UID for key, *_ in post_save.receivers)


def enqueue(alias: str) -> tuple[int, float]:
    """Insert one task the way users do (``create()``); returns (pk, time.time() before)."""
    from django_taskclaim.wakeup import notify

    t0 = time.time()
    task = BenchTask.objects.using(alias).create(stamp=True)
    if not NOTIFY_HOOKED:
        notify.notify(BenchTask, using=alias)  # the documented call when no hook is connected
    return task.pk, t0


def wait_started(
    alias: str, item: tuple[int, float], *, timeout: float, proc: subprocess.Popen
) -> float:
    pk, t0 = item
    deadline = time.monotonic() + timeout
    qs = BenchTask.objects.using(alias).filter(pk=pk, started__isnull=False)
    while time.monotonic() < deadline:
        started = qs.values_list("started", flat=True).first()
        if started is not None:
            return (started - t0) * 1000
        if proc.poll() is not None:
            proc.log_file.seek(0)  # type: ignore[attr-defined]
            err = proc.log_file.read().decode(errors="replace")  # type: ignore[attr-defined]
            raise RuntimeError(f"worker exited {proc.returncode}: {err[-2000:]}")
        time.sleep(0.002)
    raise RuntimeError(f"task {pk} was not started within {timeout:g}s")


def bench_wakeup_and_idle(args: argparse.Namespace, alias: str) -> dict[str, Any]:
    global NOTIFY_HOOKED
    NOTIFY_HOOKED = _notify_hooked()
    out: dict[str, Any] = {"post_save_hook": NOTIFY_HOOKED}
    fill(alias, 0)
    modes = [("listen/notify", True, 5.0), ("polling 1 s", False, 1.0)]
    if vendor(alias) != "postgresql":
        modes = [("polling 1 s", False, 1.0)]
    for name, notify, poll in modes:
        with idle_worker(alias, notify=notify, poll=poll) as proc:
            if name == modes[0][0]:
                time.sleep(1.0)  # let the worker settle before measuring idle use
                sampler = Sampler(proc.pid)
                time.sleep(args.idle_seconds)
                sampler.sample()
                out["idle"] = {
                    "cpu_percent": sampler.cpu_percent(),
                    "rss_mb": sampler.max_rss,
                    "mode": name,
                }
                log(
                    f"  idle worker: cpu={out['idle']['cpu_percent']:.2f}% "
                    f"rss={sampler.max_rss:.1f} MB"
                )
            samples = []
            n = args.wakeup_samples if notify else max(3, args.wakeup_samples // 2)
            for i in range(n):
                time.sleep(0.05 + 0.1 * (i % 3))  # do not align with the poll period
                samples.append(wait_started(alias, enqueue(alias), timeout=30, proc=proc))
            out[name] = {"p50_ms": pct(samples, 50), "p99_ms": pct(samples, 99), "n": n}
            log(f"  enqueue->start {name}: p50={out[name]['p50_ms']:.1f} ms")
    return out


# -- section: reaper -------------------------------------------------------------------------


def bench_reaper(
    args: argparse.Namespace, alias: str, batch_size: int | None = None
) -> dict[str, Any]:
    from django_taskclaim.recovery.reap import reap

    totals, longest = [], []
    for _ in range(args.repeat):
        fill(alias, 0, expired=args.reap_rows)
        conn = connections[alias]
        with CaptureQueriesContext(conn) as ctx:
            t0 = time.perf_counter()
            result = reap(BenchTask, using=alias, batch_size=batch_size)
            totals.append(time.perf_counter() - t0)
        if result.total != args.reap_rows:
            raise RuntimeError(f"reaped {result.total} of {args.reap_rows}")
        longest.append(max(float(q["time"]) for q in ctx.captured_queries))
        statements = len(ctx.captured_queries)
    from django_taskclaim.config.settings import taskclaim_settings

    out = {
        "vendor": vendor(alias),
        "batch_size": batch_size or int(taskclaim_settings.REAP_BATCH),
        "rows": args.reap_rows,
        "total_s": med(totals),
        "longest_statement_s": med(longest),
        "statements": statements,
    }
    log(
        f"  reap {args.reap_rows:,} on {out['vendor']} batch {out['batch_size']}: "
        f"{out['total_s']:.2f} s"
    )
    return out


# -- report ---------------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    import psycopg

    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = 0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                mem = int(line.split()[1]) // 1024
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_mb": mem,
        "load_avg": os.getloadavg(),
        "os": platform.platform(),
        "python": platform.python_version(),
        "django": django.get_version(),
        "psycopg": psycopg.__version__,
    }


def report(data: dict[str, Any]) -> str:
    parts = []
    m = data["machine"]
    parts.append(
        f"# django-taskclaim benchmarks ({'quick' if data['quick'] else 'full'}), "
        f"median of {data['repeat']}\n{m['cpu']}, {m['cores']} cores, {m['memory_mb']} MB; "
        f"load {m['load_avg'][0]:.1f}; Python {m['python']}, Django {m['django']}, "
        f"psycopg {m['psycopg']}; "
        + "; ".join(data["servers"].values())
        + (f"; {data['pgbench']}" if data.get("pgbench") else "")
    )
    if "round_trips" in data:
        parts.append(
            table(
                "Round trips on the hot path (CaptureQueriesContext)",
                ["vendor", "operation", "queries", "per task"],
                [
                    [r["vendor"], r["operation"], r["queries"], r["per_task"]]
                    for r in data["round_trips"]
                ],
            )
        )
    tp = data.get("throughput")
    if tp:
        rows = []
        for c in tp["ceiling"]:
            rows.append(
                [
                    "pgbench ceiling",
                    "postgresql",
                    "-",
                    c["clients"],
                    c["batch"],
                    f"{c['jobs_s']:,.0f}",
                    "",
                    "",
                    "",
                ]
            )
        for r in tp["inprocess"]:
            rows.append(
                [
                    "in-process loop",
                    r["vendor"],
                    "auto",
                    1,
                    r["batch"],
                    f"{r['jobs_s']:,.0f}",
                    "",
                    "",
                    "",
                ]
            )
        for r in tp.get("batched_ack", []):
            rows.append(
                [
                    "in-process, batched ack",
                    r["vendor"],
                    "auto",
                    1,
                    r["batch"],
                    f"{r['jobs_s']:,.0f}",
                    "",
                    "",
                    "",
                ]
            )
        best = max((r["jobs_s"] for r in tp["worker"]), default=None)
        for r in tp["worker"]:
            ratio = r["jobs_s"] / r["ceiling_jobs_s"] if r.get("ceiling_jobs_s") else None
            if ratio is None:
                target = ""
            elif r["batch"] == 1:
                target = f"≥ 60 %: {mark(ratio >= TARGET_SINGLE_CEILING)}"
            else:
                target = f"≥ 25 %: {mark(ratio >= TARGET_BATCH_CEILING)}"
            conc = f"{r['threads']}" if r["processes"] == 1 else f"{r['processes']}x{r['threads']}"
            rows.append(
                [
                    "worker --burst",
                    r["vendor"],
                    r["strategy"],
                    conc,
                    r["batch"],
                    f"{r['jobs_s']:,.0f}",
                    f"{ratio:.0%}" if ratio is not None else "",
                    target,
                    f"{r['cpu_percent']:.0f}% / {r['rss_per_process_mb']:.0f} MB",
                ]
            )
        parts.append(
            table(
                "Throughput: no-op tasks drained (jobs/s); ceiling = pgbench, same SQL, same run",
                [
                    "what",
                    "vendor",
                    "strategy",
                    "clients",
                    "batch",
                    "jobs/s",
                    "of ceiling",
                    "target",
                    "cpu / rss per proc",
                ],
                rows,
            )
        )
        if best is not None:
            parts.append(
                f"\nbest worker configuration: {best:,.0f}/s "
                f"(target ≥ {TARGET_BEST:,.0f}/s: {mark(best >= TARGET_BEST)})"
            )
        if tp.get("skipped"):
            parts.append(f"\nworker rows skipped: {tp['skipped']}")
    lat = data.get("claim_latency")
    if lat:
        rows = []
        claims = [r for r in lat if r["ready"]]
        base = claims[0]["p99_ms"] if claims else float("nan")
        for r in lat:
            if not r["ready"]:
                rows.append([r["what"], "", "", f"{r['p50_ms']:.2f}", f"{r['p99_ms']:.2f}", "", ""])
                continue
            spread = r["p99_ms"] / base if base else float("nan")
            rows.append(
                [
                    r["what"],
                    f"{r['ready']:,}",
                    f"{r['done']:,}",
                    f"{r['p50_ms']:.2f}",
                    f"{r['p99_ms']:.2f}",
                    f"{spread:.2f}x",
                    f"p50 ≤ 1 ms: {mark(r['p50_ms'] <= TARGET_CLAIM_P50_MS)}; "
                    f"p99 ≤ 1.5x: {mark(spread <= TARGET_P99_SPREAD)}",
                ]
            )
        parts.append(
            table(
                "claim_next() latency by backlog (PostgreSQL)",
                ["what", "ready", "done beside", "p50 ms", "p99 ms", "p99 vs smallest", "target"],
                rows,
            )
        )
    wake = data.get("wakeup")
    if wake:
        rows = []
        for name in ("listen/notify", "polling 1 s"):
            if name in wake:
                w = wake[name]
                target = (
                    f"p50 ≤ 10 ms: {mark(w['p50_ms'] <= TARGET_NOTIFY_P50_MS)}"
                    if name == "listen/notify"
                    else ""
                )
                rows.append([name, w["n"], f"{w['p50_ms']:.1f}", f"{w['p99_ms']:.1f}", target])
        parts.append(
            table(
                "enqueue → start on an idle worker",
                ["wake-up", "samples", "p50 ms", "p99 ms", "target"],
                rows,
            )
        )
        idle = wake.get("idle")
        if idle:
            parts.append(
                table(
                    "Worker resources",
                    ["state", "cpu", "rss", "target"],
                    [
                        [
                            "idle (1 thread)",
                            f"{idle['cpu_percent']:.2f}%",
                            f"{idle['rss_mb']:.1f} MB",
                            f"cpu < 1 %: {mark(idle['cpu_percent'] < TARGET_IDLE_CPU)}; "
                            f"rss ≤ 60 MB: {mark(idle['rss_mb'] <= TARGET_RSS_MB)}",
                        ],
                        *[
                            [
                                f"draining ({r['vendor']} {r['strategy']} "
                                f"{r['processes']}x{r['threads']} batch {r['batch']})",
                                f"{r['cpu_percent']:.0f}%",
                                f"{r['rss_per_process_mb']:.1f} MB per process",
                                f"rss ≤ 60 MB: {mark(r['rss_per_process_mb'] <= TARGET_RSS_MB)}",
                            ]
                            for r in _best_rows(tp)
                        ],
                    ],
                )
            )
    reap_rows = data.get("reaper")
    if reap_rows:
        parts.append(
            table(
                "Reaper: expired leases recovered",
                [
                    "vendor",
                    "batch",
                    "rows",
                    "total s",
                    "longest statement s",
                    "statements",
                    "target",
                ],
                [
                    [
                        r["vendor"],
                        r["batch_size"],
                        f"{r['rows']:,}",
                        f"{r['total_s']:.2f}",
                        f"{r['longest_statement_s']:.3f}",
                        r["statements"],
                        f"≤ 5 s: {mark(r['total_s'] * 100_000 / r['rows'] <= TARGET_REAP_S)} "
                        f"(scaled to 100k); no statement > 1 s: "
                        f"{mark(r['longest_statement_s'] <= TARGET_REAP_STMT_S)}",
                    ]
                    for r in reap_rows
                ],
            )
        )
    return "\n".join(parts)


def _best_rows(tp: dict[str, Any] | None) -> list[dict[str, Any]]:
    if not tp or not tp.get("worker"):
        return []
    best: dict[str, dict[str, Any]] = {}
    for r in tp["worker"]:
        if r["vendor"] not in best or r["jobs_s"] > best[r["vendor"]]["jobs_s"]:
            best[r["vendor"]] = r
    return list(best.values())


# -- main ------------------------------------------------------------------------------------


SECTIONS = ("roundtrips", "throughput", "latency", "wakeup", "reaper")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="CI smoke run, under 2 minutes")
    p.add_argument("--only", action="append", choices=SECTIONS, help="run only these sections")
    p.add_argument(
        "--vendors",
        nargs="+",
        default=None,
        help="postgresql mysql sqlite (default: all reachable)",
    )
    p.add_argument(
        "--repeat", type=int, default=3, help="runs per figure; the median is reported (3)"
    )
    p.add_argument("--strategies", nargs="+", default=None, help="worker throughput strategies")
    p.add_argument(
        "--concurrency", nargs="+", type=int, default=None, help="worker threads (1 process)"
    )
    p.add_argument("--processes", nargs="*", type=int, default=None, help="worker processes")
    p.add_argument("--threads-per-process", type=int, default=4)
    p.add_argument("--batches", nargs="+", type=int, default=None, help="claim batch sizes")
    p.add_argument(
        "--ceiling-clients", nargs="*", type=int, default=None, help="extra pgbench client counts"
    )
    p.add_argument("--tasks", type=int, default=None, help="backlog per throughput run")
    p.add_argument("--single-tasks", type=int, default=None, help="backlog per batch-1 run")
    p.add_argument("--latency-sizes", nargs="+", type=int, default=None, help="ready rows")
    p.add_argument("--done-rows", type=int, default=None, help="done rows beside the ready ones")
    p.add_argument("--latency-samples", type=int, default=None)
    p.add_argument("--wakeup-samples", type=int, default=None)
    p.add_argument("--idle-seconds", type=float, default=None)
    p.add_argument("--reap-rows", type=int, default=None)
    p.add_argument(
        "--reap-batches", nargs="*", type=int, default=[5000], help="extra reaper batch sizes"
    )
    p.add_argument("--worker-timeout", type=float, default=600.0)
    p.add_argument(
        "--output", type=Path, default=None, help="JSON file (default: results/<time>.json)"
    )
    p.add_argument(
        "--render", type=Path, help="print the report of an earlier JSON file; run nothing"
    )
    args = p.parse_args(argv)
    quick = args.quick
    defaults: dict[str, Any] = {
        "strategies": ["skip_locked"]
        if quick
        else ["skip_locked", "cas", "advisory", "serializable"],
        "concurrency": [4] if quick else [1, 2, 4, 8],
        "processes": [] if quick else [2],
        "batches": [1, 100] if quick else [1, 10, 100],
        "ceiling_clients": [] if quick else [1, 8],
        "tasks": 1000 if quick else 50_000,
        "single_tasks": 200 if quick else 5000,
        "latency_sizes": [10_000, 100_000] if quick else [10_000, 100_000, 1_000_000],
        "done_rows": 100_000 if quick else 5_000_000,
        "latency_samples": 200 if quick else 1000,
        "wakeup_samples": 10 if quick else 40,
        "idle_seconds": 3.0 if quick else 10.0,
        "reap_rows": 20_000 if quick else 100_000,
    }
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.repeat < 1:
        p.error("--repeat must be at least 1")
    return args


def reachable_aliases() -> list[str]:
    """Create every configured database that is missing; return the reachable aliases.

    Every configured database must exist, measured or not: the worker processes run
    Django's system checks, which connect to each of them."""
    ready = []
    for alias in connections:
        try:
            ensure_database(alias)
        except Exception as exc:
            log(f"database {alias!r} unavailable: {exc}")
            continue
        ready.append(alias)
    return ready


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.render:
        print(report(json.loads(args.render.read_text())))
        return 0
    sections = args.only or list(SECTIONS)
    aliases = [a for a in reachable_aliases() if not args.vendors or vendor(a) in args.vendors]
    pg = [a for a in aliases if vendor(a) == "postgresql"]
    started = time.monotonic()
    data: dict[str, Any] = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "argv": sys.argv,
        "quick": args.quick,
        "repeat": args.repeat,
        "machine": machine(),
        "servers": {a: server_version(a) for a in aliases},
        "pgbench": pgbench_version(),
        "databases": {
            a: str(settings.DATABASES[a].get("HOST") or settings.DATABASES[a]["NAME"])
            for a in aliases
        },
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    stamp = f"{datetime.now(UTC):%Y%m%dT%H%M%S}{'-quick' if args.quick else ''}"
    target = args.output or RESULTS / f"{stamp}.json"

    def save() -> None:  # after every section, so that an interrupted run keeps its data
        target.write_text(json.dumps(data, indent=2, default=str))

    if "roundtrips" in sections:
        log("round trips…")
        data["round_trips"] = [r for a in aliases for r in bench_round_trips(a)]
        save()
    if "throughput" in sections:
        log("throughput…")
        data["throughput"] = bench_throughput(args, aliases)
        save()
    if "latency" in sections and pg:
        log("claim_next() latency…")
        data["claim_latency"] = bench_claim_latency(args, pg[0])
        save()
    if "wakeup" in sections and pg:
        reason = worker_available()
        if reason:
            log(f"enqueue->start skipped: {reason}")
        else:
            log("enqueue→start and idle worker…")
            data["wakeup"] = bench_wakeup_and_idle(args, pg[0])
            save()
    if "reaper" in sections:
        log("reaper…")
        data["reaper"] = [
            bench_reaper(args, a, size)
            for a in (pg or aliases[:1])
            for size in (None, *args.reap_batches)
        ]
    for a in aliases:
        fill(a, 0)
    data["seconds"] = time.monotonic() - started
    text = report(data)
    print(text)
    print(f"\n(total {data['seconds']:.0f} s)")
    save()
    print(f"results written to {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
