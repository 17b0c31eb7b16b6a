"""The race lab, run small on the test database: ours never double-claims, the broken
recipes do (on PostgreSQL), and the lab leaves its tables empty. The lab is an optional
app with its own migration: the library never imports it, and its claimable model is
left out of the project's queues by an explicit rule on its app config."""

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

from django_taskclaim.config.discovery import claimable_models, is_claimable, resolve_model
from django_taskclaim.contrib.racelab.apps import RaceLabConfig
from django_taskclaim.contrib.racelab.lab import RaceLab
from django_taskclaim.contrib.racelab.models import LAB_MODELS, LabBatchLock, LabTask
from django_taskclaim.contrib.racelab.report import format_table
from django_taskclaim.contrib.racelab.techniques import TECHNIQUES
from tests.support.helpers import ROOT

LAB_APP = "django_taskclaim.contrib.racelab"
lab_db = pytest.mark.django_db(transaction=True)

SAFE = [name for name, t in TECHNIQUES.items() if t.safe]
BROKEN = [name for name, t in TECHNIQUES.items() if not t.safe]


def _lab_rows_left() -> dict[str, int]:
    counts = {m._meta.label: m._base_manager.count() for m in LAB_MODELS}
    return {label: n for label, n in counts.items() if n}


@pytest.mark.slow
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
    assert _lab_rows_left() == {}


@pytest.mark.slow
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
    assert _lab_rows_left() == {}


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
    assert _lab_rows_left() == {}


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
def test_the_app_registers_its_models_and_migrates_their_tables():
    config = apps.get_app_config("taskclaim_racelab")
    assert LabTask._meta.app_config is config
    assert config.name == LAB_APP
    assert apps.get_model("taskclaim_racelab", "LabTask") is LabTask
    assert get_commands()["taskclaim_racelab"] == LAB_APP
    # Registered like any app's models, tables made by its migration, none missing.
    assert set(config.get_models()) == set(LAB_MODELS)
    assert set(LAB_MODELS) <= set(apps.get_models())
    tables = set(connection.introspection.table_names())
    assert {m._meta.db_table for m in LAB_MODELS} <= tables
    call_command("makemigrations", "taskclaim_racelab", check=True, dry_run=True, verbosity=0)


@lab_db  # claim() refuses to run inside the test's transaction
def test_the_lab_queue_is_left_out_of_discovery_by_its_app_config(monkeypatch):
    assert RaceLabConfig.taskclaim_discover is False
    assert is_claimable(LabTask)
    assert LabTask not in set(claimable_models())
    out = StringIO()
    call_command("taskclaim_stats", "--json", stdout=out)
    labels = [m["label"] for m in json.loads(out.getvalue())["models"]]
    assert labels, "no claimable model listed at all"
    assert "taskclaim_racelab.LabTask" not in labels
    # Named, it is an ordinary claimable model.
    assert resolve_model("taskclaim_racelab.LabTask") is LabTask
    row = LabTask.objects.create()
    [claimed] = LabTask.objects.claim(1)
    assert claimed.pk == row.pk
    # The rule is the app config's attribute, and only that.
    monkeypatch.setattr(RaceLabConfig, "taskclaim_discover", True)
    assert LabTask in set(claimable_models())


@lab_db
def test_command_names_the_migration_when_the_tables_are_missing():
    with connection.schema_editor() as editor:
        editor.delete_model(LabBatchLock)
    try:
        with pytest.raises(CommandError, match=r"run: manage\.py migrate taskclaim_racelab"):
            call_command("taskclaim_racelab", "-t", "cas", stdout=StringIO())
        assert LabTask.objects.count() == 0  # refused before anything ran
    finally:
        with connection.schema_editor() as editor:
            editor.create_model(LabBatchLock)


# Run with a settings module that leaves the lab out of INSTALLED_APPS.
WITHOUT_LAB_SETTINGS = f"""
    from tests.support.settings import *  # noqa: F403
    from tests.support.settings import INSTALLED_APPS

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


@pytest.mark.slow
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
    modules = ("worker", "model.queryset", "admin", "models", "recovery.reap", "ops.figures")
    for module in (*modules, "checks.core"):
        assert f"django_taskclaim.{module}" in report["imported"]
    assert "django_taskclaim.management.commands.worker" in report["imported"]
    assert report["loaded"] == [], "the runtime package imported the race lab"
    assert "taskclaim_worker" in report["commands"]
    assert "taskclaim_racelab" not in report["commands"]
    # The lab's models belong to the app: without it, importing them is refused (not
    # filed under the library's own app, whose package encloses the lab's).
    assert report["models_error"] == (
        f"ImproperlyConfigured: the race lab needs {LAB_APP!r} in INSTALLED_APPS "
        "(see docs/racelab.md)"
    )

    proc = python("-m", "django", "taskclaim_racelab")
    assert proc.returncode != 0
    assert "Unknown command: 'taskclaim_racelab'" in proc.stderr
