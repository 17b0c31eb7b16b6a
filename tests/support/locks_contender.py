"""Child process for the lock contention tests: contends for one singleton repeatedly.

Usage: ``python tests/support/locks_contender.py BACKEND KEY ATTEMPTS HOLD_MS TABLE GO_FILE``
with BACKEND ``lease`` | ``advisory`` | ``advisory-session`` | ``none``. Each win records its
holding interval (database timestamps) and a sequence number read-then-written inside
the lock into TABLE. Prints one JSON line ``{"won": n, "skipped": m}``.

Optional environment: ``TASKCLAIM_CHILD_POOLER_MODE`` sets ``TASKCLAIM_POOLER_MODE``.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import django

NOW = {
    "postgresql": "clock_timestamp()",
    "mysql": "NOW(6)",
    "sqlite": "strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')",
}


def main() -> None:
    backend, key, attempts, hold_ms, table, go_file = sys.argv[1:7]
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.support.settings")
    django.setup()
    from django.conf import settings
    from django.db import connection

    from django_taskclaim.locks import SKIPPED, singleton

    if os.environ.get("TASKCLAIM_CHILD_POOLER_MODE"):
        settings.TASKCLAIM_POOLER_MODE = os.environ["TASKCLAIM_CHILD_POOLER_MODE"]
    now = NOW[connection.vendor]
    holder = f"{os.getpid()}"
    qtable = connection.ops.quote_name(table)

    def body() -> bool:
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT COALESCE(MAX(seq), 0) FROM {qtable}")
            seq = int(cursor.fetchone()[0]) + 1
            cursor.execute(
                f"INSERT INTO {qtable} (seq, holder, started_at) VALUES (%s, %s, {now})",
                (seq, holder),
            )
            time.sleep(float(hold_ms) / 1000)  # the work done while holding the lock
            cursor.execute(
                f"UPDATE {qtable} SET ended_at = {now} WHERE seq = %s AND holder = %s",
                (seq, holder),
            )
        return True

    if backend == "none":  # the naive way: no lock at all (proves the ledger detects it)
        run = body
    elif backend == "lease":
        run = singleton(key, ttl=60, backend="lease")(body)
    else:
        run = singleton(key, backend="advisory", xact=backend == "advisory")(body)

    Path(go_file + f".ready.{os.getpid()}").touch()
    from tests.support.helpers import wait_for

    try:  # start together with the others
        wait_for(Path(go_file).exists, timeout=60, interval=0.005, what="the go signal")
    except AssertionError:
        raise SystemExit("no go signal") from None
    won = skipped = 0
    for _ in range(int(attempts)):
        result = run()
        if result is SKIPPED:
            skipped += 1
        else:
            won += 1
        time.sleep(random.uniform(0, 0.02))  # spread the attempts over time
    print(json.dumps({"won": won, "skipped": skipped}), flush=True)


# ----------------------------------------------------------- parent-side helpers

DDL = {
    "postgresql": "CREATE TABLE {t} (id serial PRIMARY KEY, seq integer NOT NULL, "
    "holder varchar(64) NOT NULL, started_at timestamptz NOT NULL, ended_at timestamptz)",
    "mysql": "CREATE TABLE {t} (id integer AUTO_INCREMENT PRIMARY KEY, seq integer NOT NULL, "
    "holder varchar(64) NOT NULL, started_at datetime(6) NOT NULL, ended_at datetime(6))",
    "sqlite": "CREATE TABLE {t} (id integer PRIMARY KEY AUTOINCREMENT, seq integer NOT NULL, "
    "holder varchar(64) NOT NULL, started_at text NOT NULL, ended_at text)",
}


@contextlib.contextmanager
def ledger_table(name: str = "locks_ledger") -> Iterator[str]:
    """Create the holding-interval ledger table for the block (dropped afterwards)."""
    from django.db import connection

    qname = connection.ops.quote_name(name)
    with connection.cursor() as cursor:
        cursor.execute(f"DROP TABLE IF EXISTS {qname}")
        cursor.execute(DDL[connection.vendor].format(t=qname))
    try:
        yield name
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"DROP TABLE IF EXISTS {qname}")


def contend(
    backend: str,
    table: str,
    *,
    procs: int = 10,
    attempts: int = 50,
    hold_ms: float = 3,
    key: str = "contended-singleton",
    env: dict[str, str] | None = None,
) -> dict[str, int]:
    """Run ``procs`` contenders started together; return summed ``won`` / ``skipped``."""
    from tests.support.helpers import PYTHON, ROOT, child_env, wait_for

    with tempfile.TemporaryDirectory(prefix="taskclaim-contend-") as tmp:
        go = str(Path(tmp) / "go")
        args = [backend, key, str(attempts), str(hold_ms), table, go]
        children = [
            subprocess.Popen(
                [PYTHON, str(ROOT / "tests" / "support" / "locks_contender.py"), *args],
                env=child_env(**(env or {})),
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(procs)
        ]
        try:
            wait_for(
                lambda: (
                    len(list(Path(tmp).glob("go.ready.*"))) == procs
                    or any(c.poll() is not None for c in children)
                ),
                timeout=90,
                what="all contenders to start",
            )
            Path(go).touch()
            totals = {"won": 0, "skipped": 0}
            for child in children:
                out, err = child.communicate(timeout=120)
                if child.returncode != 0:
                    raise AssertionError(f"contender failed ({child.returncode}):\n{err}")
                result = json.loads(out.strip().splitlines()[-1])
                totals["won"] += result["won"]
                totals["skipped"] += result["skipped"]
            return totals
        finally:
            for child in children:
                if child.poll() is None:
                    child.kill()
                    child.communicate()


def ledger_rows(table: str) -> list[tuple[Any, ...]]:
    """``(seq, holder, started_at, ended_at)`` of every win, by start time."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT seq, holder, started_at, ended_at FROM {connection.ops.quote_name(table)} "
            "ORDER BY started_at, id"
        )
        return list(cursor.fetchall())


def overlaps(rows: list[tuple[Any, ...]]) -> list[tuple[Any, Any]]:
    """Pairs of consecutive holding intervals that overlap (two holders at once)."""
    bad = []
    for prev, cur in itertools.pairwise(rows):
        if prev[3] is None or cur[2] < prev[3]:
            bad.append((prev, cur))
    return bad


if __name__ == "__main__":
    main()
