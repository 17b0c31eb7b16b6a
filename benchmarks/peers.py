#!/usr/bin/env python
"""django-taskclaim beside PgQueuer: same run, same PostgreSQL database, same backlog.

    python benchmarks/peers.py --quick        # smoke run, about two minutes
    python benchmarks/peers.py                # the full run (see --help)
    python benchmarks/peers.py --only throughput --processes 1 2 --repeat 5

Sections:

* throughput — a pre-filled backlog of N no-op jobs drained by our real worker
  (``manage.py taskclaim_worker --burst``, 1 and 4 threads per process) and by PgQueuer
  1.6 (P processes of ``python -m benchmarks.peer_pgqueuer noop --drain``: PgQueuer's
  ``pgqueuer.run()``, as ``pgq run --mode drain`` does, with a no-op async entrypoint),
  at the same batch size and the same number of processes. Jobs/s is taken
  over the completion stamps the database wrote (our ``finished_at``; PgQueuer's
  ``pgqueuer_log.created`` of its 'successful' rows), so process start-up is left out of
  both. Worker CPU comes from ``getrusage(RUSAGE_CHILDREN)`` (the whole process tree,
  once it has exited: a ``--burst`` worker's tree is gone before ``cpu_ticks`` could read
  it); PostgreSQL CPU from /proc (see ``PgCpu``). CPU per job is net of one empty run of
  the same configuration (start-up and exit, which dominate a short run).
* claimers — PostgreSQL CPU per job against the number of concurrent claimers of our
  worker (one claimer thread per process: P processes × T executor threads make P
  claimers), at one batch size.
* statement — the claim statement alone: pgbench replays our exact claim (captured from
  ``claim(batch)``) and one fenced completion per batch with C clients, so C concurrent
  claim statements run with no Python process beside the server; PostgreSQL CPU per job
  against C tells lock contention in the statement apart from CPU oversubscription by
  worker processes (which the claimers sweep cannot on a small machine). Each client
  count runs without and with the claim gate (``TASKCLAIM_CLAIM_GATE``), both sent as the
  worker sends them (simple query protocol; the gate and the claim in one query).
* latency — enqueue→start on an idle worker (one process, one thread; PgQueuer: one
  process, batch 1), with LISTEN/NOTIFY on both sides — ours woken by the ``post_save``
  hook and, in a second row, by the table's trigger (``notify = "trigger"``) — and the
  idle worker's RSS; two rounds, each system in turn.

PostgreSQL only. Every PgQueuer part is skipped, with the reason, when ``import
pgqueuer`` fails (``pip install --group bench``). PgQueuer runs on asyncpg, its first
choice, when installed (``--pgq-driver psycopg`` for its psycopg driver, whose
notification watcher holds the connection up to 1 s at a time: enqueue→start then
reaches 1–2 s for every other job). Figures are medians of --repeat runs;
the machine is shared, so compare the ratios of one run, not figures across runs.
Prints Markdown tables; writes JSON to results/peers-<time>.json and var/bench-peers.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.settings")

from django.db import connections  # noqa: E402
from django.test.utils import override_settings  # noqa: E402

import benchmarks.run as bench  # noqa: E402  (sets Django up)
from benchmarks.benchapp.models import BenchTask  # noqa: E402
from benchmarks.procstat import TICKS, cpu_ticks, proc_tree, rss_mb, stat_fields  # noqa: E402
from benchmarks.run import (  # noqa: E402
    PY,
    RESULTS,
    child_env,
    drained_rate,
    fill,
    idle_worker,
    log,
    machine,
    med,
    pct,
    reachable_aliases,
    server_version,
    stop_process,
    table,
    vendor,
    wait_started,
    worker_argv,
    worker_available,
)
from django_taskclaim.wakeup.trigger import sync_notify_triggers  # noqa: E402

VAR = ROOT / "var"
LATEST = VAR / "bench-peers.json"
STRATEGY = "skip_locked"
PGQ_PIN = "1.6"
SECTIONS = ("throughput", "claimers", "statement", "latency")
NS_PER_TICK = 1_000_000_000 // TICKS


# -- PostgreSQL server CPU ---------------------------------------------------------------


def _cpu_ns(pid: int | str, parts: list[str]) -> int:
    """CPU time of a process in ns: schedstat's run time (exact), else stat's ticks."""
    try:
        with open(f"/proc/{pid}/schedstat") as fh:
            return int(fh.read().split()[0])
    except (OSError, IndexError, ValueError):
        return cpu_ticks(parts) * NS_PER_TICK


def _cmdline(pid: int | str) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


class PgCpu:
    """CPU time of the local PostgreSQL server, read from /proc.

    The server is every process whose command line starts with ``postgres:`` (backends
    and auxiliary processes) plus their parent, the postmaster. A backend that exits
    during a run is reaped by the postmaster, and the kernel then adds its CPU time to
    the postmaster's cutime/cstime; so ``live processes' CPU + postmaster's own and its
    reaped children's``, read before and after a run, gives the server's CPU over the run,
    including processes that appeared or went away in between (once reaped: ``settle``).
    It also counts whatever other sessions on the same server did meanwhile.

    ``sample`` additionally follows the backends connected to the benchmark database
    (the process title names it): the known ones every call (every 20 ms while a run
    is sampled), a full /proc scan for new ones every 0.1 s. The sum of the last ticks
    seen of each is the benchmark's own share, blind to other sessions, but short of
    what a backend used after its last sample (its exit comes after the worker's).

    Per process, CPU is /proc/<pid>/schedstat's run time in ns: stat's utime+stime are
    whole ticks (10 ms), which would round 32 backends of a short run down to nothing.
    Reaped children exist only as the postmaster's cutime+cstime, in ticks.
    """

    def __init__(self, dbname: str) -> None:
        self.marker = f" {dbname} "
        self.other: set[int] = set()  # pids seen not to be postgres: processes
        self.seen: dict[tuple[int, str], int] = {}
        self.gone: set[tuple[int, str]] = set()
        self.discovered = 0.0

    def processes(self) -> dict[tuple[int, str], tuple[int, str, str, int]]:
        """(pid, start time) -> (ticks, state, command line, ppid) of ``postgres:`` ones."""
        out = {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) in self.other:
                continue
            cmd = _cmdline(entry)
            if not cmd.startswith("postgres:"):
                # A backend just forked still shows the postmaster's command line, and a
                # zombie shows none: only what is plainly not PostgreSQL is skipped later.
                if cmd and "postgres" not in cmd:
                    self.other.add(int(entry))
                continue
            parts = stat_fields(entry)
            if parts is None:
                continue
            out[(int(entry), parts[19])] = (_cpu_ns(entry, parts), parts[0], cmd, int(parts[1]))
        return out

    def total(self) -> int:
        procs = self.processes()
        self.parents = {ppid for _, _, _, ppid in procs.values()}
        ns = sum(t for t, _, _, _ in procs.values())
        for ppid in self.parents:
            parts = stat_fields(ppid)
            if parts is not None:  # its own time, and its reaped children's (cutime, cstime)
                ns += _cpu_ns(ppid, parts) + (int(parts[13]) + int(parts[14])) * NS_PER_TICK
        return ns

    def bench_backends(self) -> int:
        return sum(1 for _, _, cmd, _ in self.processes().values() if self.marker in cmd)

    def unreaped(self) -> bool:
        """Whether a child of the postmaster has exited and not been reaped yet."""
        for entry in os.listdir("/proc"):
            if entry.isdigit() and int(entry) not in self.other:
                parts = stat_fields(entry)
                if parts and parts[0] == "Z" and int(parts[1]) in self.parents:
                    return True
        return False

    def start(self) -> None:
        self.t0 = self.total()
        self.baseline = self.bench_backends()
        self.seen = {}
        self.discover()
        self.start_seen = dict(self.seen)

    def discover(self) -> None:
        self.discovered = time.monotonic()
        for key, (ticks, _, cmd, _) in self.processes().items():
            if self.marker in cmd:
                self.seen[key] = max(ticks, self.seen.get(key, 0))

    def sample(self) -> None:
        if time.monotonic() - self.discovered >= 0.1:
            self.discover()
            return
        for key in self.seen.keys() - self.gone:
            parts = stat_fields(key[0])
            if parts is None or parts[19] != key[1]:
                self.gone.add(key)
                continue
            self.seen[key] = max(_cpu_ns(key[0], parts), self.seen[key])

    def settle(self, timeout: float = 5.0) -> None:
        """Wait (with a deadline) until the run's backends have exited and been reaped."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.bench_backends() <= self.baseline and not self.unreaped():
                return
            time.sleep(0.02)

    def stop(self) -> dict[str, float]:
        """Seconds of server CPU since ``start``: all of it, and the benchmark DB's backends."""
        self.sample()
        self.settle()
        self.discover()
        t1 = self.total()
        ours = sum(v - self.start_seen.get(k, 0) for k, v in self.seen.items())
        return {"server_s": (t1 - self.t0) / 1e9, "bench_db_s": ours / 1e9}


# -- running worker processes ---------------------------------------------------------------


def run_processes(
    argvs: list[list[str]],
    env: dict[str, str],
    *,
    timeout: float,
    dbname: str,
) -> dict[str, Any]:
    """Start the processes, wait (deadline ``timeout``) for all to exit, measure CPU."""
    pg = PgCpu(dbname)
    pg.start()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    deadline = t0 + timeout
    procs: list[tuple[subprocess.Popen, IO[bytes]]] = []
    try:
        for argv in argvs:
            # Output goes to a file, never to a pipe nobody reads while the worker runs.
            log_file: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115 - closed below
            proc = subprocess.Popen(
                argv, env=env, cwd=ROOT, stdout=log_file, stderr=subprocess.STDOUT
            )
            procs.append((proc, log_file))
        for proc, _ in procs:
            while proc.poll() is None:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"did not finish within {timeout:g}s: {' '.join(argvs[0])}")
                pg.sample()
                try:
                    proc.wait(timeout=0.02)
                except subprocess.TimeoutExpired:
                    pass
        wall = time.monotonic() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = pg.stop()
        for (proc, log_file), argv in zip(procs, argvs, strict=True):
            if proc.returncode != 0:
                log_file.seek(0)
                text = log_file.read().decode(errors="replace")
                raise RuntimeError(f"exited {proc.returncode}: {' '.join(argv)}\n{text[-2000:]}")
    finally:
        for proc, log_file in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            log_file.close()
    return {
        "wall_s": wall,
        "worker_cpu_s": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
        "pg_cpu_s": cpu["server_s"],
        "pg_bench_db_cpu_s": cpu["bench_db_s"],
    }


