"""Test helpers: waiting on conditions with deadlines, subprocess environments."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from django.db import connection

ROOT = Path(__file__).resolve().parent.parent


def wait_for(
    condition: Callable[[], Any],
    *,
    timeout: float = 30.0,
    interval: float = 0.02,
    what: str = "condition",
) -> Any:
    """Poll ``condition`` until it returns a truthy value or fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def simulate_work(seconds: float) -> None:
    """Stand for a task body that takes ``seconds`` (a duration, not a wait for anything);
    sliced so a signal handler runs promptly."""
    deadline = time.monotonic() + float(seconds)
    while (left := deadline - time.monotonic()) > 0:
        time.sleep(min(0.05, left))


def child_env(**extra: str) -> dict[str, str]:
    """Environment for a subprocess that must use the current test database."""
    env = dict(os.environ)
    env["TASKCLAIM_TEST_DB_NAME"] = str(connection.settings_dict["NAME"])
    env["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


PYTHON = sys.executable
