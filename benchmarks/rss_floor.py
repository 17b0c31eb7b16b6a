#!/usr/bin/env python
"""Where an idle worker's memory goes: resident size after each layer it stands on.

    python benchmarks/rss_floor.py

Each stage runs in a fresh interpreter (so nothing is shared between them) and prints its
resident set size (``VmRSS``): bare Python; ``django.setup()`` with no installed app and
the PostgreSQL backend configured; the same with one connection open; plus
``django_taskclaim``'s worker modules imported; and, last, a real idle
``taskclaim_worker`` (1 thread, batch 1, LISTEN/NOTIFY) on a benchmark model, 5 seconds
after it started. The difference between the last two lines is what the worker itself
holds; everything above is the floor any Django worker on psycopg pays.

PostgreSQL at 127.0.0.1:5432 (``TASKCLAIM_BENCH_PG_URL`` overrides), in a dedicated
``taskclaim_bench_rss`` database. A table on stdout, JSON under ``var/``.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import textwrap
import time
from datetime import UTC, datetime
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
VAR = ROOT / "var"

from benchmarks.procstat import vm_rss_mib  # noqa: E402

DB_NAME = "taskclaim_bench_rss"
ADMIN_URL = os.environ.get(
    "TASKCLAIM_BENCH_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)

_RSS = """
def rss():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) / 1024
"""

_BARE_SETTINGS = f"""
import django
from django.conf import settings
settings.configure(
    INSTALLED_APPS=[],
    DATABASES={{"default": {{"ENGINE": "django.db.backends.postgresql", "NAME": "{DB_NAME}",
        "HOST": "127.0.0.1", "USER": "postgres"}}}},
)
django.setup()
"""

STAGES = [
    ("Python", ""),
    ("django.setup(), no app, PostgreSQL backend", _BARE_SETTINGS),
    (
        "+ one connection open",
        _BARE_SETTINGS + "from django.db import connection\nconnection.ensure_connection()\n",
    ),
    (
        "+ django_taskclaim worker modules imported",
        _BARE_SETTINGS
        + "from django.db import connection\nconnection.ensure_connection()\n"
        + "import django_taskclaim.worker, django_taskclaim.management.commands.worker\n",
    ),
]


def log(msg: str) -> None:
    print(msg, flush=True)


def _stage(code: str) -> float:
    script = textwrap.dedent(_RSS) + code + "\nprint(rss())\n"
    out = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        check=True,
    )
    return float(out.stdout.strip().splitlines()[-1])


def _idle_worker() -> float:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "DJANGO_SETTINGS_MODULE": "benchmarks.settings",
        "TASKCLAIM_BENCH_DB_NAME": DB_NAME,
    }
    py = [sys.executable, "-m", "django"]
    subprocess.run([*py, "migrate", "--run-syncdb", "-v0"], cwd=ROOT, env=env, check=True)
    argv = [*py, "taskclaim_worker", "benchapp.BenchTask", "--concurrency", "1"]
    argv += ["--batch", "1", "--no-reap", "--poll", "5"]
    proc = subprocess.Popen(
        argv,
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        time.sleep(5)  # the idle period being measured, not a synchronisation
        if proc.poll() is not None:
            raise SystemExit("the worker exited; run it by hand to see why")
        return vm_rss_mib(proc.pid)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def main() -> None:
    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{DB_NAME}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{DB_NAME}"')
    rows = [(name, _stage(code)) for name, code in STAGES]
    rows.append(("idle taskclaim_worker (1 thread, LISTEN/NOTIFY)", _idle_worker()))
    log("| stage | RSS MB |")
    log("|---|---:|")
    for name, mb in rows:
        log(f"| {name} | {mb:.1f} |")
    VAR.mkdir(exist_ok=True)
    path = VAR / f"bench-rss-{datetime.now(UTC):%Y%m%dT%H%M%S}.json"
    path.write_text(
        json.dumps(
            {
                "benchmark": "rss_floor",
                "when": datetime.now(UTC).isoformat(timespec="seconds"),
                "python": platform.python_version(),
                "stages": [{"stage": n, "rss_mb": round(m, 1)} for n, m in rows],
            },
            indent=2,
        )
    )
    log(f"JSON: {path}")


if __name__ == "__main__":
    main()
