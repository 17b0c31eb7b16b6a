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
