#!/usr/bin/env python
"""What the supervised default costs beside ``--no-supervisor``: memory and start-up.

    python benchmarks/supervised.py [--rounds 3] [--idle 3] [--database default]

For each round, the two ways the worker command runs, one after the other (so the
machine's load falls on both alike): ``manage.py taskclaim_worker`` as the README starts
it (a supervisor and its one worker process) and with ``--no-supervisor`` (one process),
each with 1 thread, batch 1, ``--no-reap``. Measured:

- start to first claim: from just before ``Popen`` to the start of the body of the one
  stamped row waiting (the body stamps ``time.time()``: same machine, same clock);
- memory after ``--idle`` seconds idle: the proportional set size (PSS, from
  ``/proc/<pid>/smaps_rollup``: a page shared by the supervisor and its child counts
  half in each) and the RSS, each summed over the worker's processes.

With ``--tasks N``, also the jobs per second of a ``--burst`` drain of N rows at batch 1
and batch 100 (4 threads), the two ways interleaved in each round. Medians of
``--rounds``; a table on stdout, JSON under ``benchmarks/results/``. PostgreSQL
as ``benchmarks/settings.py`` finds it. Figures from a loaded machine compare only
within one run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import run
from benchmarks.benchapp.models import BenchTask
from benchmarks.procstat import proc_tree

MODES = {"supervised (default)": [], "--no-supervisor": ["--no-supervisor"]}


def smaps_mb(pid: int) -> tuple[float, float]:
    """``(pss, rss)`` of ``pid`` in MB (``smaps_rollup``); zeros once it is gone."""
    found = {"Pss:": 0, "Rss:": 0}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as fh:
            for line in fh:
                parts = line.split()
                if parts and parts[0] in found:
                    found[parts[0]] = int(parts[1])
    except OSError:
        pass
    return found["Pss:"] / 1000, found["Rss:"] / 1000


def one(alias: str, extra: list[str], idle: float) -> dict[str, Any]:
    """Start a worker with ``extra`` flags; its first claim, then its idle memory."""
    pk = BenchTask.objects.using(alias).create(stamp=True).pk
    argv = run.worker_argv(alias, threads=1, processes=1, batch=1, burst=False) + extra
    out = tempfile.TemporaryFile()  # noqa: SIM115 - closed with the process
    t0 = time.time()
    proc = subprocess.Popen(argv, env=run.child_env(), stdout=out, stderr=subprocess.STDOUT)
    proc.log_file = out  # type: ignore[attr-defined]
    try:
        first = run.wait_started(alias, (pk, t0), timeout=60, proc=proc) / 1000
        time.sleep(idle)  # a benchmark, not a test: the worker settles, idle
        pids = proc_tree(proc.pid)
        sizes = [smaps_mb(p) for p in pids]
    finally:
        run.stop_process(proc)
        out.close()
    return {
        "first_claim_s": first,
        "processes": len(pids),
        "pss_mb": sum(s[0] for s in sizes),
        "rss_mb": sum(s[1] for s in sizes),
        "per_process_pss_mb": [s[0] for s in sizes],
    }


def drain(alias: str, extra: list[str], tasks: int, batch: int) -> float:
    """Jobs per second of one worker (4 threads, ``batch``) draining ``tasks`` ready rows
    with ``--burst``, from ``Popen`` to its exit (start-up included, alike for both)."""
    run.fill(alias, tasks)
    argv = run.worker_argv(alias, threads=4, processes=1, batch=batch, burst=True) + extra
    t0 = time.monotonic()
    done = subprocess.run(argv, env=run.child_env(), capture_output=True, timeout=600)
    seconds = time.monotonic() - t0
    if done.returncode != 0:
        raise RuntimeError(f"worker exited {done.returncode}: {done.stderr[-2000:]!r}")
    return tasks / seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--idle", type=float, default=3.0)
    parser.add_argument("--database", default="default")
    parser.add_argument(
        "--tasks", type=int, default=0, help="also drain this many rows at batch 1 and 100"
    )
    args = parser.parse_args()
    alias = args.database
    run.ensure_database(alias)
    BenchTask.objects.using(alias).all().delete()
    found: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
    for i in range(args.rounds):
        for mode, extra in MODES.items():
            found[mode].append(one(alias, extra, args.idle))
            run.log(f"round {i + 1} {mode}: {found[mode][-1]}")
    rows = []
    for mode, results in found.items():
        rows.append(
            [
                mode,
                results[0]["processes"],
                f"{statistics.median(r['pss_mb'] for r in results):.1f}",
                f"{statistics.median(r['rss_mb'] for r in results):.1f}",
                f"{statistics.median(r['first_claim_s'] for r in results):.2f}",
            ]
        )
    print(
        run.table(
            f"worker command, supervised or not ({args.rounds} rounds, medians)",
            ["", "processes", "PSS MB (sum)", "RSS MB (sum)", "start to first claim s"],
            rows,
        )
    )
    rates: dict[str, dict[int, list[float]]] = {mode: {1: [], 100: []} for mode in MODES}
    if args.tasks:
        for i in range(args.rounds):
            for batch in (1, 100):
                for mode, extra in MODES.items():
                    rates[mode][batch].append(drain(alias, extra, args.tasks, batch))
                    run.log(f"round {i + 1} {mode} batch {batch}: {rates[mode][batch][-1]:.0f}/s")
        print(
            run.table(
                f"--burst drain of {args.tasks} rows, 4 threads (jobs/s, median of "
                f"{args.rounds} interleaved; start-up included)",
                ["", "batch 1", "batch 100"],
                [
                    [mode, *(f"{statistics.median(rates[mode][b]):.0f}" for b in (1, 100))]
                    for mode in MODES
                ],
            )
        )
    run.RESULTS.mkdir(parents=True, exist_ok=True)
    out = run.RESULTS / f"supervised-{datetime.now(UTC):%Y%m%dT%H%M%S}.json"
    out.write_text(
        json.dumps({"machine": run.machine(), "results": found, "drain": rates}, indent=2)
    )
    print(f"JSON: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
