"""A fresh PostgreSQL database with the test suite's apps migrated, for the benchmarks
that measure the suite's models (``operator_reads.py``, ``workflows.py``).

``setup(name)`` drops and creates database ``name`` on the server of
``TASKCLAIM_BENCH_PG_URL`` (default 127.0.0.1:5432), points ``tests.support.settings``
at it, sets Django up and migrates. Call it before importing models.
"""

from __future__ import annotations

import os


def _admin_url() -> str:
    return os.environ.get("TASKCLAIM_BENCH_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres")


def drop(name: str) -> None:
    """Drop database ``name`` (its connections closed first by the server)."""
    import psycopg

    with psycopg.connect(_admin_url(), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def setup(name: str) -> None:
    """Drop and create ``name``, set Django up on it with the suite's settings, migrate."""
    import psycopg

    drop(name)
    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.support.settings"
    os.environ["TASKCLAIM_TEST_DB"] = "postgres"
    os.environ["TASKCLAIM_TEST_DB_NAME"] = name
    with psycopg.connect(_admin_url(), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