def per_job_ms(seconds: float, jobs: int) -> float:
    return 1000.0 * seconds / jobs if jobs else float("nan")


# -- PgQueuer -------------------------------------------------------------------------------


def default_driver() -> str:
    """PgQueuer's own preference: asyncpg when it is installed, else psycopg."""
    try:
        import asyncpg  # noqa: F401
    except ImportError:
        return "psycopg"
    return "asyncpg"


def pgqueuer_missing(driver: str) -> str | None:
    """``None`` if PgQueuer and the driver import, else the reason they do not."""
    try:
        import pgqueuer
    except ImportError as exc:
        return f"import pgqueuer failed ({exc}); pip install --group bench"
    try:
        __import__(driver)
    except ImportError as exc:
        return f"PgQueuer's {driver} driver is not installed ({exc})"
    version = getattr(pgqueuer, "__version__", "?")
    if not version.startswith(PGQ_PIN + "."):
        log(f"note: PgQueuer {version} installed; this benchmark was written for {PGQ_PIN}.x")
    return None


def dsn_for(alias: str) -> str:
    """A postgresql:// URI for the alias (asyncpg reads URIs only; psycopg reads both)."""
    from urllib.parse import quote

    s = connections[alias].settings_dict
    user = quote(s.get("USER") or "", safe="")
    if s.get("PASSWORD"):
        user += ":" + quote(s["PASSWORD"], safe="")
    host = s.get("HOST") or "localhost"
    if host.startswith("/"):  # a Unix socket directory
        port = f"&port={s['PORT']}" if s.get("PORT") else ""
        return f"postgresql://{user}@/{quote(s['NAME'])}?host={quote(host)}{port}"
    netloc = f"[{host}]" if ":" in host else host
    if s.get("PORT"):
        netloc += f":{s['PORT']}"
    return f"postgresql://{user}{'@' if user else ''}{netloc}/{quote(s['NAME'], safe='')}"


