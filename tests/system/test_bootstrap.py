"""``scripts/bootstrap.sh``: ``make demo`` (``BOOTSTRAP_FOR=demo``) installs the same
virtualenv as ``make test`` but does not print the lines that matter only to the tests
(the MariaDB client headers and mysqlclient).

The virtualenv is a stand-in whose ``python`` runs this one, answers ``pip install`` at
once and has no ``MySQLdb``: what is checked is which lines the script prints and the
stamp it leaves, not pip.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BOOTSTRAP = ROOT / "scripts" / "bootstrap.sh"
MARIADB_LINE = "no MariaDB client headers, so no mysqlclient"


@pytest.fixture
def venv(tmp_path: Path) -> Path:
    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    python = bin_dir / "python"
    python.write_text(
        "#!/bin/sh\n"
        'case "$*" in\n'
        '  *"-m pip install"*) exit 0 ;;\n'
        '  *"import MySQLdb"*) exit 1 ;;\n'
        "esac\n"
        f'exec {sys.executable} "$@"\n'
    )
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    return tmp_path / "venv"


def bootstrap(venv: Path, **env: str) -> subprocess.CompletedProcess[str]:
    # PKG_CONFIG_LIBDIR hides the MariaDB client headers wherever they are installed.
    full = {k: v for k, v in os.environ.items() if k != "BOOTSTRAP_FOR"}
    full.update(PKG_CONFIG_LIBDIR="/nonexistent", **env)
    return subprocess.run(
        [str(BOOTSTRAP), str(venv)], env=full, capture_output=True, text=True, timeout=120
    )


def test_make_test_is_told_about_the_mariadb_headers(venv):
    proc = bootstrap(venv)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(venv)
    assert MARIADB_LINE in proc.stderr


def test_make_demo_installs_the_same_without_the_mariadb_line(venv):
    proc = bootstrap(venv, BOOTSTRAP_FOR="demo")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(venv)
    assert "MariaDB" not in proc.stderr, proc.stderr
    assert "mysqlclient" not in proc.stderr, proc.stderr
    assert "installing the project" in proc.stderr  # what it does is still said
    stamp = (venv / ".taskclaim-installed").read_text()
    # The same stamp as make test's: the next `make test` does not reinstall.
    (venv / ".taskclaim-installed").unlink()
    bootstrap(venv)
    assert (venv / ".taskclaim-installed").read_text() == stamp


@pytest.mark.parametrize("url", ["foo", "postgres//x"])
def test_make_demo_with_a_malformed_database_url_says_so_in_one_line(venv, url):
    # scripts/demo.sh is what `make demo` runs: its bootstrap is the quiet one, and the
    # example project's settings refuse the URL in one line (not KeyError: 'ENGINE').
    env = {k: v for k, v in os.environ.items() if k not in ("DJANGO_SETTINGS_MODULE", "PYTHONPATH")}
    env.update(PKG_CONFIG_LIBDIR="/nonexistent", DEMO_VENV=str(venv), DATABASE_URL=url)
    proc = subprocess.run(
        [str(ROOT / "scripts" / "demo.sh")], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
    assert "MariaDB" not in proc.stderr, proc.stderr
    assert lines[-1].startswith(f"example_project: DATABASE_URL={url!r} "), lines
    assert "is not a database URL" in lines[-1]
    assert "Traceback" not in proc.stderr, proc.stderr
    assert "KeyError" not in proc.stderr, proc.stderr
