"""The race lab, run small on the test database: ours never double-claims, the broken
recipes do (on PostgreSQL), and the lab leaves no scratch table behind. The lab is an
optional app: the library never imports it, and its models stay out of the project."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from io import StringIO

import pytest
from django.apps import apps
from django.core.management import CommandError, call_command, get_commands
from django.db import connection

from django_taskclaim.contrib.racelab.lab import RaceLab
from django_taskclaim.contrib.racelab.models import SCRATCH_MODELS, LabTask
from django_taskclaim.contrib.racelab.report import format_table
from django_taskclaim.contrib.racelab.techniques import TECHNIQUES
from django_taskclaim.options import claimable_models
from tests.helpers import ROOT

LAB_APP = "django_taskclaim.contrib.racelab"
lab_db = pytest.mark.django_db(transaction=True)

SAFE = [name for name, t in TECHNIQUES.items() if t.safe]
BROKEN = [name for name, t in TECHNIQUES.items() if not t.safe]


def _scratch_tables_left() -> set[str]:
    names = {m._meta.db_table for m in SCRATCH_MODELS}
    return names & set(connection.introspection.table_names())


@lab_db
def test_safe_techniques_never_double_claim(vendor):
    lab = RaceLab(processes=3, rows=150, batch=2, timeout=90)
    results = lab.run(SAFE)
    assert [r.technique for r in results] == SAFE
    ran = [r for r in results if not r.skipped]
    assert ran, "no technique ran"
    for r in ran:
        assert not r.errors, (r.technique, r.errors)
        assert r.double_claims == 0, r
        assert r.never_claimed == 0, r
        assert r.claims == 150, r
        assert r.lost == 0, r
    skipped = {r.technique for r in results if r.skipped}
    if vendor == "postgresql":
        assert skipped == set()
    else:
        assert {"advisory", "serializable", "hold"} <= skipped
        assert "cas" not in skipped
    assert _scratch_tables_left() == set()


@lab_db
def test_broken_recipes_double_claim_on_postgresql(vendor):
    # A 2 ms pause between the recipe's read and its write stands for application code;
    # it makes the race show up every run instead of most runs.
    lab = RaceLab(processes=3, rows=150, window=0.002, timeout=90)
    results = lab.run(BROKEN)
    for r in results:
        assert not r.skipped, r
        assert not r.errors, r
        assert r.never_claimed == 0, r
        assert r.claims == 150 + r.double_claims, r
    if vendor == "postgresql":
        assert all(r.double_claims > 0 for r in results), [
            (r.technique, r.double_claims) for r in results
        ]
        assert all(r.verdict == "UNSAFE (expected)" for r in results)
    else:
        # SQLite serialises writers, so the write-skew recipe may see no race there;
        # the recipe without any condition still double-claims everywhere.
        by_name = {r.technique: r for r in results}
        assert by_name["broken: SELECT then UPDATE"].double_claims > 0
    table = format_table(results)
    assert "double claims" in table.splitlines()[0]
    assert _scratch_tables_left() == set()


@lab_db
def test_command_prints_json_and_table(vendor):
    out = StringIO()
    call_command(
        "taskclaim_racelab",
        "-n",
        "2",
        "-m",
        "40",
        "-t",
        "cas",
        "-t",
        "broken-select-update",
        "--window-ms",
        "1",
        "--json",
        stdout=out,
    )
    data = json.loads(out.getvalue())
    assert [d["technique"] for d in data] == ["cas", "broken: SELECT then UPDATE"]
    assert data[0]["double_claims"] == 0
    assert data[0]["claims"] == 40
    assert data[0]["verdict"] == "ok"
    out = StringIO()
    call_command("taskclaim_racelab", "-n", "2", "-m", "20", "-t", "advisory", stdout=out)
    text = out.getvalue()
    assert "advisory" in text
    if vendor != "postgresql":
        assert "skipped: strategy 'advisory' is not supported" in text
    assert _scratch_tables_left() == set()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["-n", "0"], "--processes must be at least 1"),
        (["-t", "nope"], "unknown technique 'nope'"),
        (["--database", "other"], "unknown database 'other'"),
        (["--window-ms", "-1"], "--window-ms must be >= 0"),
    ],
)
def test_command_rejects_bad_input(argv, message):
    with pytest.raises(CommandError, match=message):
        call_command("taskclaim_racelab", *argv, stdout=StringIO())


@pytest.mark.django_db  # makemigrations --check reads the applied migrations
def test_the_app_registers_the_scratch_models_and_keeps_them_out_of_the_project():
    assert LabTask._meta.app_config is apps.get_app_config("taskclaim_racelab")
    assert LabTask._meta.app_config.name == LAB_APP
    assert apps.get_model("taskclaim_racelab", "LabTask") is LabTask
    assert get_commands()["taskclaim_racelab"] == LAB_APP
    # Their tables exist only during a run: nothing that lists the project's models
    # (dashboard, taskclaim_stats/reap/prune, worker, checks, migrations) sees them.
    listed = set(apps.get_models(include_auto_created=True, include_swapped=True))
    assert not listed & set(SCRATCH_MODELS)
    assert not set(claimable_models()) & set(SCRATCH_MODELS)
    # No migration is needed, and none would be written.
    call_command("makemigrations", "taskclaim_racelab", check=True, dry_run=True, verbosity=0)


# Run with a settings module that leaves the lab out of INSTALLED_APPS.
WITHOUT_LAB_SETTINGS = f"""
    from tests.settings import *  # noqa: F403
    from tests.settings import INSTALLED_APPS

    INSTALLED_APPS = [a for a in INSTALLED_APPS if a != {LAB_APP!r}]