class PgQueuerPeer:
    """PgQueuer's schema, backlog and results in the benchmark database."""

    def __init__(self, alias: str, driver: str) -> None:
        import pgqueuer
        import psycopg
        from pgqueuer.adapters.drivers.psycopg import SyncPsycopgDriver
        from pgqueuer.adapters.persistence.queries import SyncQueries

        self.version = getattr(pgqueuer, "__version__", "?")
        self.driver = driver
        self.dsn = dsn_for(alias)
        self.install()
        self.conn = psycopg.connect(self.dsn, autocommit=True)
        self.queries = SyncQueries(SyncPsycopgDriver(self.conn))
        names = self.queries.qbq.settings
        self.queue_table = names.queue_table
        self.log_table = names.queue_table_log
        self.stats_table = names.statistics_table

    def install(self) -> None:
        """PgQueuer's own install (or upgrade, when present): idempotent."""
        import psycopg
        from pgqueuer.queries import Queries

        async def go() -> str:
            async with await psycopg.AsyncConnection.connect(self.dsn, autocommit=True) as conn:
                q = Queries.from_psycopg_connection(conn)
                if await q.schema_is_installed():
                    plan = await q.apply_upgrade()
                    return f"present; upgrade applied {len(plan.statements)} statement(s)"
                await q.install()
                return "installed"

        self.schema = asyncio.run(go())

    def close(self) -> None:
        self.conn.close()

    def clean(self) -> None:
        self.conn.execute(
            f"TRUNCATE {self.queue_table}, {self.log_table}, {self.stats_table} RESTART IDENTITY"
        )

    def fill(self, n: int, entrypoint: str = "noop") -> None:
        """Empty PgQueuer's tables, then enqueue ``n`` jobs (lists: one statement)."""
        self.clean()
        for start in range(0, n, 10_000):
            k = min(10_000, n - start)
            self.queries.enqueue([entrypoint] * k, [None] * k, [0] * k)
        self.conn.execute(f"VACUUM ANALYZE {self.queue_table}")

    def queued(self) -> int:
        row = self.conn.execute(f"SELECT count(*) FROM {self.queue_table}").fetchone()
        return int(row[0]) if row else 0

    def drained_rate(self) -> tuple[int, float]:
        """(successful jobs, jobs/s over the span of their log stamps)."""
        row = self.conn.execute(
            f"SELECT count(*), min(created), max(created) FROM {self.log_table} "
            "WHERE status = 'successful'"
        ).fetchone()
        if not row or not row[0]:
            return 0, 0.0
        done, first, last = int(row[0]), row[1], row[2]
        span = (last - first).total_seconds()
        return done, (done - 1) / span if span > 0 else float("inf")

    def argv(self, factory: str, *, batch: int, drain: bool) -> list[str]:
        argv = [PY, "-m", "benchmarks.peer_pgqueuer", factory, "--batch-size", str(batch)]
        return [*argv, "--drain"] if drain else argv

    def env(self, **extra: str) -> dict[str, str]:
        from benchmarks.peer_pgqueuer import DRIVER_ENV, DSN_ENV

        return child_env(**{DSN_ENV: self.dsn, DRIVER_ENV: self.driver, **extra})


# -- section: throughput ---------------------------------------------------------------------


def ours_burst(
    args: argparse.Namespace,
    alias: str,
    *,
    processes: int,
    threads: int,
    batch: int,
    jobs: int,
) -> dict[str, Any]:
    """Drain ``jobs`` pre-filled rows with our worker (``jobs=0``: start-up and exit only)."""
    fill(alias, jobs)
    argv = worker_argv(alias, threads=threads, processes=processes, batch=batch, burst=True)
    r = run_processes(
        [argv],
        child_env(TASKCLAIM_BENCH_STRATEGY=STRATEGY),
        timeout=args.worker_timeout,
        dbname=connections[alias].settings_dict["NAME"],
    )
    done, rate = drained_rate(alias)
    if done != jobs:
        raise RuntimeError(f"our worker left {jobs - done} of {jobs} jobs undone")
    return {**r, "jobs_s": rate, "done": done}


