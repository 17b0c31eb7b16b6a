"""One worker fleet over one database vs over two: throughput on this machine.

``python benchmarks/fleet.py [--tasks N] [--repeat R]``: ``default`` is the benchmark
PostgreSQL (127.0.0.1:5432, or an embedded one); ``shard`` is a second server, an
embedded PostgreSQL started under ``var/bench-shard-pg``. Each repeat drains 2N no-op
``BenchTask`` rows with ``taskclaim_worker --burst``: all on ``default`` with P processes,
then N on each database with ``--database default --database shard`` and P/2 processes
per database (the same P in all). Rows/s over the span of the rows' ``finished_at``
stamps on both servers (one machine, one clock): start-up excluded. Prints a table and writes JSON
(default ``var/bench-fleet.json``). On one machine both servers share its cores, so the
ratio shows the fleet's overhead and the per-server contention it removes, not the
capacity a second machine would add.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.settings_fleet")
SHARD_DB = "taskclaim_bench_shard"


def start_shard() -> str:
    """Start (or reuse) the embedded second server; return its ``postgres://`` URL."""
    code = (
        "import json; from django_taskclaim import embedded; "
        f"print(json.dumps(embedded.start({str(ROOT / 'var' / 'bench-shard-pg')!r})))"
    )
    done = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True, check=True
    )
    conf = json.loads(done.stdout.strip().splitlines()[-1])
    return f"postgres://postgres@/{SHARD_DB}?host={conf['HOST']}&port={conf['PORT']}"


def recreate(conf: dict[str, Any], name: str) -> None:
    import psycopg

    admin = psycopg.connect(
        host=conf["HOST"], port=conf.get("PORT") or 5432, user=conf["USER"] or "postgres",
        dbname="postgres", autocommit=True,
    )  # fmt: skip
    with admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{name}"')


def setup() -> None:
    import django
    from django.conf import settings

    recreate(settings.DATABASES["default"], settings.DATABASES["default"]["NAME"])
    recreate(settings.DATABASES["shard"], SHARD_DB)
    django.setup()
    from django.core.management import call_command

    for alias in ("default", "shard"):
        call_command("migrate", database=alias, run_syncdb=True, verbosity=0)


def drain(databases: list[str], processes: int, threads: int, batch: int) -> float:
    """Run one ``taskclaim_worker --burst`` over ``databases``; return its wall seconds."""
    argv = [
        sys.executable, "-m", "django", "taskclaim_worker", "benchapp.BenchTask", "--burst",
        "--processes", str(processes), "--concurrency", str(threads), "--batch", str(batch),
        "--no-reap", *(a for alias in databases for a in ("--database", alias)),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    began = time.monotonic()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=1200)
    if done.returncode != 0:
        raise RuntimeError(f"worker exited {done.returncode}:\n{done.stderr[-2000:]}")
    return time.monotonic() - began


def run(layout: dict[str, int], processes: int, threads: int, batch: int) -> float:
    """Rows/s of draining ``layout`` (alias -> rows), start-up excluded."""
    from django.db.models import Max, Min

    from benchmarks.benchapp.models import BenchTask

    aliases = list(layout)
    per_alias = max(1, processes // len(aliases))
    for alias in ("default", "shard"):
        BenchTask.objects.using(alias).all().delete()
    for alias, n in layout.items():
        BenchTask.objects.using(alias).bulk_create([BenchTask() for _ in range(n)], batch_size=5000)
    drain(aliases, per_alias, threads, batch)
    first, last = [], []
    for alias in aliases:
        rows = BenchTask.objects.using(alias)
        left = rows.exclude(status="done").count()
        if left:
            raise RuntimeError(f"{left} rows not done on {alias}")
        agg = rows.aggregate(first=Min("finished_at"), last=Max("finished_at"))
        first.append(agg["first"])
        last.append(agg["last"])
    span = (max(last) - min(first)).total_seconds()
    return (sum(layout.values()) - 1) / span


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", type=int, default=20_000, help="rows per database (N)")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--processes", type=int, default=2, help="processes in all (P)")
    p.add_argument("--threads", type=int, default=4)
    p.add_argument("--batch", type=int, default=100)
    p.add_argument("--json", default=str(ROOT / "var" / "bench-fleet.json"))
    args = p.parse_args()
    os.environ["TASKCLAIM_BENCH_SHARD_URL"] = start_shard()
    setup()
    n, config = args.tasks, (args.processes, args.threads, args.batch)
    one: list[float] = []
    two: list[float] = []
    for _ in range(args.repeat):
        one.append(run({"default": 2 * n}, *config))
        two.append(run({"default": n, "shard": n}, *config))
    rows = [
        {"databases": 1, "layout": f"{2 * n:,} rows on default", "runs": one},
        {"databases": 2, "layout": f"{n:,} rows on each", "runs": two},
    ]
    print(f"\n{args.processes} processes in all x {args.threads} threads, batch {args.batch}")
    print(f"{'databases':>9}  {'layout':28} {'rows/s (median)':>16}  runs")
    for row in rows:
        row["median"] = statistics.median(row["runs"])
        runs = ", ".join(f"{r:,.0f}" for r in row["runs"])
        print(f"{row['databases']:>9}  {row['layout']:28} {row['median']:16,.0f}  {runs}")
    ratio = rows[1]["median"] / rows[0]["median"]
    print(f"\ntwo databases / one: {ratio:.2f}x")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(
        json.dumps({"config": vars(args), "rows": rows, "two_over_one": ratio}, indent=2)
    )


if __name__ == "__main__":
    main()
