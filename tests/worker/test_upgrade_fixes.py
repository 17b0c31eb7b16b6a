"""After an upgrade, the worker, the system check and the doctor name the command that
makes what the database lacks, table by table: ``migrate`` for the app's own tables
(their migrations ship with it) and for what the user's migrations already create;
``makemigrations <app>`` then ``migrate`` for a field the upgrade added to a mixin, which
the user's migrations do not create yet (``migrate`` alone would have nothing to apply).

The upgrade is reproduced as it happens: the user's migrations end before ``claimed_at``
(``MIGRATION_MODULES`` points ``testapp`` at its migrations 0001–0004) and the table has
no such column (renamed away for the test, renamed back after). An app table missing is
one renamed away. Real worker and ``check`` subprocesses; the doctor in process.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from django.apps import apps
from django.db import connection
from django.test import override_settings

from django_taskclaim.ops.doctor import diagnose
from django_taskclaim.worker.exits import EXIT_CONFIG
from tests.support.testapp.models import CharKeyTask
from tests.support.worker_procs import run_command

pytestmark = pytest.mark.django_db(transaction=True)

MODEL = "testapp.CharKeyTask"
BEFORE = {"testapp": "tests.support.testapp_before_claimed_at"}
TABLE = CharKeyTask._meta.db_table
MAKE = "run python manage.py makemigrations testapp, then python manage.py migrate"
MIGRATE = "run python manage.py migrate"


@pytest.fixture
def claimed_at_dropped(transactional_db) -> Iterator[None]:
    """``CharKeyTask.claimed_at`` has no column (renamed away; back afterwards)."""
    field = CharKeyTask._meta.get_field("claimed_at")
    gone = field.clone()
    gone.set_attributes_from_name("claimed_at")
    gone.column = "claimed_at_gone"
    gone.model = CharKeyTask
    with connection.schema_editor() as editor:
        editor.alter_field(CharKeyTask, field, gone)
    try:
        yield
    finally:
        with connection.schema_editor() as editor:
            editor.alter_field(CharKeyTask, gone, field)


@pytest.fixture
def app_table_dropped(transactional_db) -> Iterator[str]:
    """The app's ``PeriodicSlot`` table renamed away; renamed back afterwards."""
    model = apps.get_model("taskclaim", "PeriodicSlot")
    table = model._meta.db_table
    with connection.schema_editor() as editor:
        editor.alter_db_table(model, table, f"{table}_gone")
    try:
        yield table
    finally:
        with connection.schema_editor() as editor:
            editor.alter_db_table(model, f"{table}_gone", table)


def upgraded_env() -> dict[str, str]:
    return {"TASKCLAIM_T_SETTINGS": json.dumps({"MIGRATION_MODULES": BEFORE})}


def refusal_line(*, env: dict[str, str] | None = None) -> str:
    done = run_command("taskclaim_worker", MODEL, "--burst", timeout=60, env=env)
    assert done.returncode == EXIT_CONFIG, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    lines = [line for line in done.stderr.splitlines() if "does not match" in line]
    assert len(lines) == 1, done.stderr[-3000:]
    return lines[0]


def check_output(*, env: dict[str, str] | None = None) -> str:
    done = run_command("check", "--database", "default", "--tag", "database", env=env)
    assert done.returncode == 0, done.stderr[-3000:]  # warnings: migrate must still run
    return done.stderr


# -- a mixin field the user's migrations do not create: makemigrations first ------------


def test_the_worker_says_makemigrations_for_a_mixin_column_the_migrations_lack(
    claimed_at_dropped,
):
    line = refusal_line(env=upgraded_env())
    assert f"table {TABLE} has no column claimed_at: {MAKE}" in line


def test_the_system_check_says_makemigrations_for_a_mixin_column_the_migrations_lack(
    claimed_at_dropped,
):
    out = check_output(env=upgraded_env())
    assert "taskclaim.W012" in out
    assert f"table {TABLE} has no column claimed_at" in out
    assert MAKE[0].upper() + MAKE[1:] in out
    assert "the migrations of testapp do not create it" in out


def test_the_doctor_says_makemigrations_for_a_mixin_column_the_migrations_lack(
    claimed_at_dropped,
):
    with override_settings(MIGRATION_MODULES=BEFORE):
        found = [f for f in diagnose([CharKeyTask]) if f.id == "TC-D008"]
    assert [f.severity for f in found] == ["error"]
    assert f"table {TABLE} has no column claimed_at" in found[0].title
    assert found[0].fix == MAKE[0].upper() + MAKE[1:] + "."


# -- what a migration creates: migrate ---------------------------------------------------


def test_a_column_the_migrations_create_is_still_migrate_everywhere(claimed_at_dropped):
    line = refusal_line()
    assert f"table {TABLE} has no column claimed_at: {MIGRATE}" in line
    assert "makemigrations" not in line
    out = check_output()
    assert f"table {TABLE} has no column claimed_at" in out
    assert "makemigrations" not in out
    found = [f for f in diagnose([CharKeyTask]) if f.id == "TC-D008"]
    assert found[0].fix == "Run python manage.py migrate."


def test_an_app_table_missing_is_migrate_in_the_worker_the_check_and_the_doctor(
    app_table_dropped,
):
    # Even while the user's own models need makemigrations: each table its own fix.
    line = refusal_line(env=upgraded_env())
    assert f"table {app_table_dropped} is missing: {MIGRATE}" in line
    out = check_output(env=upgraded_env())
    assert f"table {app_table_dropped} is missing" in out
    assert "Run python manage.py migrate: its migration is applied" in out
    found = [f for f in diagnose([CharKeyTask]) if f.id == "TC-D009"]
    assert [f.severity for f in found] == ["error"]
    assert app_table_dropped in found[0].title
    assert found[0].fix == "Run python manage.py migrate."


def test_a_matching_schema_gives_no_schema_warning_and_an_ok_doctor():
    out = check_output()
    assert "W012" not in out
    found = [f for f in diagnose([CharKeyTask]) if f.id in ("TC-D008", "TC-D009")]
    assert sorted(f.severity for f in found) == ["ok", "ok"]
