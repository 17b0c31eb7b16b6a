"""The supervisor's stop against its own restarts: real processes, real signals."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.helpers import ROOT, child_env


@pytest.mark.slow
def test_a_stop_that_comes_as_a_child_is_restarted_reaches_every_child(tmp_path):
    """SIGTERM just as the supervisor restarts a child that died: the supervisor forks no
    child the stop would not reach, and stops cleanly. (It used to fork one anyway, never
    told it to stop, and waited for it.)"""
    proc = subprocess.run(
        [sys.executable, "-m", "tests.support.supervisor_stop_race", str(tmp_path)],
        cwd=ROOT,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=45,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
    assert "restarts=0" in proc.stdout, proc.stdout


REFUSED = """
import os, sys
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.support.settings")
import django
django.setup()
from django_taskclaim.worker.supervisor import Supervisor
sup = Supervisor(lambda index: int(sys.argv[1]), 1)
code = sup.run()
print(f"restarts={sup.restarts}", flush=True)
sys.exit(code)
"""


@pytest.mark.parametrize("code", [1, 6])
def test_a_child_refused_by_its_database_is_not_restarted(code):
    """Exit 1 (a database or schema that refused the worker once it answered) and 6
    (``--burst`` gave up) end the supervisor with that code: restarting cannot help. (A
    child that exited 1 was restarted for ever, with backoff: the default worker, now
    supervised, would never have exited 1.)"""
    proc = subprocess.run(
        [sys.executable, "-c", REFUSED, str(code)],
        cwd=ROOT,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == code, proc.stdout + proc.stderr[-2000:]
    assert "restarts=0" in proc.stdout
    assert "not restarted" in proc.stderr


CRASHES_ONCE = """
import os, pathlib, sys
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.support.settings")
import django
django.setup()
from django_taskclaim.worker.supervisor import Supervisor
marker = pathlib.Path(sys.argv[1]) / "crashed"

def target(index):
    if not marker.exists():
        marker.write_text("1")
        raise RuntimeError("a bug in the worker")
    return 0

sup = Supervisor(target, 1)
code = sup.run()
print(f"restarts={sup.restarts}", flush=True)
sys.exit(code)
"""


def test_a_child_that_crashes_is_restarted(tmp_path):
    """A worker process that raises (a bug) exits 5 (broken), not 1: it is restarted."""
    proc = subprocess.run(
        [sys.executable, "-c", CRASHES_ONCE, str(tmp_path)],
        cwd=ROOT,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
    assert "restarts=1" in proc.stdout
    assert "worker process crashed" in proc.stderr
    assert "how=exit code 5" in proc.stderr
