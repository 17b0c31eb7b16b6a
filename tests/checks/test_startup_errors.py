"""A project's configuration mistakes stop every command with one clear line, never a
traceback: a bad ``ClaimMeta.rate_limit`` or a ``ClaimMeta`` typo (with the admin wired as
docs/admin.md shows, which builds the model's admin while Django sets up), and
``django_taskclaim`` missing from ``INSTALLED_APPS``.

Each case is a scratch project on disk run with real ``manage.py`` subprocesses.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path

import pytest

from tests.support.markers import ONCE_ON_SQLITE

ROOT = Path(__file__).resolve().parents[2]
#: Each scratch project has its own SQLite file, whatever database the suite runs on.
pytestmark = ONCE_ON_SQLITE

SETTINGS = """
SECRET_KEY = "scratch"
INSTALLED_APPS = [
    "django.contrib.admin", "django.contrib.auth", "django.contrib.contenttypes",
    "django.contrib.sessions", "django.contrib.messages", {taskclaim}"shop",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
TEMPLATES = [{{
    "BACKEND": "django.template.backends.django.DjangoTemplates", "APP_DIRS": True,
    "OPTIONS": {{"context_processors": [
        "django.template.context_processors.request",
        "django.contrib.auth.context_processors.auth",
        "django.contrib.messages.context_processors.messages",
    ]}},
}}]
DATABASES = {{"default": {{
    "ENGINE": "django.db.backends.sqlite3", "NAME": {db!r},
    "OPTIONS": {{"transaction_mode": "IMMEDIATE", "timeout": 20}},
}}}}
ROOT_URLCONF = "urls"
ALLOWED_HOSTS = ["127.0.0.1"]
USE_TZ = True
"""
URLS = """
from django.contrib import admin
from django.urls import path

urlpatterns = [path("admin/", admin.site.urls)]
"""
MODELS = """
from django.db import models
from django_taskclaim.models import ClaimableModel


class Document(ClaimableModel):
    title = models.CharField(max_length=50, default="")

    class ClaimMeta:
{claim_meta}

    def process(self):
        pass
"""
#: As docs/admin.md shows it.
ADMIN = """
from django.contrib import admin
from django_taskclaim.admin import ClaimableAdminMixin

from .models import Document


@admin.register(Document)
class DocumentAdmin(ClaimableAdminMixin, admin.ModelAdmin):
    pass
"""
MANAGE = """
import os
import sys

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "settings")
from django.core.management import execute_from_command_line

execute_from_command_line(sys.argv)
"""


def scratch_project(
    where: Path, claim_meta: dict[str, str], *, installed: bool = True, admin: bool = True
) -> Path:
    (where / "shop").mkdir()
    (where / "shop" / "__init__.py").write_text("")
    options = "".join(f"        {k} = {v!r}\n" for k, v in claim_meta.items()) or "        pass\n"
    (where / "shop" / "models.py").write_text(MODELS.format(claim_meta=options))
    (where / "shop" / "admin.py").write_text(ADMIN if admin else "")
    taskclaim = '"django_taskclaim", ' if installed else ""
    db = str(where / "db.sqlite3")
    (where / "settings.py").write_text(SETTINGS.format(taskclaim=taskclaim, db=db))
    (where / "urls.py").write_text(URLS)
    (where / "manage.py").write_text(MANAGE)
    return where


def manage(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "HOME": str(project)}
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def the_one_line(done: subprocess.CompletedProcess[str]) -> str:
    """The command failed without a traceback and said what is wrong in one line naming
    the model; that line is returned."""
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    about = [line for line in done.stderr.splitlines() if "shop.Document" in line]
    assert len(about) == 1, done.stderr
    return about[0]


BAD_RATE_LIMITS = [
    ("0/s", "shop.Document.ClaimMeta.rate_limit count must be > 0, got 0"),
    ("-1/m", "shop.Document.ClaimMeta.rate_limit must be a string like '100/m'"),
    ("abc", "shop.Document.ClaimMeta.rate_limit must be a string like '100/m'"),
    ("1e9/s", "shop.Document.ClaimMeta.rate_limit must be a string like '100/m'"),
    ("10/sec", "shop.Document.ClaimMeta.rate_limit must be a string like '100/m'"),
    ("9" * 400 + "/s", "shop.Document.ClaimMeta.rate_limit count must be from 1 to 10000"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("value", "message"), BAD_RATE_LIMITS)
@pytest.mark.parametrize("admin", [True, False], ids=["admin", "no-admin"])
def test_bad_rate_limit_is_one_line_in_check(tmp_path, value, message, admin):
    project = scratch_project(tmp_path, {"rate_limit": value}, admin=admin)
    line = the_one_line(manage(project, "check"))
    assert line.startswith("shop.Document: (taskclaim.E002) ")
    assert message in line


@pytest.mark.slow
@pytest.mark.parametrize("command", [["migrate", "--noinput"], ["runserver", "--noreload"]])
def test_bad_rate_limit_stops_other_commands_in_one_line(tmp_path, command):
    project = scratch_project(tmp_path, {"rate_limit": "0/s"})
    line = the_one_line(manage(project, *command))
    assert "shop.Document.ClaimMeta.rate_limit count must be > 0" in line
    assert tables(project) == []  # migrate stopped before it created anything


def tables(project: Path) -> list[str]:
    path = project / "db.sqlite3"
    if not path.exists():
        return []
    with closing(sqlite3.connect(path)) as db:
        return [row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type='table'")]


def test_claim_meta_typo_is_one_line_with_the_admin(tmp_path):
    project = scratch_project(tmp_path, {"rate_limt": "10/s"})
    line = the_one_line(manage(project, "check"))
    assert line.startswith("shop.Document: (taskclaim.E002) ")
    assert "shop.Document.ClaimMeta has unknown option(s) rate_limt; allowed: " in line
    assert "rate_limit" in line.split("allowed: ")[1]


@pytest.mark.slow
def test_app_missing_from_installed_apps_is_one_line(tmp_path):
    project = scratch_project(tmp_path, {}, installed=False)
    line = the_one_line(manage(project, "check"))
    assert line == (
        "shop.Document: (taskclaim.E008) 'django_taskclaim' is not in INSTALLED_APPS: add "
        "it to INSTALLED_APPS (the models using django_taskclaim.models.ClaimableModel "
        "need its tables)"
    )
    assert "Lease" not in manage(project, "check").stderr


def test_a_good_project_checks_clean(tmp_path):
    """The scratch project itself is sound: the errors above are the options'."""
    done = manage(scratch_project(tmp_path, {"rate_limit": "10/s"}), "check")
    assert done.returncode == 0, done.stderr
    assert "System check identified no issues" in done.stdout