def pgq_burst(
    args: argparse.Namespace,
    alias: str,
    peer: PgQueuerPeer,
    *,
    processes: int,
    batch: int,
    jobs: int,
) -> dict[str, Any]:
    """Drain ``jobs`` enqueued jobs with P PgQueuer processes (``jobs=0``: start and exit)."""
    peer.fill(jobs)
    argv = peer.argv("noop", batch=batch, drain=True)
    r = run_processes(
        [argv] * processes,
        peer.env(),
        timeout=args.worker_timeout,
        dbname=connections[alias].settings_dict["NAME"],
    )
    left = peer.queued()
    done, rate = peer.drained_rate()
    if left or done != jobs:
        raise RuntimeError(f"PgQueuer left {left} jobs in its queue; {done} of {jobs} succeeded")
    return {**r, "jobs_s": rate, "done": done}


CPU_KEYS = {
    "worker_cpu_s": "worker_cpu_ms_per_job",
    "pg_cpu_s": "pg_cpu_ms_per_job",
    "pg_bench_db_cpu_s": "pg_bench_db_cpu_ms_per_job",
}


def summarize(runs: list[dict[str, Any]], empty: dict[str, Any], jobs: int) -> dict[str, Any]:
    """Medians; CPU per job net of the same configuration's empty run (start-up, exit)."""
    out: dict[str, Any] = {
        "jobs_s": med([r["jobs_s"] for r in runs]),
        "runs": [round(r["jobs_s"]) for r in runs],
        "wall_s": med([r["wall_s"] for r in runs]),
        "empty_run": {k: round(empty[k], 3) for k in ("wall_s", *CPU_KEYS)},
    }
    for key, name in CPU_KEYS.items():
        out[name] = med([per_job_ms(r[key] - empty[key], jobs) for r in runs])
        out[name + "_gross"] = med([per_job_ms(r[key], jobs) for r in runs])
    return out


def drain_once(
    args: argparse.Namespace,
    alias: str,
    peer: PgQueuerPeer | None,
    system: str,
    *,
    processes: int,
    threads: int | None,
    batch: int,
    jobs: int,
) -> dict[str, Any]:
    if system == "pgqueuer":
        assert peer is not None
        return pgq_burst(args, alias, peer, processes=processes, batch=batch, jobs=jobs)
    return ours_burst(
        args, alias, processes=processes, threads=threads or 1, batch=batch, jobs=jobs
    )


def bench_throughput(
    args: argparse.Namespace, alias: str, peer: PgQueuerPeer | None, pgq_reason: str | None
) -> dict[str, Any]:
    out: dict[str, Any] = {"tasks": args.tasks, "rows": [], "pgqueuer_skipped": pgq_reason}
    for batch in args.batches:
        for procs in args.processes:
            systems: list[tuple[str, int | None]] = [("taskclaim", t) for t in args.threads]
            if peer is not None:
                systems.append(("pgqueuer", None))
            conf = {"processes": procs, "batch": batch}
            empty = {
                (s, t): drain_once(args, alias, peer, s, threads=t, jobs=0, **conf)
                for s, t in systems
            }
            runs: dict[tuple[str, int | None], list[dict[str, Any]]] = {s: [] for s in systems}
            for _ in range(args.repeat):  # interleaved, so that drift hits every system
                for system, threads in systems:
                    runs[(system, threads)].append(
                        drain_once(
                            args, alias, peer, system, threads=threads, jobs=args.tasks, **conf
                        )
                    )
            for key in systems:
                system, threads = key
                row = {
                    "system": system,
                    "threads": threads,
                    **conf,
                    **summarize(runs[key], empty[key], args.tasks),
                }
                out["rows"].append(row)
                what = f"{threads} thread(s)" if threads else "asyncio"
                log(
                    f"  {system} processes={procs} {what} batch={batch}: "
                    f"{row['jobs_s']:,.0f}/s (runs {row['runs']}); PostgreSQL "
                    f"{row['pg_bench_db_cpu_ms_per_job']:.3f} ms/job, worker "
                    f"{row['worker_cpu_ms_per_job']:.3f} ms/job"
                )
    return out


# -- section: claimers sweep ---------------------------------------------------------------


def bench_claimers(args: argparse.Namespace, alias: str) -> dict[str, Any]:
    batch = args.sweep_batch
    rows = []
    for procs, threads in args.claimers:
        conf = {"processes": procs, "threads": threads, "batch": batch}
        empty = ours_burst(args, alias, jobs=0, **conf)
        runs = [ours_burst(args, alias, jobs=args.tasks, **conf) for _ in range(args.repeat)]
        row = {**conf, "claimers": procs * threads, **summarize(runs, empty, args.tasks)}
        rows.append(row)
        log(
            f"  {procs}x{threads} batch={batch}: {row['jobs_s']:,.0f}/s, PostgreSQL "
            f"{row['pg_bench_db_cpu_ms_per_job']:.3f} ms/job (whole server "
            f"{row['pg_cpu_ms_per_job']:.3f}), worker {row['worker_cpu_ms_per_job']:.3f} ms/job"
        )
    return {"tasks": args.tasks, "batch": batch, "rows": rows}


# -- section: the claim statement alone ------------------------------------------------------


