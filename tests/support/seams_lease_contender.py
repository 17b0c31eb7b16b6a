"""Child process for the lease renewal contention test: contends for one ``LeaseLock``
with a short ttl and ``auto_renew``, holding it for longer than the ttl when won.

Usage: ``python tests/support/seams_lease_contender.py KEY TTL SECONDS HOLD TABLE GO_FILE``.
Each win writes one ledger row (holder, token, started_at) and then, with database
timestamps, either ``ended_at`` (the hold ran to its end under the lock) or ``lost_at``
(the holder was told the lease was lost and stopped). ``told_at_exit`` marks a lease
found lost only when the block was left. Prints one JSON line ``{"won": n, "busy": m}``.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from pathlib import Path

import django

NOW = {"postgresql": "clock_timestamp()", "mysql": "NOW(6)"}

DDL = {
    "postgresql": "CREATE TABLE {t} (id serial PRIMARY KEY, holder varchar(64) NOT NULL, "
    "token bigint NOT NULL, started_at timestamptz NOT NULL, ended_at timestamptz, "
    "lost_at timestamptz, told_at_exit boolean NOT NULL DEFAULT false)",
    "mysql": "CREATE TABLE {t} (id integer AUTO_INCREMENT PRIMARY KEY, holder varchar(64) "
    "NOT NULL, token bigint NOT NULL, started_at datetime(6) NOT NULL, ended_at datetime(6), "
    "lost_at datetime(6), told_at_exit bool NOT NULL DEFAULT false)",
}


def main() -> None:
    key, ttl, seconds, hold, table, go_file = sys.argv[1:7]
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.support.settings")
    django.setup()
    from django.db import connection

    from django_taskclaim.exceptions import LockLost, LockNotAcquired
    from django_taskclaim.locks import LeaseLock
    from tests.support.helpers import wait_for

    now = NOW[connection.vendor]
    qtable = connection.ops.quote_name(table)
    holder = str(os.getpid())
    Path(f"{go_file}.ready.{os.getpid()}").touch()
    try:
        wait_for(Path(go_file).exists, timeout=90, interval=0.005, what="the go signal")
    except AssertionError:
        raise SystemExit("no go signal") from None
    won = busy = 0
    stop_at = time.monotonic() + float(seconds)
    while time.monotonic() < stop_at:
        lock = LeaseLock(key, float(ttl), auto_renew=True)
        try:
            lock.__enter__()
        except LockNotAcquired:
            busy += 1
            time.sleep(random.uniform(0, 0.02))
            continue
        won += 1
        with connection.cursor() as cursor:
            cursor.execute(
                f"INSERT INTO {qtable} (holder, token, started_at) VALUES (%s, %s, {now})",
                (holder, lock.token),
            )
            row = cursor.lastrowid if connection.vendor == "mysql" else None
            if row is None:
                cursor.execute(f"SELECT MAX(id) FROM {qtable} WHERE holder = %s", (holder,))
                row = cursor.fetchone()[0]
            flag = lock.cancel_flag
            ends = time.monotonic() + float(hold)
            told = False
            while (left := ends - time.monotonic()) > 0:  # the work done under the lock
                if flag.wait(min(0.01, left)):
                    told = True
                    break
            column = "lost_at" if told else "ended_at"
            cursor.execute(f"UPDATE {qtable} SET {column} = {now} WHERE id = %s", (row,))
        try:
            lock.__exit__(None, None, None)
        except LockLost:
            if not told:
                with connection.cursor() as cursor:
                    cursor.execute(
                        f"UPDATE {qtable} SET told_at_exit = %s WHERE id = %s", (True, row)
                    )
    print(json.dumps({"won": won, "busy": busy}), flush=True)


if __name__ == "__main__":
    main()
