"""The ``django.tasks`` backend's throughput, beside the core worker on a plain model.

    python benchmarks/tasks_backend.py [--tasks 10000] [--repeat 3] [--json PATH]

Enqueues no-op ``@task`` functions through the public API (``noop.enqueue(i)``, one
INSERT each, inside one transaction), drains them with the real ``manage.py
taskclaim_worker --burst`` and reports tasks/s over the span of their ``finished_at``
stamps (database clock). The same run drains a plain ``ClaimableModel`` (``BenchTask``)
with the core worker as the reference, and — when installed (``pip install --group
bench``) — the same tasks through django-tasks-db's backend and two of its ``db_worker
--batch`` processes. PostgreSQL only (the server at 127.0.0.1:5432, or
an embedded one). Prints a table and writes JSON (default ``var/bench-tasks-backend.json``).
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
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.settings_tasks")

#: (label, processes, threads, batch)
CONFIGS = [
    ("2 processes x 4 threads, batch 10", 2, 4, 10),
    ("2 processes x 4 threads, batch 100", 2, 4, 100),
    ("2 processes x 1 thread, batch 1", 2, 1, 1),
]


def setup() -> None:
    import django
    import psycopg
    from django.conf import settings

    conf = settings.DATABASES["default"]
    admin = psycopg.connect(
        host=conf["HOST"], port=conf.get("PORT") or 5432, user=conf["USER"], dbname="postgres",
        autocommit=True,
    )  # fmt: skip
    with admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{conf["NAME"]}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{conf["NAME"]}"')
    django.setup()
    from django.core.management import call_command

    call_command("migrate", run_syncdb=True, verbosity=0)


def drain(model_label: str, processes: int, threads: int, batch: int) -> None:
    argv = [
        sys.executable, "-m", "django", "taskclaim_worker", model_label, "--burst",
        "--processes", str(processes), "--concurrency", str(threads), "--batch", str(batch),
        "--no-reap",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=1200)
    if done.returncode != 0:
        raise RuntimeError(f"worker exited {done.returncode}:\n{done.stderr[-2000:]}")


def rate(model: Any, done: str = "done") -> float:
    from django.db.models import Max, Min

    rows = model.objects.filter(status=done)
    agg = rows.aggregate(first=Min("finished_at"), last=Max("finished_at"))
    n = rows.count()
    span = (agg["last"] - agg["first"]).total_seconds()
    return (n - 1) / span if span > 0 else float("inf")


def run_backend(n: int, processes: int, threads: int, batch: int) -> float:
    from django.db import transaction

    from benchmarks.benchapp.tasks import noop
    from django_taskclaim.contrib.tasks.models import QueuedTask

    QueuedTask.objects.all().delete()
    with transaction.atomic():
        for i in range(n):
            noop.enqueue(i)
    drain("taskclaim_tasks.QueuedTask", processes, threads, batch)
    left = QueuedTask.objects.exclude(status="done").count()
    if left:
        raise RuntimeError(f"{left} tasks not done")
    return rate(QueuedTask)


def run_plain(n: int, processes: int, threads: int, batch: int) -> float:
    from benchmarks.benchapp.models import BenchTask

    BenchTask.objects.all().delete()
    BenchTask.objects.bulk_create([BenchTask() for _ in range(n)], batch_size=5000)
    drain("benchapp.BenchTask", processes, threads, batch)
    return rate(BenchTask)


def run_peer(n: int, processes: int) -> float:
    """django-tasks-db, in this process (settings ``benchmarks.settings_tasks_db``): the
    same enqueue, drained by ``processes`` of its ``db_worker --batch`` side by side."""
    from django.core.management import call_command
    from django.db import transaction
    from django_tasks_db.models import DBTaskResult

    from benchmarks.benchapp.tasks import noop

    call_command("migrate", verbosity=0)
    DBTaskResult.objects.all().delete()
    with transaction.atomic():
        for i in range(n):
            noop.enqueue(i)
    argv = [sys.executable, "-m", "django", "db_worker", "--batch", "--no-startup-delay"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    workers = [
        subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        for _ in range(processes)
    ]
    for w in workers:
        if w.wait(timeout=1200) != 0:
            raise RuntimeError(f"db_worker exited {w.returncode}")
    left = DBTaskResult.objects.exclude(status="SUCCESSFUL").count()
    if left:
        raise RuntimeError(f"{left} django-tasks-db tasks not done")
    return rate(DBTaskResult, "SUCCESSFUL")


def peer_rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The django-tasks-db rows, measured in a child process (other settings)."""
    try:
        import django_tasks_db  # noqa: F401
    except ImportError:
        print("django-tasks-db: skipped (not installed; pip install --group bench)")
        return []
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "benchmarks.settings_tasks_db"}
    argv = [sys.executable, __file__, "--peer", "--tasks", str(args.tasks)]
    argv += ["--repeat", str(args.repeat)]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        print(f"django-tasks-db: failed ({done.stderr.strip().splitlines()[-1:]})")
        return []
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", type=int, default=10_000)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--json", default=str(ROOT / "var" / "bench-tasks-backend.json"))
    p.add_argument("--peer", action="store_true", help=argparse.SUPPRESS)  # child run
    args = p.parse_args()
    if args.peer:
        import django

        django.setup()
        runs = [run_peer(args.tasks, 2) for _ in range(args.repeat)]
        row = {"system": "django-tasks-db 0.13 db_worker", "config": "2 processes", "runs": runs}
        print(json.dumps([row]))
        return
    setup()
    rows: list[dict[str, Any]] = []
    for label, procs, threads, batch in CONFIGS:
        runs = [run_backend(args.tasks, procs, threads, batch) for _ in range(args.repeat)]
        rows.append({"system": "taskclaim TaskClaimBackend", "config": label, "runs": runs})
    plain = [run_plain(args.tasks, 2, 4, 100) for _ in range(args.repeat)]
    rows.append(
        {"system": "taskclaim, plain ClaimableModel", "config": CONFIGS[1][0], "runs": plain}
    )
    peers = peer_rows(args)
    rows.extend(peers)
    print(f"\n{'system':36} {'config':38} {'tasks/s (median)':>16}  runs")
    for row in rows:
        row["median"] = statistics.median(row["runs"])
        runs = ", ".join(f"{r:,.0f}" for r in row["runs"])
        print(f"{row['system']:36} {row['config']:38} {row['median']:16,.0f}  {runs}")
    backend = [r for r in rows if r["system"].startswith("taskclaim TaskClaimBackend")]
    plain = next(r for r in rows if "plain" in r["system"])
    best = max(r["median"] for r in backend)
    ratio = best / plain["median"]
    print(f"\nbackend best / plain model: {ratio:.0%}")
    peer_ratio = None
    if peers:
        peer_ratio = best / max(r["median"] for r in peers)
        print(f"backend best / django-tasks-db best: {peer_ratio:.1f}x")
    out = {
        "command": " ".join(["python", *sys.argv]),
        "tasks": args.tasks,
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "rows": rows,
        "backend_best_over_plain": ratio,
        "backend_best_over_django_tasks_db": peer_ratio,
    }
    Path(args.json).parent.mkdir(exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=2))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
