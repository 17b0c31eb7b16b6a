"""The ``django.tasks`` backend's throughput, beside the core worker on a plain model.

    python benchmarks/tasks_backend.py [--tasks 10000] [--repeat 3] [--json PATH]
                                       [--quick] [--no-peer]

Enqueues no-op ``@task`` functions through the public API (``noop.enqueue(i)``, one
INSERT each, inside one transaction), drains them with the real ``manage.py
taskclaim_worker --burst`` and reports tasks/s over the span of their ``finished_at``
stamps (database clock). The same run drains a plain ``ClaimableModel`` (``BenchTask``)
with the core worker as the reference, and — when installed (``pip install --group
bench``) — the same tasks through django-tasks-db's backend and two of its ``db_worker
--batch`` processes. PostgreSQL only (the server at 127.0.0.1:5432, or
an embedded one). Prints a table and writes JSON (default ``var/bench-tasks-backend.json``).

Each repeat runs every backend configuration and then the plain model, so the ratio
backend / plain is also taken per repeat, between runs minutes apart at most (the
machine's load drifts); its median is reported beside the ratio of the medians. Each
run also reports the worker's CPU time per task (user + system of all its processes,
minus that of an idle run of the same configuration): less sensitive to the machine's
load than tasks/s, it compares the per-task cost of the two workers (PostgreSQL's CPU
is not in it). One
backend row sets the ``django.tasks`` logger to WARNING, where Django's own receivers of
``task_started`` / ``task_finished`` log one INFO line each per task: beside the row
with the settings' logging (Django's default ``LOGGING``, ``DEBUG = False``: no handler
prints those lines) it shows what logging still costs. ``--quick``: the batch-100 rows
only; ``--no-peer``: no django-tasks-db.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.settings_tasks")

#: (label, processes, threads, batch, environment of the worker)
CONFIGS: list[tuple[str, int, int, int, dict[str, str]]] = [
    ("2 processes x 4 threads, batch 10", 2, 4, 10, {}),
    ("2 processes x 4 threads, batch 100", 2, 4, 100, {}),
    ("2 processes x 1 thread, batch 1", 2, 1, 1, {}),
    (
        "2 processes x 4 threads, batch 100, django.tasks log WARNING",
        2, 4, 100, {"TASKCLAIM_BENCH_TASKS_LOG_LEVEL": "WARNING"},
    ),
]  # fmt: skip
#: The configuration compared with the plain model (the issue's reference row).
REFERENCE = CONFIGS[1][0]
#: The plain model's configuration.
PLAIN = ("2 processes x 4 threads, batch 100", 2, 4, 100)


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


def drain(
    model_label: str, processes: int, threads: int, batch: int, extra_env: dict[str, str]
) -> float:
    """Run ``manage.py taskclaim_worker --burst`` on ``model_label``; return the CPU
    seconds (user + system) its processes used."""
    argv = [
        sys.executable, "-m", "django", "taskclaim_worker", model_label, "--burst",
        "--processes", str(processes), "--concurrency", str(threads), "--batch", str(batch),
        "--no-reap",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT), **extra_env}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=1200)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"worker exited {done.returncode}:\n{done.stderr[-2000:]}")
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


#: CPU seconds of a worker run that finds nothing to do (start-up, shutdown), per
#: (model, processes, threads, batch, environment): subtracted from each run's CPU.
_IDLE_CPU: dict[tuple[Any, ...], float] = {}


def worker_cpu_per_task(model_label: str, n: int, cpu: float, *config: Any) -> float:
    """Microseconds of worker CPU (user + system, all its processes) per task, start-up
    excluded: the CPU of a run minus that of an idle run of the same configuration."""
    key = (model_label, *(json.dumps(c, sort_keys=True) for c in config))
    if key not in _IDLE_CPU:
        _IDLE_CPU[key] = min(drain(model_label, *config) for _ in range(2))
    return max(0.0, cpu - _IDLE_CPU[key]) / n * 1e6


def rate(model: Any, done: str = "done") -> float:
    from django.db.models import Max, Min

    rows = model.objects.filter(status=done)
    agg = rows.aggregate(first=Min("finished_at"), last=Max("finished_at"))
    n = rows.count()
    span = (agg["last"] - agg["first"]).total_seconds()
    return (n - 1) / span if span > 0 else float("inf")


def run_backend(
    n: int, processes: int, threads: int, batch: int, extra_env: dict[str, str]
) -> tuple[float, float]:
    """(tasks/s, worker CPU µs per task) of draining ``n`` enqueued no-op Tasks."""
    from django.db import transaction

    from benchmarks.benchapp.tasks import noop
    from django_taskclaim.contrib.tasks.models import QueuedTask

    label, config = "taskclaim_tasks.QueuedTask", (processes, threads, batch, extra_env)
    QueuedTask.objects.all().delete()
    worker_cpu_per_task(label, n, 0.0, *config)  # the idle run, on an empty table
    with transaction.atomic():
        for i in range(n):
            noop.enqueue(i)
    cpu = drain(label, *config)
    left = QueuedTask.objects.exclude(status="done").count()
    if left:
        raise RuntimeError(f"{left} tasks not done")
    return rate(QueuedTask), worker_cpu_per_task(label, n, cpu, *config)


def run_plain(n: int, processes: int, threads: int, batch: int) -> tuple[float, float]:
    """(rows/s, worker CPU µs per row) of draining ``n`` plain ``BenchTask`` rows."""
    from benchmarks.benchapp.models import BenchTask

    label, config = "benchapp.BenchTask", (processes, threads, batch, {})
    BenchTask.objects.all().delete()
    worker_cpu_per_task(label, n, 0.0, *config)
    BenchTask.objects.bulk_create([BenchTask() for _ in range(n)], batch_size=5000)
    cpu = drain(label, *config)
    return rate(BenchTask), worker_cpu_per_task(label, n, cpu, *config)


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
    p.add_argument("--quick", action="store_true", help="the batch-100 backend rows only")
    p.add_argument("--no-peer", action="store_true", help="skip django-tasks-db")
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
    configs = [c for c in CONFIGS if not args.quick or c[3] == 100]
    backend: dict[str, list[tuple[float, float]]] = {c[0]: [] for c in configs}
    plain_runs: list[tuple[float, float]] = []
    paired: list[float] = []  # backend (REFERENCE) / plain, within each repeat
    for _ in range(args.repeat):
        for label, procs, threads, batch, extra_env in configs:
            backend[label].append(run_backend(args.tasks, procs, threads, batch, extra_env))
        plain_runs.append(run_plain(args.tasks, *PLAIN[1:]))
        paired.append(backend[REFERENCE][-1][0] / plain_runs[-1][0])
    rows: list[dict[str, Any]] = [
        {
            "system": "taskclaim TaskClaimBackend",
            "config": label,
            "runs": [r for r, _cpu in runs],
            "cpu_us_per_task": [cpu for _r, cpu in runs],
        }
        for label, runs in backend.items()
    ]
    plain_row = {"system": "taskclaim, plain ClaimableModel", "config": PLAIN[0]}
    plain_row["runs"] = [r for r, _cpu in plain_runs]
    plain_row["cpu_us_per_task"] = [cpu for _r, cpu in plain_runs]
    rows.append(plain_row)
    peers = [] if args.no_peer else peer_rows(args)
    rows.extend(peers)
    print(f"\n{'system':32} {'config':62} {'tasks/s (median)':>16}  runs  [worker CPU µs/task]")
    for row in rows:
        row["median"] = statistics.median(row["runs"])
        runs = ", ".join(f"{r:,.0f}" for r in row["runs"])
        cpu = ""
        if "cpu_us_per_task" in row:
            row["cpu_us_per_task_median"] = statistics.median(row["cpu_us_per_task"])
            cpu = f"  [{row['cpu_us_per_task_median']:,.0f}]"
        print(f"{row['system']:32} {row['config']:62} {row['median']:16,.0f}  {runs}{cpu}")
    by_config = {r["config"]: r for r in rows if r["system"].startswith("taskclaim TaskClaim")}
    plain = plain_row
    ratio = by_config[REFERENCE]["median"] / plain["median"]
    paired_ratio = statistics.median(paired)
    cpu_ratio = plain["cpu_us_per_task_median"] / by_config[REFERENCE]["cpu_us_per_task_median"]
    print(
        f"\nbackend ({REFERENCE}) / plain model: {ratio:.0%} (medians); "
        f"{paired_ratio:.0%} (median of per-repeat ratios: "
        f"{', '.join(f'{r:.0%}' for r in paired)}); "
        f"worker CPU per task, plain / backend: {cpu_ratio:.0%}"
    )
    best = max(r["median"] for r in by_config.values())
    peer_ratio = None
    if peers:
        peer_ratio = by_config[REFERENCE]["median"] / max(r["median"] for r in peers)
        print(f"backend ({REFERENCE}) / django-tasks-db best: {peer_ratio:.1f}x")
    out = {
        "command": " ".join(["python", *sys.argv]),
        "tasks": args.tasks,
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "rows": rows,
        "reference_config": REFERENCE,
        "backend_over_plain": ratio,
        "backend_over_plain_paired": paired,
        "backend_over_plain_paired_median": paired_ratio,
        "plain_over_backend_worker_cpu_per_task": cpu_ratio,
        "backend_best_over_plain": best / plain["median"],
        "backend_over_django_tasks_db": peer_ratio,
    }
    Path(args.json).parent.mkdir(exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=2))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
