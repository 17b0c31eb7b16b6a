"""Settings of the fleet benchmark (``benchmarks/fleet.py``): the benchmark settings on a
database of their own, plus ``shard`` on a second PostgreSQL server
(``TASKCLAIM_BENCH_SHARD_URL``)."""

from __future__ import annotations

import os

import environ

os.environ.setdefault("TASKCLAIM_BENCH_DB_NAME", "taskclaim_bench_fleet")
os.environ.setdefault("TASKCLAIM_BENCH_NO_MARIADB", "1")

from benchmarks.settings import *  # noqa: F403
from benchmarks.settings import DATABASES

if os.environ.get("TASKCLAIM_BENCH_SHARD_URL"):
    _shard = environ.Env.db_url_config(os.environ["TASKCLAIM_BENCH_SHARD_URL"])
    _shard.setdefault("OPTIONS", {})
    for _key in ("host", "port"):
        if _key in _shard["OPTIONS"]:
            _shard[_key.upper()] = _shard["OPTIONS"].pop(_key)
    DATABASES = {**DATABASES, "shard": _shard}