def bench_statement(args: argparse.Namespace, alias: str) -> dict[str, Any]:
    pgbench = bench.pgbench_binary()
    if pgbench is None:
        log("  statement sweep skipped: pgbench not found")
        return {"skipped": "pgbench not found"}
    batch = args.sweep_batch
    rows = []
    for clients in args.statement_clients:
        runs: dict[bool, list[dict[str, Any]]] = {False: [], True: []}
        for _ in range(args.repeat):  # interleaved, so that drift hits both
            for gate in (False, True):
                cpu = PgCpu(connections[alias].settings_dict["NAME"])
                runs[gate].append(
                    bench.pgbench_ceiling(
                        alias,
                        pgbench,
                        clients=clients,
                        batch=batch,
                        rows=args.tasks,
                        cpu=cpu,
                        gate=gate,
                    )
                )
        for gate in (False, True):
            per_job = [per_job_ms(r["cpu"]["bench_db_s"], r["done"]) for r in runs[gate]]
            fetched = [r.get("tuples_per_job", {}).get("fetched", 0.0) for r in runs[gate]]
            row = {
                "clients": clients,
                "batch": batch,
                "gate": gate,
                "jobs_s": med([r["jobs_s"] for r in runs[gate]]),
                "pg_bench_db_cpu_ms_per_job": med(per_job),
                "runs": [round(x, 4) for x in per_job],
                "jobs_s_runs": [round(r["jobs_s"]) for r in runs[gate]],
                "rows_fetched_per_job": med(fetched),
            }
            rows.append(row)
            log(
                f"  pgbench claim+complete clients={clients} batch={batch} "
                f"gate={'on' if gate else 'off'}: {row['jobs_s']:,.0f}/s, PostgreSQL "
                f"{row['pg_bench_db_cpu_ms_per_job']:.4f} ms/job (runs {row['runs']})"
            )
    return {"tasks": args.tasks, "batch": batch, "rows": rows}


# -- section: latency ----------------------------------------------------------------------


def tree_rss(pid: int) -> float:
    return sum(rss_mb(p) for p in proc_tree(pid))


def idle_rss(proc: subprocess.Popen, seconds: float) -> float:
    time.sleep(seconds)  # the idle period being measured, not a synchronisation
    return tree_rss(proc.pid)


def pause(i: int) -> None:
    time.sleep(0.05 + 0.1 * (i % 3))  # spacing between samples, off any poll period


def latency_ours(args: argparse.Namespace, alias: str, n: int, mode: str) -> dict[str, Any]:
    """``n`` enqueue→start samples on an idle worker, woken by the ``post_save`` hook
    (``mode="hook"``) or by the table's trigger (``mode="trigger"``: installed for the
    run, removed after it)."""
    notify_mode: bool | str = "trigger" if mode == "trigger" else True
    with override_settings(TASKCLAIM_NOTIFY=notify_mode):
        sync_notify_triggers(alias, [BenchTask])
        try:
            bench.NOTIFY_HOOKED = bench._notify_hooked()
            fill(alias, 0)
            with idle_worker(alias, notify=notify_mode, poll=5.0) as proc:
                rss = idle_rss(proc, args.idle_seconds)
                samples, enqueues = [], []
                for i in range(n):
                    pause(i)
                    item = bench.enqueue(alias)
                    enqueues.append((time.time() - item[1]) * 1000)
                    samples.append(wait_started(alias, item, timeout=30, proc=proc))
            fill(alias, 0)
        finally:
            with override_settings(TASKCLAIM_NOTIFY=True):
                sync_notify_triggers(alias, [BenchTask])
    how = "NOTIFY from a trigger on the table" if mode == "trigger" else "post_save hook"
    return {
        "system": "taskclaim" if mode == "hook" else "taskclaim (trigger)",
        "how": f"taskclaim_worker --concurrency 1 --batch 1, LISTEN/NOTIFY ({how})",
        "samples_ms": [round(x, 2) for x in samples],
        "enqueue_ms": [round(x, 2) for x in enqueues],
        "idle_rss_mb": rss,
    }


class StampReader:
    """Follows the file that PgQueuer's ``stamp`` entrypoint appends to."""

    def __init__(self, path: Path) -> None:
        self.fh = path.open()
        self.stamps: dict[int, float] = {}
        self.partial = ""

    def read(self) -> None:
        self.partial += self.fh.read()
        *lines, self.partial = self.partial.split("\n")
        for line in lines:
            job_id, stamp = line.split()
            self.stamps[int(job_id)] = float(stamp)

    def wait(self, job_id: int, t0: float, *, timeout: float, proc: subprocess.Popen) -> float:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.read()
            if job_id in self.stamps:
                return (self.stamps[job_id] - t0) * 1000
            if proc.poll() is not None:
                raise RuntimeError(f"PgQueuer exited {proc.returncode}")
            time.sleep(0.002)
        raise RuntimeError(f"PgQueuer job {job_id} was not started within {timeout:g}s")


@contextmanager
def pgq_idle_worker(
    peer: PgQueuerPeer, stamps: Path
) -> Iterator[tuple[subprocess.Popen, StampReader]]:
    from benchmarks.peer_pgqueuer import STAMPS_ENV

    stamps.write_text("")
    argv = peer.argv("stamp", batch=1, drain=False)
    out = tempfile.TemporaryFile()  # noqa: SIM115 - closed in the finally below
    proc = subprocess.Popen(
        argv,
        env=peer.env(**{STAMPS_ENV: str(stamps)}),
        cwd=ROOT,
        stdout=out,
        stderr=subprocess.STDOUT,
    )
    reader = StampReader(stamps)
    try:
        # A first job proves the worker is up, listening, and has its connection open.
        try:
            reader.wait(pgq_enqueue(peer)[0], 0.0, timeout=60, proc=proc)
        except RuntimeError:
            out.seek(0)
            raise RuntimeError(out.read().decode(errors="replace")[-2000:]) from None
        yield proc, reader
    finally:
        stop_process(proc)
        out.close()
        reader.fh.close()


