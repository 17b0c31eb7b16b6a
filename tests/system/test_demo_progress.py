"""The demo's progress line (``make demo``): full at the end, failed rows counting as
finished, and saying what it waits for while every open row waits for a retry.

Runs the example project on a SQLite file of its own (``DATABASE_URL``), so it needs no
server: the line's pieces in ``manage.py shell``, then ``scripts/demo.sh`` end to end.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(
    os.environ.get("TASKCLAIM_TEST_DB", "postgres") != "sqlite",
    reason="runs the example project on a SQLite file of its own: once, in the SQLite pass",
)

ROOT = Path(__file__).resolve().parents[2]
MANAGE = ROOT / "example_project" / "manage.py"


@pytest.fixture
def project_env(tmp_path: Path) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k
        not in ("DATABASE_URL", "DJANGO_SETTINGS_MODULE", "TASKCLAIM_TEST_DB_NAME", "PYTHONPATH")
    }
    env.update(
        DATABASE_URL=f"sqlite:///{tmp_path / 'demo.sqlite3'}",
        DEMO_VAR_DIR=str(tmp_path / "var"),
        DEMO_VENV=str(Path(sys.executable).parent.parent),
        DEMO_ADMIN_PASSWORD="demo-test-pw",
    )
    return env


PIECES = """
from datetime import timedelta
import io, time
from django.core.management import call_command
from django_taskclaim.db import DbNow
from documents.demo import Demo, DemoOptions
from documents.models import Document
from documents.seeding import seed

call_command("migrate", interactive=False, verbosity=0)
demo = Demo(DemoOptions(), io.StringIO())
started = time.monotonic()
# Rounding: 801 done + 199 failed of 1000 fills the bar (it once ended one short).
print("full:", demo.bar({"done": 801, "failed": 199}, 1000, started))
print("half:", demo.bar({"done": 10, "failed": 5}, 30, started))
seed(5, batch="b", seconds=0, fail_rate=0)
pks = list(Document.objects.filter(batch="b").order_by("pk").values_list("pk", flat=True))
Document.objects.filter(pk__in=pks[:2]).update(status="failed", attempts=3)
Document.objects.filter(pk=pks[2]).update(status="done", attempts=1)
Document.objects.filter(pk__in=pks[3:]).update(
    attempts=1, run_after=DbNow() + timedelta(seconds=30)
)
print("waiting:", demo.status_line("b", 5, started)[0])
Document.objects.filter(pk=pks[3]).update(run_after=DbNow() - timedelta(seconds=1))
print("due:", demo.status_line("b", 5, started)[0])
"""


def shell(env: dict[str, str], code: str) -> dict[str, str]:
    proc = subprocess.run(
        [sys.executable, str(MANAGE), "shell", "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return dict(line.split(": ", 1) for line in proc.stdout.splitlines() if ": " in line)


def test_the_bar_counts_failed_rows_as_finished_and_says_what_it_waits_for(project_env):
    seen = shell(project_env, PIECES)
    assert seen["full"].startswith("[" + "#" * 24 + "x" * 6 + "] 1000/1000 ")
    assert seen["half"].startswith("[" + "#" * 10 + "x" * 5 + "." * 15 + "] 15/30 ")
    # Two failed, one done, two waiting 30 s for their retry: nothing can be claimed.
    waiting = seen["waiting"]
    assert waiting.startswith("[" + "#" * 6 + "x" * 12 + "." * 12 + "] 3/5 "), waiting
    match = re.search(r"waiting for 2 retries due in (\d+\.\d) s$", waiting)
    assert match, waiting
    assert 25 < float(match.group(1)) <= 30
    # One of them is due: the workers have work, nothing is said about waiting.
    assert "waiting" not in seen["due"]


@pytest.mark.slow
def test_the_demo_ends_with_a_full_bar_when_every_attempt_fails(project_env):
    project_env.update(
        DEMO_DOCS="8",
        DEMO_JOBS="2",
        DEMO_WORKERS="1",
        DEMO_CONCURRENCY="2",
        DEMO_WORK_SECONDS="0",
        DEMO_FAIL_RATE="1",
        DEMO_TIMEOUT="120",
    )
    proc = subprocess.run(
        [str(ROOT / "scripts" / "demo.sh")],
        env=project_env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    progress = [line for line in proc.stdout.splitlines() if line.startswith("[")]
    assert progress[-1].startswith("[" + "x" * 30 + "] 8/8  done 0  failed 8 "), progress
    # Before the first claim (the worker still loads Django), the line says so instead
    # of a silent "0/8  processing 0"; it stops saying it once rows are taken.
    assert progress[0].startswith("[" + "." * 30 + "] 0/8 "), progress
    assert progress[0].endswith("  starting 1 worker (loading Django, connecting)…"), progress
    assert "starting 1 worker" not in progress[-1]
    assert "drained     yes" in proc.stdout
    assert "MariaDB" not in proc.stderr, proc.stderr
