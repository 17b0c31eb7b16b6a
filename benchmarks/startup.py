#!/usr/bin/env python
"""How soon a worker is ready: from ``manage.py taskclaim_worker`` to its first task, and
from a ``SIGKILL`` of a supervised child to its replacement's first task.

    python benchmarks/startup.py [--rounds 5] [--database default]

Cold start: one stamped row is waiting (``BenchTask(stamp=True)``); the figure is the time
from just before ``Popen`` of the worker (1 process, 1 thread, batch 1, ``--no-reap``)
to the moment its body started that row (the body stamps ``time.time()``: same machine,
same clock), split at the worker's start-up line (its imports, settings, checks and
connection done). Replacement: a supervisor with one child (``--processes 1``), idle;
the child is ``SIGKILL``ed and one stamped row inserted at once; the figure is the time
from the kill to the body's start in the replacement (the supervisor forks it from a
process that has Django imported; the figure includes its restart delay, 0 s after a
child that lived more than a few seconds). Medians of ``--rounds``; a table on stdout,
JSON under ``benchmarks/results/``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import run
from benchmarks.benchapp.models import BenchTask
from django_taskclaim.models import WorkerProcess


def _started(alias: str, pk: int, t0: float, proc: subprocess.Popen, timeout: float) -> float:
    """Seconds from ``t0`` to the start of row ``pk``'s body."""
    return run.wait_started(alias, (pk, t0), timeout=timeout, proc=proc) / 1000


def _spawn(alias: str, *, processes: int) -> tuple[subprocess.Popen, float]:
    argv = run.worker_argv(alias, threads=1, processes=1, batch=1, burst=False)
    if processes:
        argv += ["--processes", str(processes)]
    out = tempfile.TemporaryFile()  # noqa: SIM115 - closed with the process
    t0 = time.time()
    proc = subprocess.Popen(argv, env=run.child_env(), stdout=out, stderr=subprocess.STDOUT)
    proc.log_file = out  # type: ignore[attr-defined]
    return proc, t0


def _line_at(proc: subprocess.Popen, text: str, timeout: float) -> float:
    """``time.time()`` when ``text`` first appears in the process's output."""
    deadline = time.monotonic() + timeout
    log = proc.log_file  # type: ignore[attr-defined]
    while time.monotonic() < deadline:
        log.seek(0)
        if text.encode() in log.read():
            return time.time()
        if proc.poll() is not None:
            raise RuntimeError(f"worker exited {proc.returncode}")
        time.sleep(0.002)
    raise RuntimeError(f"{text!r} not printed within {timeout:g}s")


def cold_start(alias: str) -> dict[str, float]:
    pk = BenchTask.objects.using(alias).create(stamp=True).pk
    proc, t0 = _spawn(alias, processes=0)
    try:
        line = _line_at(proc, "taskclaim worker", 60) - t0
        first = _started(alias, pk, t0, proc, 60)
    finally:
        run.stop_process(proc)
    return {"startup_line_s": line, "first_task_s": first}


def replacement(alias: str) -> float:
    proc, _ = _spawn(alias, processes=1)
    try:
        pk0 = BenchTask.objects.using(alias).create(stamp=True).pk
        _started(alias, pk0, time.time(), proc, 60)  # the child is up and idle
        child = (
            WorkerProcess.objects.using(alias)
            .filter(stopped_at__isnull=True)
            .order_by("-started_at")
            .values_list("pid", flat=True)
            .first()
        )
        if child is None:
            raise RuntimeError("no live child in the worker registry")
        time.sleep(5)  # a child that lived a few seconds is replaced without backoff
        t0 = time.time()
        os.kill(child, signal.SIGKILL)
        pk = BenchTask.objects.using(alias).create(stamp=True).pk
        return _started(alias, pk, t0, proc, 60)
    finally:
        run.stop_process(proc)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--database", default="default")
    args = parser.parse_args()
    alias = args.database
    run.ensure_database(alias)
    BenchTask.objects.using(alias).all().delete()
    WorkerProcess.objects.using(alias).all().delete()
    colds, repl = [], []
    for i in range(args.rounds):
        colds.append(cold_start(alias))
        repl.append(replacement(alias))
        run.log(f"round {i + 1}: cold {colds[-1]}, replacement {repl[-1]:.3f} s")
    rows = [
        [
            "cold start: start-up line",
            f"{statistics.median(c['startup_line_s'] for c in colds):.2f}",
            f"{min(c['startup_line_s'] for c in colds):.2f}",
            f"{max(c['startup_line_s'] for c in colds):.2f}",
        ],
        [
            "cold start: first task started",
            f"{statistics.median(c['first_task_s'] for c in colds):.2f}",
            f"{min(c['first_task_s'] for c in colds):.2f}",
            f"{max(c['first_task_s'] for c in colds):.2f}",
        ],
        [
            "SIGKILLed child: replacement's first task",
            f"{statistics.median(repl):.2f}",
            f"{min(repl):.2f}",
            f"{max(repl):.2f}",
        ],
    ]
    print(
        run.table(
            f"worker ready ({args.rounds} rounds, seconds)", ["", "median", "min", "max"], rows
        )
    )
    run.RESULTS.mkdir(parents=True, exist_ok=True)
    out = run.RESULTS / f"startup-{datetime.now(UTC):%Y%m%dT%H%M%S}.json"
    out.write_text(
        json.dumps({"machine": run.machine(), "cold": colds, "replacement_s": repl}, indent=2)
    )
    print(f"JSON: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