def pgq_enqueue(peer: PgQueuerPeer) -> tuple[int, float]:
    t0 = time.time()
    (job_id,) = peer.queries.enqueue("stamp", None)
    return int(job_id), t0


def latency_pgq(args: argparse.Namespace, peer: PgQueuerPeer, n: int) -> dict[str, Any]:
    peer.clean()
    with (
        tempfile.TemporaryDirectory() as tmp,
        pgq_idle_worker(peer, Path(tmp) / "stamps") as (proc, reader),
    ):
        rss = idle_rss(proc, args.idle_seconds)
        samples, enqueues = [], []
        for i in range(n):
            pause(i)
            job_id, t0 = pgq_enqueue(peer)
            enqueues.append((time.time() - t0) * 1000)
            samples.append(reader.wait(job_id, t0, timeout=30, proc=proc))
    peer.clean()
    return {
        "system": "pgqueuer",
        "how": f"pgqueuer.run() ({peer.driver}), batch size 1, LISTEN/NOTIFY (table trigger)",
        "samples_ms": [round(x, 2) for x in samples],
        "enqueue_ms": [round(x, 2) for x in enqueues],
        "idle_rss_mb": rss,
    }


def bench_latency(
    args: argparse.Namespace, alias: str, peer: PgQueuerPeer | None, pgq_reason: str | None
) -> dict[str, Any]:
    out: dict[str, Any] = {"rows": [], "pgqueuer_skipped": pgq_reason}
    # Two rounds, each system in turn, so that the machine's drift hits all of them.
    rounds = 2
    runs: dict[str, list[dict[str, Any]]] = {}
    for r in range(rounds):
        n = args.latency_samples // rounds + (args.latency_samples % rounds if r == 0 else 0)
        for mode in ("hook", "trigger"):
            runs.setdefault(mode, []).append(latency_ours(args, alias, n, mode))
        if peer is not None:
            runs.setdefault("pgqueuer", []).append(latency_pgq(args, peer, n))
    for parts in runs.values():
        samples = [x for p in parts for x in p["samples_ms"]]
        enqueues = [x for p in parts for x in p["enqueue_ms"]]
        # The enqueue call returns once its INSERT has committed; what follows is the
        # worker's part: the notification, the claim, the hand-over to the body.
        after = [s - e for s, e in zip(samples, enqueues, strict=True)]
        out["rows"].append(
            {
                **parts[0],
                "n": len(samples),
                "p50_ms": pct(samples, 50),
                "p95_ms": pct(samples, 95),
                "enqueue_p50_ms": pct(enqueues, 50),
                "after_enqueue_p50_ms": pct(after, 50),
                "samples_ms": samples,
                "enqueue_ms": enqueues,
                "idle_rss_mb": max(p["idle_rss_mb"] for p in parts),
            }
        )
    for r in out["rows"]:
        log(
            f"  {r['system']}: enqueue->start p50={r['p50_ms']:.1f} ms p95={r['p95_ms']:.1f} ms "
            f"(enqueue {r['enqueue_p50_ms']:.1f} ms, then {r['after_enqueue_p50_ms']:.1f} ms), "
            f"idle rss {r['idle_rss_mb']:.1f} MB"
        )
    return out


# -- report ----------------------------------------------------------------------------------


def _f(value: float | None, spec: str = ",.0f") -> str:
    return "" if value is None else format(value, spec)


