#!/usr/bin/env python
"""What PostgreSQL alone can drain with the worker's own SQL: two round trips per batch,
or one (the last batch's completion sent with the next claim).

    python benchmarks/fused_ceiling.py [--rounds 3] [--clients 8] [--batch 100] [--rows 100000]

pgbench replays, with C clients and prepared statements, the exact statements a worker
sends per batch at the given size (captured from ``claim(batch)`` and
``complete_many()``):

* ``two``: the claim, then the fenced completion of the rows it returned — the worker's
  two round trips per batch (the ceiling ``run.py`` and ``peers.py`` quote);
* ``fused``: one statement per batch that completes the rows the client's previous
  statement claimed and claims the next batch (``WITH u AS (<claim>), done AS
  (<complete> RETURNING 1) SELECT …``). A claim takes ``ready`` rows only, a completion
  ``processing`` rows, so the two parts of one statement never touch the same row.

No Python runs beside the server: the jobs/s of each form is what the server (and
pgbench) can do on this machine, the bound a worker that fused its round trips would
move. The two forms alternate within each round; medians of ``--rounds``. Jobs/s is
over pgbench's wall time (rows ``done`` at the end / seconds). Prints a Markdown table;
writes JSON to results/fused-ceiling-<time>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
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

from django.db import connections  # noqa: E402

from benchmarks.run import (  # noqa: E402  (sets Django up)
    RESULTS,
    BenchTask,
    claim_sql,
    complete_sql,
    fill,
    log,
    med,
    pgbench_binary,
    reachable_aliases,
    table,
    vendor,
)


def scripts(alias: str, batch: int) -> dict[str, str]:
    """The two pgbench scripts (``two``, ``fused``) for claims of ``batch`` rows."""
    qn = connections[alias].ops.quote_name
    _, claim = claim_sql(alias, batch)
    complete = complete_sql(alias).format(ids=":ids", vs=":vs")
    arrays = (
        f"coalesce(array_agg(u.{qn('id')}), '{{}}') AS ids, "
        f"coalesce(array_agg(u.{qn('version')}), '{{}}') AS vs"
    )
    return {
        "two": f"WITH u AS ({claim}) SELECT {arrays} FROM u\n\\gset\n{complete};\n",
        "fused": (
            f"WITH u AS ({claim}), done AS ({complete} RETURNING 1) "
            f"SELECT {arrays}, (SELECT count(*) FROM done) AS n FROM u\n\\gset\n"
        ),
    }


def run(alias: str, pgbench: str, form: str, script: str, args: argparse.Namespace) -> float:
    """Drain a fresh backlog with ``script``; return jobs/s (rows done / wall seconds)."""
    per_client = max(1, args.rows // (args.clients * args.batch))
    fill(alias, per_client * args.clients * args.batch)
    s = connections[alias].settings_dict
    with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as fh:
        fh.write(script)
        path = fh.name
    # fused: one more statement per client, to complete its last batch
    runs = per_client + (1 if form == "fused" else 0)
    argv = [pgbench, "-n", "-M", "prepared", "-f", path, "-c", str(args.clients)]
    argv += ["-j", str(min(args.clients, 2)), "-t", str(runs), "-D", "ids={}", "-D", "vs={}"]
    argv += ["-h", s["HOST"] or "127.0.0.1", "-U", s["USER"] or "postgres"]
    argv += ["-p", str(s.get("PORT") or 5432), s["NAME"]]
    try:
        started = time.monotonic()
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=600)
        wall = time.monotonic() - started
    finally:
        os.unlink(path)
    if proc.returncode != 0 or not re.search(r"tps = ", proc.stdout):
        raise RuntimeError(f"pgbench failed: {' '.join(argv)}\n{proc.stdout}\n{proc.stderr}")
    done = BenchTask.objects.using(alias).filter(status="done").count()
    return done / wall


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--batch", type=int, default=100)
    p.add_argument("--rows", type=int, default=100_000)
    p.add_argument("--output", type=Path)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    aliases = [a for a in reachable_aliases() if vendor(a) == "postgresql"]
    pgbench = pgbench_binary()
    if not aliases or pgbench is None:
        log("needs a PostgreSQL database (benchmarks/settings.py) and pgbench")
        return 2
    alias = aliases[0]
    forms = scripts(alias, args.batch)
    rates: dict[str, list[float]] = {form: [] for form in forms}
    for i in range(args.rounds):
        for form, script in forms.items():
            rates[form].append(run(alias, pgbench, form, script, args))
            log(f"round {i + 1} {form}: {rates[form][-1]:,.0f} jobs/s")
    two = med(rates["two"])
    rows = [
        [form, f"{med(r):,.0f}", " ".join(f"{x:,.0f}" for x in r), f"{med(r) / two:.2f}x"]
        for form, r in rates.items()
    ]
    print(
        table(
            f"pgbench, {args.clients} clients, batch {args.batch}, {args.rows:,} rows, "
            f"median of {args.rounds}",
            ["form", "jobs/s", "runs", "vs two"],
            rows,
        )
    )
    data: dict[str, Any] = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.argv[0]).name, *(argv or sys.argv[1:])]),
        "clients": args.clients,
        "batch": args.batch,
        "rows": args.rows,
        "jobs_s": rates,
        "scripts": forms,
    }
    out = args.output or RESULTS / f"fused-ceiling-{datetime.now(UTC):%Y%m%dT%H%M%S}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=2))
    log(f"JSON: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
