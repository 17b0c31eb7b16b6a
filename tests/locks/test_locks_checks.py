"""System checks of ``django_taskclaim.checks.locks`` (pooler declaration)."""

from __future__ import annotations

from django.conf import settings
from django.test import override_settings

from django_taskclaim.checks.locks import check_pooler, pooler_messages

PG = {"ENGINE": "django.db.backends.postgresql", "NAME": "app", "HOST": "db", "PORT": 5432}


def ids(databases, mode):
    return [m.id for m in pooler_messages(databases, mode)]


def test_transaction_pooler_warns_about_session_locks_and_cursors():
    dbs = {"default": dict(PG)}
    assert ids(dbs, "transaction") == [
        "taskclaim.W003",
        "taskclaim.W010",
    ]
    dbs["default"]["DISABLE_SERVER_SIDE_CURSORS"] = True
    (msg,) = pooler_messages(dbs, "transaction")
    assert msg.id == "taskclaim.W003"
    assert "session-scope advisory locks are refused" in msg.msg
    assert "xact=True" in msg.hint


def test_session_pooler_or_none_is_quiet():
    dbs = {"default": dict(PG)}
    assert ids(dbs, "session") == []
    assert ids(dbs, None) == []


def test_pgbouncer_port_without_declared_mode_warns():
    dbs = {"default": dict(PG, PORT="6432")}
    assert ids(dbs, None) == ["taskclaim.W011"]
    assert ids(dbs, "session") == []


def test_non_postgres_databases_are_ignored():
    dbs = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
    assert ids(dbs, "transaction") == []


def test_the_registered_check_reads_the_live_settings():
    from django.core import checks

    assert check_pooler in checks.registry.registry.get_checks()
    with override_settings(TASKCLAIM_POOLER_MODE="transaction"):
        found = [m.id for m in check_pooler()]
    expected = ["taskclaim.W003"] if settings.DB_VENDOR == "postgresql" else []
    assert found[: len(expected)] == expected


def test_pooler_checks_run_without_the_database_tag():
    """They read settings only, so a plain `manage.py check` (and runserver) runs them:
    checks tagged `database` run only with `check --database`."""
    from django.core import checks

    assert checks.registry.registry.tag_exists("compatibility")
    tags = check_pooler.tags  # set by @checks.register
    assert "database" not in tags
    assert check_pooler in checks.registry.registry.get_checks(include_deployment_checks=False)
