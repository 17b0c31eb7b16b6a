#!/usr/bin/env python
"""What an idle worker holds beyond ``django.setup()`` and one connection.

    python benchmarks/idle_memory.py

Two stages, each a fresh interpreter on ``benchmarks.settings`` (the library and the
benchmark app installed), each measured after --idle seconds: the *base* (``django.setup()``
and one open connection) and an idle ``taskclaim_worker`` (1 thread, batch 1,
LISTEN/NOTIFY, run in-process by ``call_command``). Each stage runs twice: once plain
(its RSS, ``VmRSS``) and once with ``PYTHONTRACEMALLOC=1`` (every Python allocation since
start-up traced; tracemalloc's own overhead inflates that run's RSS, so its RSS is not
reported). Reported: RSS, Python heap (traced bytes), threads, the resident part of the
thread stacks (anonymous 8 MiB mappings in ``/proc/self/smaps``), open sockets (database
connections), and the traced difference worker − base grouped by package and by line.
Both stages start one probe thread (the one that measures), so thread counts compare.

PostgreSQL as ``benchmarks/settings.py`` finds it; database ``TASKCLAIM_BENCH_DB_NAME``
(default ``taskclaim_bench``). A table on stdout, JSON under ``var/``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import tracemalloc
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
VAR = ROOT / "var"

_CHILD = r"""
import json, os, signal, sys, threading, time, tracemalloc
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.settings")
import django
django.setup()
STAGE, IDLE, OUT = sys.argv[1], float(sys.argv[2]), sys.argv[3]

def smaps_stacks():
    kb, entry_size, anon = 0, 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            parts = line.split()
            if "-" in parts[0] and len(parts) >= 5 and not line.startswith(("Size", "Rss")):
                anon = len(parts) == 5
            elif parts[0] == "Size:":
                entry_size = int(parts[1])
            elif parts[0] == "Rss:" and anon and 8180 <= entry_size <= 8200:
                kb += int(parts[1])
    return kb / 1024

def status(key):
    with open("/proc/self/status") as f:
        return next(int(x.split()[1]) for x in f if x.startswith(key))

def sockets():
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            n += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
        except OSError:
            pass
    return n

def probe():
    time.sleep(IDLE)  # the idle period being measured
    data = {
        "rss_mb": status("VmRSS") / 1024,
        "threads": status("Threads"),
        "thread_names": [t.name for t in threading.enumerate()],
        "stacks_rss_mb": smaps_stacks(),
        "sockets": sockets(),
    }
    if tracemalloc.is_tracing():
        snap = tracemalloc.take_snapshot()
        snap.dump(OUT + ".snap")
        data["traced_mb"] = tracemalloc.get_traced_memory()[0] / 2**20
    with open(OUT, "w") as f:
        json.dump(data, f)
    if STAGE == "worker":
        os.kill(os.getpid(), signal.SIGTERM)

t = threading.Thread(target=probe, name="probe")
t.start()
if STAGE == "base":
    from django.db import connection
    connection.ensure_connection()
    t.join()
else:
    from django.core.management import call_command
    call_command("taskclaim_worker", "benchapp.BenchTask", "--concurrency", "1",
                 "--batch", "1", "--no-reap", "--poll", "5")
    t.join()
"""


def run_stage(stage: str, idle: float, traced: bool, tmp: Path) -> dict[str, Any]:
    out = tmp / f"{stage}-{int(traced)}.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DJANGO_SETTINGS_MODULE": "benchmarks.settings"}
    env.pop("PYTHONTRACEMALLOC", None)
    if traced:
        env["PYTHONTRACEMALLOC"] = "1"
    subprocess.run(
        [sys.executable, "-c", _CHILD, stage, str(idle), str(out)],
        cwd=ROOT,
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        timeout=120,
    )
    data: dict[str, Any] = json.loads(out.read_text())
    if traced:
        data["snapshot"] = str(out) + ".snap"
    return data


def package_of(filename: str) -> str:
    path = filename.replace(os.sep, "/")
    if "/site-packages/" in path:
        return path.split("/site-packages/", 1)[1].split("/", 1)[0].removesuffix(".py")
    if "/django_taskclaim/" in path:
        rest = path.split("/django_taskclaim/", 1)[1]
        return "django_taskclaim/" + rest.split("/", 1)[0].removesuffix(".py")
    if "/benchmarks/" in path:
        return "benchmarks"
    if path.startswith("<"):
        return path
    return "stdlib"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--idle", type=float, default=5.0, help="idle seconds before measuring")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        plain = {s: run_stage(s, args.idle, False, tmp) for s in ("base", "worker")}
        traced = {s: run_stage(s, args.idle, True, tmp) for s in ("base", "worker")}
        base = tracemalloc.Snapshot.load(traced["base"]["snapshot"])
        worker = tracemalloc.Snapshot.load(traced["worker"]["snapshot"])
        by_file = worker.compare_to(base, "filename")
        by_line = worker.compare_to(base, "lineno")
    packages: dict[str, int] = {}
    for stat in by_file:
        name = package_of(stat.traceback[0].filename)
        packages[name] = packages.get(name, 0) + stat.size_diff
    top_packages = sorted(packages.items(), key=lambda kv: -kv[1])[:12]
    top_lines = [
        {
            "where": f"{stat.traceback[0].filename.split('site-packages/')[-1]}:"
            f"{stat.traceback[0].lineno}",
            "kb": round(stat.size_diff / 1024, 1),
        }
        for stat in by_line[:12]
    ]
    rows = []
    for key, label in (
        ("rss_mb", "RSS MB (untraced run)"),
        ("traced_mb", "Python heap MB (tracemalloc)"),
        ("stacks_rss_mb", "thread stacks resident MB"),
        ("threads", "threads"),
        ("sockets", "sockets (database connections)"),
    ):
        src = traced if key == "traced_mb" else plain
        b, w = src["base"][key], src["worker"][key]
        rows.append((label, b, w, w - b))
    print("| measure | base: django.setup() + 1 connection | idle worker | difference |")
    print("|---|---:|---:|---:|")
    for label, b, w, d in rows:
        print(f"| {label} | {b:.2f} | {w:.2f} | {d:+.2f} |")
    print("\nPython heap difference by package (KB):")
    for name, size in top_packages:
        print(f"  {name:<40} {size / 1024:+9.1f}")
    print("\nlargest lines:")
    for line in top_lines:
        print(f"  {line['where']:<70} {line['kb']:+9.1f}")
    print(f"\nworker threads: {plain['worker']['thread_names']}")
    VAR.mkdir(exist_ok=True)
    path = VAR / f"bench-idle-memory-{datetime.now(UTC):%Y%m%dT%H%M%S}.json"
    for d in traced.values():
        d.pop("snapshot", None)
    path.write_text(
        json.dumps(
            {
                "benchmark": "idle_memory",
                "when": datetime.now(UTC).isoformat(timespec="seconds"),
                "plain": plain,
                "traced": traced,
                "packages_kb": {k: round(v / 1024, 1) for k, v in top_packages},
                "top_lines": top_lines,
            },
            indent=2,
        )
    )
    print(f"JSON: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