def report(data: dict[str, Any]) -> str:
    m = data["machine"]
    parts = [
        f"# django-taskclaim beside PgQueuer ({'quick' if data['quick'] else 'full'}), "
        f"median of {data['repeat']}\n{m['cpu']}, {m['cores']} cores, {m['memory_mb']} MB; "
        f"load {m['load_avg'][0]:.1f}; Python {m['python']}, Django {m['django']}, "
        f"psycopg {m['psycopg']}; {data['server']}; PgQueuer "
        + (
            f"{data['pgqueuer']['version']} ({data['pgqueuer']['driver']} driver)"
            if "version" in data["pgqueuer"]
            else f"skipped: {data['pgqueuer']['skipped']}"
        )
    ]
    tp = data.get("throughput")
    if tp and tp["rows"]:
        pgq = {(r["processes"], r["batch"]): r for r in tp["rows"] if r["system"] == "pgqueuer"}
        rows = []
        for r in tp["rows"]:
            peer = pgq.get((r["processes"], r["batch"]))
            ratio = (
                f"{r['jobs_s'] / peer['jobs_s']:.2f}x"
                if peer and r["system"] == "taskclaim" and peer["jobs_s"]
                else ""
            )
            rows.append(
                [
                    r["processes"],
                    r["system"],
                    r["threads"] if r["threads"] else "asyncio",
                    r["batch"],
                    _f(r["jobs_s"]),
                    " ".join(f"{x:,}" for x in r["runs"]),
                    ratio,
                    f"{r['wall_s']:.1f}",
                    _f(r["worker_cpu_ms_per_job"], ".3f"),
                    _f(r["pg_bench_db_cpu_ms_per_job"], ".3f"),
                    _f(r["pg_cpu_ms_per_job"], ".3f"),
                ]
            )
        parts.append(
            table(
                f"Throughput: {tp['tasks']:,} no-op jobs drained (jobs/s over completion stamps)",
                [
                    "processes",
                    "system",
                    "threads / proc",
                    "batch",
                    "jobs/s",
                    "runs",
                    "ours / PgQueuer",
                    "wall s",
                    "worker cpu ms/job",
                    "pg cpu ms/job (bench db)",
                    "pg cpu ms/job (server)",
                ],
                rows,
            )
        )
        parts.append(
            "\nCPU per job is net of an empty run of the same configuration (start-up and "
            "exit); 'bench db' = the backends connected to the benchmark database, "
            "'server' = every PostgreSQL process, other sessions included."
        )
        best_ours = max((r for r in tp["rows"] if r["system"] == "taskclaim"), key=_rate)
        best_pgq = max(
            (r for r in tp["rows"] if r["system"] == "pgqueuer"), key=_rate, default=None
        )
        if best_pgq:
            parts.append(
                f"\nbest vs best: taskclaim {best_ours['jobs_s']:,.0f}/s "
                f"({best_ours['processes']}x{best_ours['threads']}) / PgQueuer "
                f"{best_pgq['jobs_s']:,.0f}/s ({best_pgq['processes']} processes) = "
                f"{best_ours['jobs_s'] / best_pgq['jobs_s']:.2f}x"
            )
        if tp.get("pgqueuer_skipped"):
            parts.append(f"\nPgQueuer rows skipped: {tp['pgqueuer_skipped']}")
    sw = data.get("claimers")
    if sw and sw["rows"]:
        base = sw["rows"][0]

        def vs(r: dict[str, Any], key: str) -> str:
            return f"{r[key] / base[key]:.2f}x" if base[key] > 0 else ""

        rows = [
            [
                f"{r['processes']}x{r['threads']}",
                r["processes"],
                _f(r["jobs_s"]),
                _f(r["pg_bench_db_cpu_ms_per_job"], ".3f"),
                vs(r, "pg_bench_db_cpu_ms_per_job"),
                _f(r["pg_cpu_ms_per_job"], ".3f"),
                vs(r, "pg_cpu_ms_per_job"),
                _f(r["worker_cpu_ms_per_job"], ".3f"),
                vs(r, "worker_cpu_ms_per_job"),
            ]
            for r in sw["rows"]
        ]
        parts.append(
            table(
                f"PostgreSQL CPU per job by concurrent claimers (our worker, batch {sw['batch']}, "
                f"{sw['tasks']:,} jobs)",
                [
                    "processes × threads",
                    "claimers",
                    "jobs/s",
                    "pg cpu ms/job (bench db)",
                    "vs first",
                    "pg cpu ms/job (server)",
                    "vs first",
                    "worker cpu ms/job",
                    "vs first",
                ],
                rows,
            )
        )
    st = data.get("statement")
    if st and st.get("rows"):
        first = {
            r.get("gate", False): r["pg_bench_db_cpu_ms_per_job"]
            for r in reversed(st["rows"])  # the first row of each gate setting wins
        }
        parts.append(
            table(
                f"The claim statement alone: pgbench replays our claim + one fenced completion "
                f"per batch, without and with the claim gate (batch {st['batch']}, "
                f"{st['tasks']:,} jobs)",
                [
                    "concurrent claims",
                    "claim gate",
                    "jobs/s",
                    "rows fetched / job",
                    "pg cpu ms/job (bench db)",
                    "vs first",
                    "runs",
                ],
                [
                    [
                        r["clients"],
                        "on" if r.get("gate") else "off",
                        _f(r["jobs_s"]),
                        _f(r.get("rows_fetched_per_job"), ".1f"),
                        _f(r["pg_bench_db_cpu_ms_per_job"], ".4f"),
                        f"{r['pg_bench_db_cpu_ms_per_job'] / first[r.get('gate', False)]:.2f}x"
                        if first[r.get("gate", False)] > 0
                        else "",
                        ", ".join(f"{x:.4f}" for x in r["runs"]),
                    ]
                    for r in st["rows"]
                ],
            )
        )
    elif st:
        parts.append(f"\nstatement sweep skipped: {st.get('skipped')}")
    server = [
        r["pg_cpu_ms_per_job"] for r in (tp or {}).get("rows", []) + (sw or {}).get("rows", [])
    ]
    loads = [m["load_avg"][0], *data.get("load_avg_after", [])[:1]]
    if server and (min(server) <= 0 or max(loads) > (m["cores"] or 1)):
        parts.append(
            f"\nWARNING: other work shared the machine (load {max(loads):.1f} on {m['cores']} "
            "cores) or the server: the 'server' PostgreSQL column is unreliable in this run; "
            "the 'bench db' one counts only the benchmark's own backends."
        )
    lat = data.get("latency")
    if lat and lat["rows"]:
        parts.append(
            table(
                "enqueue → start on an idle worker (one process, one thread / batch 1)",
                [
                    "system",
                    "samples",
                    "p50 ms",
                    "p95 ms",
                    "enqueue call p50 ms",
                    "after it p50 ms",
                    "idle rss MB",
                    "how",
                ],
                [
                    [
                        r["system"],
                        r["n"],
                        f"{r['p50_ms']:.1f}",
                        f"{r['p95_ms']:.1f}",
                        f"{r['enqueue_p50_ms']:.2f}",
                        f"{r['after_enqueue_p50_ms']:.2f}",
                        f"{r['idle_rss_mb']:.1f}",
                        r["how"],
                    ]
                    for r in lat["rows"]
                ],
            )
        )
        if lat.get("pgqueuer_skipped"):
            parts.append(f"\nPgQueuer latency skipped: {lat['pgqueuer_skipped']}")
    return "\n".join(parts)


def _rate(row: dict[str, Any]) -> float:
    return float(row["jobs_s"])


