#!/usr/bin/env python
"""What a fan-in and a chain cost per row, against the same rows independent.

    python benchmarks/workflows.py                    # groups of 10,000, chains of 1,000
    python benchmarks/workflows.py --members 100000 --rounds 3

In-process, one connection, on the PostgreSQL server at 127.0.0.1:5432
(``TASKCLAIM_BENCH_PG_URL``), in a dedicated ``taskclaim_bench_workflows`` database
dropped and made anew, with the test settings' models: ``testapp.Step`` (``ClaimMeta.
dependents = True``) and ``testapp.Document`` (the callback, and a model without
``dependents`` for the last case). Each round, interleaved (the order rotates every
round), times the drain of:

- **independent**: ``--members`` Step rows, claimed 100 at a time and completed one by
  one (``task.complete()``: one fenced transaction each, the dependents' lookup included);
- **group**: as many Step rows, members of one fan-in (a Document created ``after=`` all
  of them), drained the same way: each settle also closes its edge and updates the
  counter; the last releases the callback;
- **chain**: ``--chain`` Step rows each created ``after=`` the previous one, drained one
  claim at a time (each row claimable only once its prerequisite settled), against
  **chain-free**: as many independent Step rows drained one claim at a time;
- **plain**: ``--members`` Document rows (no ``dependents``): the settle without any
  dependency work, for the cost of opting in.

Per case: microseconds per row (drain time / rows), statements per settle (counted on
one row), and the enqueue time of the group's callback (``after=`` all members). Medians
over ``--rounds``. A table on stdout, JSON under ``var/``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _drain(model: Any, batch: int) -> int:
    """Claim ``batch`` rows at a time and complete each one; return how many."""
    done = 0
    while True:
        tasks = model.objects.claim(batch)
        if not tasks:
            return done
        for task in tasks:
            task.complete()
        done += len(tasks)


def _statements_of_one_settle(model: Any) -> int:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    task = model.objects.claim_next()
    assert task is not None
    with CaptureQueriesContext(connection) as queries:
        task.complete()
    return len(queries)


def _case(case: str, members: int, chain: int) -> dict[str, Any]:
    from tests.support.testapp.models import Document, Step

    Step.objects.all().delete()
    Document.objects.all().delete()
    from django_taskclaim.models import TaskDependency, TaskFanIn

    TaskDependency.objects.all().delete()
    TaskFanIn.objects.all().delete()
    out: dict[str, Any] = {"case": case}
    if case in ("independent", "group"):
        rows = Step.objects.bulk_create([Step(name=f"m{i}") for i in range(members)], 1000)
        if case == "group":
            began = time.perf_counter()
            join = Document.objects.create(title="join", after=rows, on_failure="run")
            out["enqueue_callback_ms"] = (time.perf_counter() - began) * 1000
        out["statements"] = _statements_of_one_settle(Step)
        began = time.perf_counter()
        n = _drain(Step, 100) + 1
        elapsed = time.perf_counter() - began
        if case == "group":
            assert Document.objects.get(pk=join.pk).status == "ready", "callback not released"
    elif case in ("chain", "chain-free"):
        if case == "chain":
            row = Step.objects.create(name="c0")
            for i in range(1, chain):
                row = Step.objects.create(name=f"c{i}", after=[row])
        else:
            Step.objects.bulk_create([Step(name=f"c{i}") for i in range(chain)], 1000)
        out["statements"] = _statements_of_one_settle(Step)
        began = time.perf_counter()
        n = _drain(Step, 1) + 1
        elapsed = time.perf_counter() - began
        assert n == chain, (case, n)
    else:  # plain
        Document.objects.bulk_create([Document(title=f"p{i}") for i in range(members)], 1000)
        out["statements"] = _statements_of_one_settle(Document)
        began = time.perf_counter()
        n = _drain(Document, 100) + 1
        elapsed = time.perf_counter() - began
    out["rows"] = n
    out["us_per_row"] = elapsed / max(n - 1, 1) * 1e6
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--members", type=int, default=10_000)
    parser.add_argument("--chain", type=int, default=1_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--db", default="taskclaim_bench_workflows")
    args = parser.parse_args()
    from benchmarks import suite_db

    suite_db.setup(args.db)
    from django.db import connection

    cases = ["independent", "group", "chain", "chain-free", "plain"]
    runs: dict[str, list[dict[str, Any]]] = {c: [] for c in cases}
    for r in range(args.rounds):
        order = cases[r % len(cases) :] + cases[: r % len(cases)]
        for case in order:
            found = _case(case, args.members, args.chain)
            runs[case].append(found)
            log(f"round {r + 1} {case:12} {found['us_per_row']:8.0f} µs/row")
    table: dict[str, dict[str, Any]] = {}
    for case, found in runs.items():
        table[case] = {
            "us_per_row": statistics.median(f["us_per_row"] for f in found),
            "statements": found[-1]["statements"],
            "rows": found[-1]["rows"],
        }
        if "enqueue_callback_ms" in found[-1]:
            table[case]["enqueue_callback_ms"] = statistics.median(
                f["enqueue_callback_ms"] for f in found
            )
    base = table["independent"]["us_per_row"]
    print(f"\n{'case':12} {'rows':>8} {'µs/row':>9} {'vs independent':>15} {'statements':>11}")
    for case, row in table.items():
        print(
            f"{case:12} {row['rows']:>8,} {row['us_per_row']:>9.0f} "
            f"{row['us_per_row'] / base:>14.2f}× {row['statements']:>11}"
        )
    if "enqueue_callback_ms" in table["group"]:
        print(
            f"\nthe group's callback, created after= {args.members:,} members: "
            f"{table['group']['enqueue_callback_ms']:.0f} ms"
        )
    version = connection.cursor().connection.info.server_version
    out = {
        "command": " ".join(["python", "benchmarks/workflows.py", *sys.argv[1:]]),
        "postgresql": version,
        "python": platform.python_version(),
        "members": args.members,
        "chain": args.chain,
        "rounds": args.rounds,
        "cases": table,
        "runs": runs,
    }
    path = ROOT / "var" / "bench-workflows.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(out, indent=2))
    log(f"JSON: {path}")


if __name__ == "__main__":
    main()