"""

# Imports every module of the package outside contrib/, then says what got loaded.
IMPORT_EVERYTHING = """
    import importlib, json, pathlib, sys

    import django

    django.setup()
    import django_taskclaim
    from django.core.management import get_commands

    root = pathlib.Path(django_taskclaim.__file__).parent
    imported = []
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        if "contrib" in parts:
            continue
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        importlib.import_module(name)
        imported.append(name)
    loaded = sorted(m for m in sys.modules if m.startswith("django_taskclaim.contrib.racelab"))
    try:
        importlib.import_module("django_taskclaim.contrib.racelab.models")
        models_error = ""
    except Exception as exc:
        models_error = f"{type(exc).__name__}: {exc}"
    print(json.dumps({
        "imported": imported,
        "loaded": loaded,
        "commands": sorted(c for c in get_commands() if c.startswith("taskclaim")),
        "models_error": models_error,
    }))
"""


def test_the_library_works_without_the_lab_app(tmp_path):
    (tmp_path / "without_lab.py").write_text(textwrap.dedent(WITHOUT_LAB_SETTINGS))
    env = dict(os.environ)
    env["DJANGO_SETTINGS_MODULE"] = "without_lab"
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(ROOT), env.get("PYTHONPATH", "")])

    def python(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, *args],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    proc = python("-c", textwrap.dedent(IMPORT_EVERYTHING))
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    for module in ("worker", "querysets", "admin", "models", "reaper", "monitoring", "checks"):
        assert f"django_taskclaim.{module}" in report["imported"]
    assert "django_taskclaim.management.commands.taskclaim_worker" in report["imported"]
    assert report["loaded"] == [], "the runtime package imported the race lab"
    assert "taskclaim_worker" in report["commands"]
    assert "taskclaim_racelab" not in report["commands"]
    # The scratch models are registered by the app only, never by an import.
    assert report["models_error"] == (
        f"ImproperlyConfigured: the race lab needs {LAB_APP!r} in INSTALLED_APPS "
        "(see docs/racelab.md)"
    )

    proc = python("-m", "django", "taskclaim_racelab")
    assert proc.returncode != 0
    assert "Unknown command: 'taskclaim_racelab'" in proc.stderr