# -- main ------------------------------------------------------------------------------------


def claimer_config(text: str) -> tuple[int, int]:
    try:
        p, t = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected PxT (e.g. 4x2), got {text!r}")
    if p < 1 or t < 1:
        raise argparse.ArgumentTypeError(f"processes and threads must be positive: {text!r}")
    return p, t


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="smoke run: fewer jobs, one repeat")
    p.add_argument("--only", action="append", choices=SECTIONS, help="run only these sections")
    p.add_argument("--database", help="database alias (default: the first PostgreSQL one)")
    p.add_argument(
        "--pgq-driver",
        choices=["asyncpg", "psycopg"],
        default=None,
        help="PgQueuer's driver (default: asyncpg when installed, as PgQueuer prefers)",
    )
    p.add_argument("--repeat", type=int, default=None, help="runs per figure (3; quick 1)")
    p.add_argument("--tasks", type=int, default=None, help="backlog per run (20000; quick 3000)")
    p.add_argument("--processes", nargs="+", type=int, default=[1, 2, 4])
    p.add_argument("--threads", nargs="+", type=int, default=[1, 4], help="our threads per process")
    p.add_argument("--batches", nargs="+", type=int, default=[100], help="claim batch sizes")
    p.add_argument(
        "--claimers",
        nargs="+",
        type=claimer_config,
        default=[(1, 2), (2, 1), (2, 2), (4, 2), (4, 4), (8, 4)],
        help="claimers sweep: processes x threads (1x2 2x1 2x2 4x2 4x4 8x4)",
    )
    p.add_argument("--sweep-batch", type=int, default=100)
    p.add_argument(
        "--statement-clients",
        nargs="+",
        type=int,
        default=[2, 8, 32],
        help="statement sweep: concurrent pgbench clients replaying our claim (2 8 32)",
    )
    p.add_argument("--latency-samples", type=int, default=None, help="(50; quick 15)")
    p.add_argument("--idle-seconds", type=float, default=2.0, help="idle time before RSS")
    p.add_argument("--worker-timeout", type=float, default=300.0)
    p.add_argument("--output", type=Path, default=None, help="JSON file (default: results/)")
    p.add_argument("--render", type=Path, help="print the report of an earlier JSON file")
    args = p.parse_args(argv)
    defaults = {
        "repeat": 1 if args.quick else 3,
        "tasks": 3000 if args.quick else 20_000,
        "latency_samples": 15 if args.quick else 50,
    }
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.repeat < 1:
        p.error("--repeat must be at least 1")
    if args.tasks < 2:
        p.error("--tasks must be at least 2")
    return args


def pick_alias(args: argparse.Namespace) -> tuple[str | None, str | None]:
    """(alias, None) or (None, the reason no PostgreSQL database can be used)."""
    ready = reachable_aliases()
    if args.database:
        if args.database not in ready:
            return None, f"database {args.database!r} is not configured or not reachable"
        if vendor(args.database) != "postgresql":
            return None, (
                f"database {args.database!r} is {vendor(args.database)}: PgQueuer and "
                "this comparison are PostgreSQL only"
            )
        return args.database, None
    pg = [a for a in ready if vendor(a) == "postgresql"]
    if not pg:
        return None, "no PostgreSQL database reachable: PgQueuer and this comparison need one"
    return pg[0], None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.render:
        print(report(json.loads(args.render.read_text())))
        return 0
    sections = args.only or list(SECTIONS)
    alias, reason = pick_alias(args)
    if alias is None:
        log(f"peers benchmark skipped: {reason}")
        return 0
    worker_reason = worker_available()
    if worker_reason:
        log(f"peers benchmark skipped: {worker_reason}")
        return 0
    started = time.monotonic()
    driver = args.pgq_driver or default_driver()
    pgq_reason = pgqueuer_missing(driver)
    peer = None
    if pgq_reason:
        log(f"PgQueuer parts skipped: {pgq_reason}")
    else:
        peer = PgQueuerPeer(alias, driver)
        log(f"PgQueuer {peer.version} ({driver} driver); schema {peer.schema}")
    data: dict[str, Any] = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "argv": sys.argv,
        "quick": args.quick,
        "repeat": args.repeat,
        "machine": machine(),
        "server": server_version(alias),
        "database": alias,
        "strategy": STRATEGY,
        "pgqueuer": (
            {"skipped": pgq_reason}
            if peer is None
            else {"version": peer.version, "driver": peer.driver, "schema": peer.schema}
        ),
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    VAR.mkdir(parents=True, exist_ok=True)
    stamp = f"{datetime.now(UTC):%Y%m%dT%H%M%S}{'-quick' if args.quick else ''}"
    target = args.output or RESULTS / f"peers-{stamp}.json"

    def save() -> None:  # after every section, so that an interrupted run keeps its data
        text = json.dumps(data, indent=2, default=str)
        target.write_text(text)
        LATEST.write_text(text)

    try:
        if "throughput" in sections:
            log("throughput…")
            data["throughput"] = bench_throughput(args, alias, peer, pgq_reason)
            save()
        if "claimers" in sections:
            log("claimers sweep (PostgreSQL CPU per job)…")
            data["claimers"] = bench_claimers(args, alias)
            save()
        if "statement" in sections:
            log("claim statement alone, pgbench (PostgreSQL CPU per job)…")
            data["statement"] = bench_statement(args, alias)
            save()
        if "latency" in sections:
            log("enqueue→start and idle RSS…")
            data["latency"] = bench_latency(args, alias, peer, pgq_reason)
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
