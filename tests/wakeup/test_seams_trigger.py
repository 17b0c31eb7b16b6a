"""A notify trigger never blocks a migration of the columns it reads (PostgreSQL).

The trigger of a ``notify = "trigger"`` model depends on its status column
(``UPDATE OF <status> … WHEN (NEW.<status> = …)``), and PostgreSQL refuses to change the
type of a column a trigger uses. ``migrate`` therefore sets the triggers of the apps it is
about to migrate aside before the first migration and puts them back after the last. The
test builds a throwaway app in a temporary directory, migrates it with the real
``makemigrations`` and ``migrate`` commands, widens its status column, and checks that one
``migrate`` does it and that the trigger is back and notifies.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from django.db import connection

from django_taskclaim.backends import for_connection
from tests.support.helpers import ROOT, child_env

pytestmark = pytest.mark.django_db(transaction=True)

APP = "seamtrig"
TABLE = "seamtrig_job"
LABEL = "seamtrig.Job"

MODELS = """\
from django.db import models

from django_taskclaim.models import ClaimableModel
from django_taskclaim.row.status import Status


class Job(ClaimableModel):
    title = models.CharField(max_length=50, default="")
    status = models.CharField(
        max_length={length},
        choices=Status.choices,
        default=Status.READY,
        db_default=Status.READY.value,
    )

    class ClaimMeta:
        notify = "trigger"

    class Meta(ClaimableModel.Meta):
        pass

    def process(self):
        return None
"""


@pytest.fixture(autouse=True)
def _postgresql_only():
    if connection.vendor != "postgresql":
        pytest.skip(f"triggers that notify are PostgreSQL's (running on {connection.vendor})")


class Project:
    """The test settings plus a throwaway app, run through ``python -m django``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        app = root / APP
        (app / "migrations").mkdir(parents=True)
        (app / "__init__.py").write_text("")
        (app / "migrations" / "__init__.py").write_text("")
        (root / "seam_settings.py").write_text(
            "from tests.support.settings import *  # noqa: F403\n\n"
            f"INSTALLED_APPS = [*INSTALLED_APPS, {APP!r}]  # noqa: F405\n"
        )

    def status_length(self, length: int) -> None:
        (self.root / APP / "models.py").write_text(MODELS.format(length=length))

    def manage(self, *args: str) -> subprocess.CompletedProcess[str]:
        env = child_env(DJANGO_SETTINGS_MODULE="seam_settings", PYTHONDONTWRITEBYTECODE="1")
        env["PYTHONPATH"] = os.pathsep.join([str(self.root), str(ROOT)])
        return subprocess.run(
            [sys.executable, "-m", "django", *args],
            env=env,
            cwd=self.root,
            capture_output=True,
            text=True,
            timeout=180,
        )

    def ok(self, *args: str) -> str:
        done = self.manage(*args)
        assert done.returncode == 0, f"{' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"
        return done.stdout


def triggers() -> dict[str, str]:
    with connection.cursor() as cursor:
        return for_connection(connection).notify_trigger_fingerprints(cursor)


def trigger_oid() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT t.oid FROM pg_trigger t WHERE t.tgrelid = to_regclass(%s) "
            "AND t.tgname = 'taskclaim_notify'",
            [TABLE],
        )
        return int(cursor.fetchone()[0])


def status_max_length() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT character_maximum_length FROM information_schema.columns "
            "WHERE table_name = %s AND column_name = 'status'",
            [TABLE],
        )
        return int(cursor.fetchone()[0])


def notifications_of_an_insert() -> list[str]:
    """What a listening session hears when a ready row is inserted by raw SQL."""
    s = connection.settings_dict
    with psycopg.connect(
        host=s["HOST"] or "127.0.0.1",
        port=int(s["PORT"] or 5432),
        user=s["USER"] or "postgres",
        dbname=s["NAME"],
        autocommit=True,
    ) as listener:
        listener.execute('LISTEN "taskclaim"')
        with connection.cursor() as cursor:
            cursor.execute(f"INSERT INTO {TABLE} (title) VALUES ('raw')")
        listener.execute("SELECT pg_notify('taskclaim', 'sentinel')")
        heard = []
        for note in listener.notifies(timeout=30):
            if note.payload == "sentinel":
                return heard
            heard.append(note.payload)
    raise AssertionError(f"no sentinel within 30 s; heard {heard}")


@pytest.mark.slow
def test_one_migrate_alters_the_status_column_under_a_notify_trigger(tmp_path):
    project = Project(tmp_path)
    project.status_length(16)
    project.ok("makemigrations", APP)
    try:
        project.ok("migrate", APP)
        before = triggers().get(TABLE)
        assert before, "migrate did not create the notify trigger"
        assert status_max_length() == 16

        project.status_length(32)
        project.ok("makemigrations", APP)
        assert "AlterField" in next((tmp_path / APP / "migrations").glob("0002_*.py")).read_text()
        migrated = project.manage("migrate", APP)
        assert migrated.returncode == 0, (
            f"one migrate could not alter the column:\n{migrated.stdout}\n{migrated.stderr}"
        )
        assert status_max_length() == 32
        # Put back as it was (nothing to report), and it notifies.
        assert triggers().get(TABLE) == before
        assert f"notify trigger of {LABEL}" not in migrated.stdout
        assert notifications_of_an_insert() == [LABEL]
        # A migrate with nothing to run leaves the trigger alone.
        oid = trigger_oid()
        assert "No migrations to apply" in project.ok("migrate", APP)
        assert trigger_oid() == oid
    finally:
        project.manage("migrate", APP, "zero")
    assert TABLE not in triggers()
