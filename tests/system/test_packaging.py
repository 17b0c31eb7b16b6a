"""The wheel, installed (no -e) into a clean virtualenv, runs a scratch Django project.

Catches what the editable install of the other tests hides: a file that is in the tree but
not in the wheel (templates, migrations, ``py.typed``), or metadata pip refuses. The
scratch project migrates, passes ``manage.py check``, drains a claimable model with
``manage.py taskclaim_worker --burst`` and renders the admin pages from the wheel's
templates. Runs once, in the SQLite pass of ``make test`` (the scratch project uses SQLite).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "django_taskclaim"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        os.environ.get("TASKCLAIM_TEST_DB") != "sqlite",
        reason="the packaging test runs once, in the SQLite pass "
        "(TASKCLAIM_TEST_DB=sqlite pytest tests/system/test_packaging.py)",
    ),
]


def run(cmd: list[str], *, cwd: Path | None = None, env: dict[str, str] | None = None, timeout=120):
    return subprocess.run(
        [str(c) for c in cmd],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def clean_env() -> dict[str, str]:
    """The environment minus everything that could point back at this checkout."""
    drop = {"PYTHONPATH", "DJANGO_SETTINGS_MODULE", "DATABASE_URL", "VIRTUAL_ENV", "PYTHONHOME"}
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("TASKCLAIM")}
    env["PYTHONNOUSERSITE"] = "1"
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def build_wheel(out: Path) -> Path:
    """Build the wheel from the working tree; else take the newest one of ``make dist``."""
    if importlib.util.find_spec("build") and importlib.util.find_spec("hatchling"):
        proc = run(
            [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", out, ROOT],
            timeout=180,
        )
        assert proc.returncode == 0, f"python -m build failed:\n{proc.stdout}\n{proc.stderr}"
        return next(out.glob("django_taskclaim-*.whl"))
    built = sorted((ROOT / "dist").glob("django_taskclaim-*.whl"), key=lambda p: p.stat().st_mtime)
    if not built:
        pytest.skip(
            "cannot build the wheel: the packages build and hatchling are not installed "
            "(they are in the tools dependency group: scripts/bootstrap.sh) and dist/ has no "
            "wheel (make dist)"
        )
    return built[-1]


def interpreter() -> str:
    """The Python the project's scripts would pick (scripts/find-python.sh), else ours."""
    proc = run([ROOT / "scripts" / "find-python.sh"])
    found = proc.stdout.strip()
    return found if proc.returncode == 0 and found else sys._base_executable


def make_venv(where: Path) -> Path:
    py = interpreter()
    proc = run([py, "-m", "venv", where], env=clean_env())
    if proc.returncode != 0:
        pytest.skip(f"cannot create a virtualenv with {py}: {proc.stderr.strip()[-300:]}")
    return where / "bin" / "python"


def pip_install(python: Path, *args: str | Path) -> subprocess.CompletedProcess[str]:
    return run([python, "-m", "pip", "install", "-q", *args], env=clean_env(), timeout=300)


SETTINGS = """
    import django

    SECRET_KEY = "scratch"
    DEBUG = False
    ALLOWED_HOSTS = ["testserver"]
    USE_TZ = True
    DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
    ROOT_URLCONF = "urls"
    STATIC_URL = "/static/"
    INSTALLED_APPS = [
        "django.contrib.admin",
        "django.contrib.auth",
        "django.contrib.contenttypes",
        "django.contrib.sessions",
        "django.contrib.messages",
        "django.contrib.staticfiles",
        "django_taskclaim",
        "scratch",
    ]
    if django.VERSION >= (6, 0):
        INSTALLED_APPS.append("django_taskclaim.contrib.tasks")
    MIDDLEWARE = [
        "django.contrib.sessions.middleware.SessionMiddleware",
        "django.middleware.common.CommonMiddleware",
        "django.middleware.csrf.CsrfViewMiddleware",
        "django.contrib.auth.middleware.AuthenticationMiddleware",
        "django.contrib.messages.middleware.MessageMiddleware",
    ]
    TEMPLATES = [
        {
            "BACKEND": "django.template.backends.django.DjangoTemplates",
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
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": "db.sqlite3",
            "OPTIONS": {"transaction_mode": "IMMEDIATE", "timeout": 20},
        }
    }
"""

MODELS = """
    from django.db import models

    from django_taskclaim.models import ClaimableModel


    class Job(ClaimableModel):
        n = models.IntegerField()
        doubled = models.IntegerField(null=True)

        def process(self):
            return {"doubled": self.n * 2}
"""

ADMIN = """
    from django.contrib import admin

    from django_taskclaim.admin import ClaimableAdminMixin

    from .models import Job


    @admin.register(Job)
    class JobAdmin(ClaimableAdminMixin, admin.ModelAdmin):
        list_display = ["n"]
"""

