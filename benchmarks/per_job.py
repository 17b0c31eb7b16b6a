#!/usr/bin/env python
"""The worker's own cost per no-op job: CPU, instructions, and where the time goes.

    python benchmarks/per_job.py                     # CPU per job, batch 1 and 100, 1x1 and 2x4
    python benchmarks/per_job.py --before ../old     # interleaved with another checkout
    python benchmarks/per_job.py --instructions      # valgrind (callgrind): instructions/job
    python benchmarks/per_job.py --profile           # py-spy: where the CPU goes
    python benchmarks/per_job.py --breakdown         # each stage of a job alone, per job
    python benchmarks/per_job.py --in-process        # drained in one process, per thread

Each measure drains a pre-filled backlog of no-op jobs (``benchmarks.benchapp.BenchTask``)
with the real ``manage.py taskclaim_worker --burst`` on PostgreSQL, twice: a small and a
large backlog. The cost per job is the difference of the two runs over the difference of
their backlogs, so the process's start-up and exit (the same in both) cancel out.

* CPU: ``getrusage(RUSAGE_CHILDREN)`` of the worker's whole process tree, user + system.
  It moves with the machine's load (a busy server makes the worker wait and spin less or
  more), so compare the figures of one run, interleaved (``--before``).
* Instructions: ``valgrind --tool=callgrind`` counts the instructions the worker process
  executes (every thread; ``PYTHONHASHSEED=0``). Under valgrind the worker runs ~50x
  slower, so a timer would fire more often per job the busier the machine: the run sets
  ``--ack-window 30`` (completions written by count, every 100, as at full speed) and
  the count then hardly depends on the machine's load: the stable figure beside jobs/s.
* Profile: ``py-spy`` samples every thread of the worker while it runs on a CPU (idle
  threads are not sampled); each sample counts for what its innermost known frame does
  (claim, row decoding, hand-off, body, outcome, acknowledgement, locks and wake-ups...).

Prints Markdown tables; writes JSON to results/per-job-<time>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.settings")

from benchmarks.procstat import TICKS, cpu_ticks, stat_fields  # noqa: E402
from benchmarks.run import (  # noqa: E402  (sets Django up)
    LABEL,
    PY,
    RESULTS,
    drained_rate,
    fill,
    log,
    med,
    reachable_aliases,
    table,
    table_sql,
    vendor,
)

CONFIGS = {"1x1": (1, 1), "2x4": (2, 4)}  # processes x threads


def worker_argv(tree: Path, *, processes: int, threads: int, batch: int, alias: str) -> list[str]:
    argv = [PY, "-m", "django", "taskclaim_worker", LABEL, "--database", alias]
    argv += ["--concurrency", str(threads), "--batch", str(batch), "--no-reap", "--burst"]
    if processes > 1:
        argv += ["--processes", str(processes)]
    return argv


def env_for(tree: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["DJANGO_SETTINGS_MODULE"] = "benchmarks.settings"
    env["PYTHONPATH"] = str(tree)
    env["PYTHONHASHSEED"] = "0"
    env["TASKCLAIM_BENCH_STRATEGY"] = "skip_locked"
    return env


def drain(tree: Path, alias: str, jobs: int, argv: list[str], *, timeout: float) -> dict[str, Any]:
    """Fill ``jobs`` rows, run ``argv`` (in ``tree``) to its end; its CPU and jobs/s."""
    fill(alias, jobs)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    with tempfile.TemporaryFile() as out:
        proc = subprocess.run(
            argv, cwd=tree, env=env_for(tree), stdout=out, stderr=subprocess.STDOUT,
            timeout=timeout, check=False,
        )  # fmt: skip
        if proc.returncode != 0:
            out.seek(0)
            text = out.read().decode(errors="replace")[-3000:]
            raise RuntimeError(f"exited {proc.returncode}: {' '.join(argv)}\n{text}")
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    done, rate = drained_rate(alias)
    if done != jobs:
        raise RuntimeError(f"the worker left {jobs - done} of {jobs} jobs undone")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"cpu_s": cpu, "wall_s": wall, "jobs_s": rate}


# -- CPU per job ---------------------------------------------------------------------------


def bench_cpu(args: argparse.Namespace, alias: str) -> list[dict[str, Any]]:
    trees = [("after", ROOT)] + ([("before", args.before)] if args.before else [])
    small, large = args.tasks // 5, args.tasks
    rows: list[dict[str, Any]] = []
    for batch in args.batches:
        for name in args.configs:
            processes, threads = CONFIGS[name]
            samples: dict[str, list[tuple[float, float]]] = {t: [] for t, _ in trees}
            for _ in range(args.repeat):  # interleaved: drift hits both trees alike
                for tname, tree in reversed(trees):
                    argv = worker_argv(
                        tree, processes=processes, threads=threads, batch=batch, alias=alias
                    )
                    a = drain(tree, alias, small, argv, timeout=args.timeout)
                    b = drain(tree, alias, large, argv, timeout=args.timeout)
                    per_job = (b["cpu_s"] - a["cpu_s"]) / (large - small) * 1000
                    samples[tname].append((per_job, b["jobs_s"]))
            for tname, _ in trees:
                ms = [s[0] for s in samples[tname]]
                rate = [s[1] for s in samples[tname]]
                row = {
                    "tree": tname,
                    "config": name,
                    "batch": batch,
                    "cpu_ms_per_job": med(ms),
                    "cpu_runs": [round(x, 4) for x in ms],
                    "jobs_s": med(rate),
                    "jobs_s_runs": [round(x) for x in rate],
                }
                rows.append(row)
                log(
                    f"  {tname} {name} batch={batch}: worker {row['cpu_ms_per_job']:.4f} ms/job "
                    f"(runs {row['cpu_runs']}), {row['jobs_s']:,.0f} jobs/s"
                )
    return rows


# -- instructions per job ------------------------------------------------------------------


def instructions(tree: Path, alias: str, jobs: int, batch: int, timeout: float) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "callgrind.out"
        argv = [
            "valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
            "--dump-instr=no", "--compress-strings=no",
        ]  # fmt: skip
        argv += worker_argv(tree, processes=1, threads=1, batch=batch, alias=alias)
        # Completions written by count (every 100), never by the clock: under valgrind
        # the ack window would end after fewer tasks the busier the machine is.
        argv += ["--ack-window", "30"]
        drain(tree, alias, jobs, argv, timeout=timeout)
        text = out.read_text(errors="replace")
    m = re.search(r"^(?:summary|totals): (\d+)", text, re.M)
    if m is None:
        raise RuntimeError("no instruction total in callgrind's output")
    return int(m.group(1))


def bench_instructions(args: argparse.Namespace, alias: str) -> list[dict[str, Any]]:
    if shutil.which("valgrind") is None:
        log("  skipped: valgrind is not installed (apt-get install valgrind)")
        return []
    trees = [("after", ROOT)] + ([("before", args.before)] if args.before else [])
    small, large = args.instr_tasks // 4, args.instr_tasks
    rows = []
    for batch in args.batches:
        for tname, tree in reversed(trees):
            a = instructions(tree, alias, small, batch, args.timeout * 20)
            b = instructions(tree, alias, large, batch, args.timeout * 20)
            per_job = (b - a) / (large - small)
            rows.append({"tree": tname, "batch": batch, "instructions_per_job": per_job})
            log(f"  {tname} batch={batch}: {per_job:,.0f} instructions/job")
    return rows


# -- profile -------------------------------------------------------------------------------

#: (category, predicate on "file:function") in order: the first that matches wins.
CATEGORIES: list[tuple[str, tuple[str, ...]]] = [
    ("body (the no-op process())", ("benchapp/models.py",)),
    ("locks, conditions, wake-ups", ("threading.py", "<method 'acquire'", "<method 'release'",
                                     "<method 'wait'", "queue.py")),
    ("claim: SQL sent, rows read (driver)", ("psycopg/", "psycopg_c", "psycopg_binary",
                                             "<method 'execute'", "<method 'fetch")),
    ("rows to model instances", ("models/base.py", "claim/rows.py", "claim/decode")),
    ("Django ORM (compile, connection, transaction)", ("django/db/",)),
    ("claim (ours)", ("django_taskclaim/claim/",)),
    ("hand-off (ledger)", ("worker/ledger.py",)),
    ("run and settle (executor, outcome)", ("worker/executors.py", "settle/outcome.py",
                                            "settle/transitions.py", "worker/bodies.py",
                                            "worker/deadlines.py", "settle/writes.py")),
    ("acknowledgement (batched)", ("worker/acks.py", "settle/batch.py")),
    ("history, metrics, logging", ("worker/history.py", "telemetry.py", "logging/",
                                   "monitoring.py")),
    ("heartbeat, claimer loop, other worker", ("django_taskclaim/",)),
]  # fmt: skip


def _category_of_stack(frames: list[str]) -> str:
    """The category of a sample: that of the innermost frame any category claims."""
    for frame in reversed(frames):
        name = category_of(frame)
        if name is not None:
            return name
    return "other (Python, Django)"


def category_of(frame: str) -> str | None:
    for name, needles in CATEGORIES:
        if any(n in frame for n in needles):
            return name
    return None


def bench_profile(args: argparse.Namespace, alias: str) -> dict[str, Any]:
    """Sample the worker's threads while they run on a CPU (py-spy; idle threads are not
    sampled): each sample goes to the category of its innermost frame we know."""
    spy = shutil.which("py-spy") or str(Path(PY).with_name("py-spy"))
    if not Path(spy).exists():
        log("  skipped: py-spy is not installed (pip install --group bench)")
        return {}
    batch = args.batches[-1]
    jobs = args.tasks
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "worker.txt"
        argv = [spy, "record", "--gil", "--nonblocking", "--format", "raw", "-o", str(raw)]
        argv += ["-r", "1000", "--"]
        argv += worker_argv(ROOT, processes=1, threads=1, batch=batch, alias=alias)
        drain(ROOT, alias, jobs, argv, timeout=args.timeout * 5)
        lines = raw.read_text().splitlines()
    by_cat: dict[str, int] = {}
    by_leaf: dict[str, int] = {}
    total = 0
    for line in lines:
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        if any("django/core/management" in f and "execute" in f for f in frames) and not any(
            "django_taskclaim/worker" in f for f in frames
        ):
            continue  # start-up: settings, checks, imports
        n = int(count)
        total += n
        cat = _category_of_stack(frames)
        by_cat[cat] = by_cat.get(cat, 0) + n
        leaf = re.sub(r" \(.*/(site-packages|lib/python3\.\d+|django_taskclaim)/", " (", frames[-1])
        by_leaf[leaf] = by_leaf.get(leaf, 0) + n
    if not total:
        return {}
    return {
        "batch": batch,
        "jobs": jobs,
        "samples": total,
        "categories": [
            {"what": k, "share": v / total}
            for k, v in sorted(by_cat.items(), key=lambda kv: -kv[1])
        ],
        "top": [
            {"function": k, "share": v / total}
            for k, v in sorted(by_leaf.items(), key=lambda kv: -kv[1])[:25]
        ],
    }


# -- in process ------------------------------------------------------------------------------


def in_process_child(jobs: int, batch: int, alias: str) -> dict[str, Any]:
    """Drain ``jobs`` rows with a worker run in this process (``Worker.run()``, the code
    ``manage.py taskclaim_worker --burst`` runs, without the process's start-up and
    exit), sampling each thread's CPU (``/proc/self/task``) every 50 ms: CPU per job of
    each thread and of the whole process."""
    import threading

    from django_taskclaim.worker.config import WorkerConfig
    from django_taskclaim.worker.process import Worker

    last: dict[str, float] = {}
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            for t in threading.enumerate():
                fields = stat_fields("self", task=t.native_id)
                if fields is None:
                    continue
                last[t.name] = cpu_ticks(fields) / TICKS
            stop.wait(0.05)

    fill(alias, jobs)
    config = WorkerConfig.build([LABEL], burst=True, reap=False, batch=batch, concurrency=1)
    worker = Worker(config)
    monitor = threading.Thread(target=sample, name="sampler", daemon=True)
    monitor.start()
    t0, main0 = time.process_time(), time.thread_time()
    code = worker.run()
    total = time.process_time() - t0
    last["MainThread"] = time.thread_time() - main0
    stop.set()
    monitor.join()
    if code != 0:
        raise RuntimeError(f"the in-process worker exited {code}")
    threads = {k: v / jobs * 1e6 for k, v in last.items() if k != "sampler"}
    return {"total_us": (total - last.get("sampler", 0.0)) / jobs * 1e6, "threads": threads}


def bench_in_process(args: argparse.Namespace, alias: str) -> list[dict[str, Any]]:
    """:func:`in_process_child` in a fresh interpreter per run, for this tree and the
    ``--before`` one (its own copy of this script), interleaved."""
    trees = [("after", ROOT)] + ([("before", args.before)] if args.before else [])
    batch = args.batches[-1]
    samples: dict[str, list[dict[str, Any]]] = {t: [] for t, _ in trees}
    for _ in range(args.repeat):
        for tname, tree in reversed(trees):
            argv = [PY, str(tree / "benchmarks" / "per_job.py"), "--in-process-child"]
            argv += ["--tasks", str(args.tasks), "--batches", str(batch)]
            out = subprocess.run(
                argv, cwd=tree, env=env_for(tree), capture_output=True, text=True,
                timeout=args.timeout, check=False,
            )  # fmt: skip
            if out.returncode != 0:
                raise RuntimeError(
                    f"in-process run failed:\n{out.stdout[-2000:]}{out.stderr[-2000:]}"
                )
            samples[tname].append(json.loads(out.stdout.strip().splitlines()[-1]))
    rows = []
    for tname, _ in trees:
        runs = samples[tname]
        row = {
            "tree": tname,
            "batch": batch,
            "total_us": med([r["total_us"] for r in runs]),
            "total_runs": [round(r["total_us"], 1) for r in runs],
            "executor_us": med([r["threads"].get("taskclaim-exec-0", 0.0) for r in runs]),
            "claimer_us": med([r["threads"].get("taskclaim-claimer", 0.0) for r in runs]),
        }
        rows.append(row)
        log(
            f"  {tname} batch={batch}: {row['total_us']:.1f} µs/job (runs {row['total_runs']}); "
            f"executor {row['executor_us']:.1f}, claimer {row['claimer_us']:.1f}"
        )
    return rows


# -- breakdown -----------------------------------------------------------------------------


def bench_breakdown(args: argparse.Namespace, alias: str) -> list[dict[str, Any]]:
    """Each stage of a job's path through the worker, run alone in this process on one
    thread (``time.thread_time``), per job, at batch 100: what the whole worker costs
    beyond their sum is its threads handing rows to each other (locks, wake-ups), the
    heartbeat and the loops around the stages."""
    from django.db import connections

    from benchmarks.benchapp.models import BenchTask
    from django_taskclaim.claim.statements import _instances
    from django_taskclaim.settle.batch import complete_many
    from django_taskclaim.settle.outcome import attempt, settle
    from django_taskclaim.worker.ledger import Ledger

    batch = args.batches[-1]
    rounds = max(5, args.repeat)
    per_round = 20
    stages = ["claim statement, rows read", "rows to model instances", "hand-off (ledger)",
              "body call", "outcome recorded (deferred)", "batched acknowledgement"]  # fmt: skip
    spent: dict[str, list[float]] = {k: [] for k in stages}
    handler = BenchTask.process
    conn = connections[alias]
    table = table_sql(alias)
    for _ in range(rounds):
        fill(alias, batch * per_round)
        with conn.cursor() as cur:
            cur.execute(f"SELECT * FROM {table} LIMIT %s", [batch])
            raw = cur.fetchall()
        totals = dict.fromkeys(stages, 0.0)
        jobs = 0
        ledger = Ledger(capacity=batch, claim_size=batch)
        for _ in range(per_round):
            t0 = time.thread_time()
            rows = BenchTask.objects.using(alias).claim(batch, lease=300, worker="bench:1")
            t1 = time.thread_time()
            _instances(BenchTask, alias, raw)
            t2 = time.thread_time()
            totals["claim statement, rows read"] += (t1 - t0) - (t2 - t1)
            totals["rows to model instances"] += t2 - t1
            t0 = time.thread_time()
            ledger.add_claimed(rows)
            for _row in rows:
                task = ledger.take("e", 1.0)
                ledger.finishing("e")
                ledger.settled("e")
            t1 = time.thread_time()
            totals["hand-off (ledger)"] += t1 - t0
            deferred: list[Any] = []
            body = outcome = 0.0
            for task in rows:
                a = time.thread_time()
                done = attempt(task, handler, catch_base_exceptions=True, sync=True)
                b = time.thread_time()
                settle(task, done, defer=deferred.append)
                c = time.thread_time()
                body += b - a
                outcome += c - b
            totals["body call"] += body
            totals["outcome recorded (deferred)"] += outcome
            t0 = time.thread_time()
            complete_many(deferred)
            totals["batched acknowledgement"] += time.thread_time() - t0
            jobs += len(rows)
        for k in stages:
            spent[k].append(totals[k] / jobs * 1e6)
    out = [
        {"stage": k, "us_per_job": med(v), "runs": [round(x, 2) for x in v]}
        for k, v in spent.items()
    ]
    for row in out:
        log(f"  {row['stage']}: {row['us_per_job']:.1f} µs/job (runs {row['runs']})")
    return out


# -- report --------------------------------------------------------------------------------


def report(data: dict[str, Any]) -> str:
    parts = []
    if data.get("cpu"):
        parts.append(
            table(
                "Worker CPU per no-op job (net of start-up: two backlogs' difference)",
                ["tree", "P x T", "batch", "CPU ms/job (median)", "runs", "jobs/s"],
                [
                    [
                        r["tree"],
                        r["config"],
                        r["batch"],
                        f"{r['cpu_ms_per_job']:.4f}",
                        " / ".join(f"{x:.4f}" for x in r["cpu_runs"]),
                        f"{r['jobs_s']:,.0f}",
                    ]
                    for r in data["cpu"]
                ],
            )
        )
    if data.get("in_process"):
        parts.append(
            table(
                "Worker CPU per no-op job, drained in one process (every thread; 1 thread)",
                ["tree", "batch", "process µs/job (median)", "runs", "executor", "claimer"],
                [
                    [
                        r["tree"],
                        r["batch"],
                        f"{r['total_us']:.1f}",
                        " / ".join(f"{x:.1f}" for x in r["total_runs"]),
                        f"{r['executor_us']:.1f}",
                        f"{r['claimer_us']:.1f}",
                    ]
                    for r in data["in_process"]
                ],
            )
        )
    if data.get("breakdown"):
        total = sum(r["us_per_job"] for r in data["breakdown"])
        rows = [[r["stage"], f"{r['us_per_job']:.1f}"] for r in data["breakdown"]]
        rows.append(["sum of the stages", f"{total:.1f}"])
        whole = next(
            (r["total_us"] for r in data.get("in_process") or [] if r["tree"] == "after"), None
        )
        if whole is not None:
            rows.append(["the whole worker, in one process (measured above)", f"{whole:.1f}"])
            rows.append(["threads, wake-ups, heartbeat, loops (the rest)", f"{whole - total:.1f}"])
        parts.append(
            table(
                "Per job, stage by stage (each run alone on one thread, batch 100, CPU time)",
                ["stage", "µs/job"],
                rows,
            )
        )
    if data.get("instructions"):
        parts.append(
            table(
                "Instructions per no-op job (callgrind, one process, one thread)",
                ["tree", "batch", "instructions/job"],
                [
                    [r["tree"], r["batch"], f"{r['instructions_per_job']:,.0f}"]
                    for r in data["instructions"]
                ],
            )
        )
    prof = data.get("profile")
    if prof:
        parts.append(
            table(
                f"Where the worker's CPU goes (py-spy, on-CPU samples by innermost known frame, "
                f"batch {prof['batch']}, {prof['jobs']:,} jobs, {prof['samples']:,} samples)",
                ["what", "share"],
                [[c["what"], f"{c['share']:.1%}"] for c in prof["categories"]],
            )
        )
        parts.append(
            table(
                "Top frames (innermost, on-CPU)",
                ["frame", "share"],
                [[t["function"], f"{t['share']:.1%}"] for t in prof["top"]],
            )
        )
    return "\n\n".join(parts)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--before", type=Path, help="another checkout to interleave with this one")
    p.add_argument("--tasks", type=int, default=20000, help="large backlog (small: a fifth)")
    p.add_argument("--instr-tasks", type=int, default=2000, help="large backlog under valgrind")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--batches", nargs="+", type=int, default=[1, 100])
    p.add_argument("--configs", nargs="+", choices=sorted(CONFIGS), default=["1x1", "2x4"])
    p.add_argument("--instructions", action="store_true", help="also count instructions")
    p.add_argument("--profile", action="store_true", help="also profile (batch: the last)")
    p.add_argument("--breakdown", action="store_true", help="also time each stage alone")
    p.add_argument(
        "--in-process", action="store_true", help="also drain in one process, per thread"
    )
    p.add_argument("--in-process-child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--no-cpu", action="store_true", help="skip the CPU runs")
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--output", type=Path)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.before is not None:
        args.before = args.before.resolve()
    aliases = [a for a in reachable_aliases() if vendor(a) == "postgresql"]
    if not aliases:
        log("no PostgreSQL database reachable (benchmarks/settings.py)")
        return 2
    alias = aliases[0]
    if args.in_process_child:  # one run, its figures as one JSON line on stdout
        print(json.dumps(in_process_child(args.tasks, args.batches[-1], alias)))
        return 0
    data: dict[str, Any] = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.argv[0]).name, *(argv or sys.argv[1:])]),
        "before": str(args.before) if args.before else None,
        "tasks": args.tasks,
    }
    if not args.no_cpu:
        log("worker CPU per job…")
        data["cpu"] = bench_cpu(args, alias)
    if args.in_process:
        log("drained in one process…")
        data["in_process"] = bench_in_process(args, alias)
    if args.breakdown:
        log("stage by stage…")
        data["breakdown"] = bench_breakdown(args, alias)
    if args.instructions:
        log("instructions per job (valgrind)…")
        data["instructions"] = bench_instructions(args, alias)
    if args.profile:
        log("profile…")
        data["profile"] = bench_profile(args, alias)
    print(report(data))
    out = args.output or RESULTS / f"per-job-{datetime.now(UTC):%Y%m%dT%H%M%S}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=2))
    log(f"JSON: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
