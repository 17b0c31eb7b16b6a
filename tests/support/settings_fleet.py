"""Test settings with a second database, ``shard``, on another PostgreSQL server.

``TASKCLAIM_SHARD_URL`` (a ``postgres://`` URL) names it; ``TASKCLAIM_SHARD_ROUTE`` (a
model label) routes that model's reads and writes to it through
:class:`tests.support.fleet_router.ShardRouter`. Used by the worker subprocesses of
``tests/worker/test_fleet.py``.
"""

from __future__ import annotations

import os

import environ

from tests.support.settings import *  # noqa: F403
from tests.support.settings import DATABASES

if os.environ.get("TASKCLAIM_SHARD_URL"):
    shard = environ.Env.db_url_config(os.environ["TASKCLAIM_SHARD_URL"])
    shard.setdefault("OPTIONS", {})
    if "host" in shard["OPTIONS"]:
        shard["HOST"] = shard["OPTIONS"].pop("host")
    if "port" in shard["OPTIONS"]:
        shard["PORT"] = shard["OPTIONS"].pop("port")
    shard["CONN_MAX_AGE"] = 0
    DATABASES = {**DATABASES, "shard": shard}

if os.environ.get("TASKCLAIM_SHARD_ROUTE"):
    DATABASE_ROUTERS = ["tests.support.fleet_router.ShardRouter"]