URLS = """
    from django.contrib import admin
    from django.urls import path

    urlpatterns = [path("admin/", admin.site.urls)]
"""

MANAGE = """
    import os
    import sys

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
"""

# Where the package came from, its migrations, the drained rows and the admin pages.
REPORT = """
    import json

    import django_taskclaim
    from django.contrib.auth import get_user_model
    from django.db.migrations.loader import MigrationLoader
    from django.db import connection
    from django.test import Client
    from django.test.utils import setup_test_environment
    from django.urls import reverse
    from scratch.models import Job

    setup_test_environment()  # records the templates each response rendered
    loader = MigrationLoader(connection)
    user = get_user_model().objects.create_superuser("root", "root@example.com", "pw")
    client = Client()
    client.force_login(user)
    pages = {}
    for name in ("admin:scratch_job_changelist", "admin:taskclaim_dashboard"):
        response = client.get(reverse(name))
        pages[name] = [response.status_code, [t.name for t in response.templates]]
    response = client.get("/admin/taskclaim/")
    pages["app_index"] = [response.status_code, [t.name for t in response.templates]]
    print(json.dumps({
        "file": django_taskclaim.__file__,
        "applied": sorted(f"{a}.{n}" for a, n in loader.applied_migrations),
        "jobs": sorted(Job.objects.values_list("status", "doubled")),
        "pages": pages,
    }))
"""


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip())


def package_files() -> set[str]:
    """Every file of the package in the tree, as a wheel path (caches left out)."""
    return {
        p.relative_to(ROOT).as_posix()
        for p in PACKAGE.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix not in (".pyc", ".pyo")
    }


def test_wheel_in_a_clean_virtualenv_runs_a_scratch_project(tmp_path):
    wheel = build_wheel(tmp_path / "dist")
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = sorted(package_files() - names)
    assert not missing, f"files of django_taskclaim/ missing from {wheel.name}: {missing}"

    python = make_venv(tmp_path / "venv")
    # The wheel alone first (no index needed): a broken wheel fails here, not as a skip.
    proc = pip_install(python, "--no-deps", wheel)
    assert proc.returncode == 0, f"pip refused {wheel.name}:\n{proc.stdout}\n{proc.stderr}"
    proc = pip_install(python, wheel)
    if proc.returncode != 0:
        pytest.skip(
            "cannot install the wheel's dependencies (Django) into a clean virtualenv: no "
            "network and no local wheel of them? pip said: " + proc.stderr.strip()[-400:]
        )

    project = tmp_path / "project"
    write(project / "settings.py", SETTINGS)
    write(project / "urls.py", URLS)
    write(project / "manage.py", MANAGE)
    write(project / "scratch" / "__init__.py", "")
    write(project / "scratch" / "models.py", MODELS)
    write(project / "scratch" / "admin.py", ADMIN)

    def manage(*args: str, timeout: float = 120) -> str:
        proc = run([python, "manage.py", *args], cwd=project, env=clean_env(), timeout=timeout)
        assert proc.returncode == 0, f"manage.py {' '.join(args)}:\n{proc.stdout}\n{proc.stderr}"
        return proc.stdout

    manage("check", "--fail-level", "WARNING")  # taskclaim.W002 would fail it
    manage("makemigrations", "scratch")
    manage("migrate")
    manage(
        "shell",
        "-c",
        "from scratch.models import Job; Job.objects.bulk_create(Job(n=i) for i in range(5))",
    )
    manage("taskclaim_worker", "scratch.Job", "--burst", timeout=60)
    report = json.loads(manage("shell", "-c", textwrap.dedent(REPORT)).strip().splitlines()[-1])

    site = tmp_path / "venv" / "lib"
    assert Path(report["file"]).is_relative_to(site), (
        f"imported from {report['file']}, not the venv"
    )
    applied = set(report["applied"])
    for mig in sorted((PACKAGE / "migrations").glob("0*.py")):
        assert f"taskclaim.{mig.stem}" in applied
    if any(a.startswith("taskclaim_tasks.") for a in applied):  # Django 6.0+: contrib.tasks
        for mig in sorted((PACKAGE / "contrib" / "tasks" / "migrations").glob("0*.py")):
            assert f"taskclaim_tasks.{mig.stem}" in applied
    assert report["jobs"] == [["done", 2 * i] for i in range(5)]
    for name, (status, templates) in report["pages"].items():
        assert status == 200, f"{name}: HTTP {status}"
        assert any(t.startswith(("django_taskclaim/", "admin/taskclaim/")) for t in templates), (
            f"{name} rendered none of the package's templates: {templates}"
        )
