"""``taskclaim_stats`` and ``taskclaim_prune`` on real rows, and their argument errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from django_taskclaim.db import DbNow
from django_taskclaim.models import WorkerProcess
from django_taskclaim.recovery.prune import prune
from tests.support.helpers import child_env
from tests.support.testapp.models import Document, Job


def run(*args: str) -> str:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def seed() -> None:
    docs = Document.objects.bulk_create([Document(title=f"d{i}") for i in range(10)])
    pk = [d.pk for d in docs]
    Document.objects.filter(pk__in=pk[:3]).update(status="done", finished_at=DbNow())
    Document.objects.filter(pk__in=pk[3:5]).update(
        status="done", finished_at=DbNow() - timedelta(days=10)
    )
    Document.objects.filter(pk=pk[5]).update(
        status="failed", finished_at=DbNow() - timedelta(days=10)
    )
    Document.objects.filter(pk=pk[6]).update(
        status="cancelled", finished_at=DbNow() - timedelta(days=10)
    )
    Document.objects.filter(pk=pk[7]).update(
        status="processing", locked_until=DbNow() - timedelta(seconds=1), locked_by="w"
    )
    Job.objects.create(name="j")


@pytest.mark.django_db
def test_stats_text():
    seed()
    WorkerProcess.objects.create(worker_id="host:1", hostname="host", pid=1, processed=3)
    out = run("taskclaim_stats")
    lines = {line.split()[0]: line.split() for line in out.splitlines() if line.strip()}
    header = lines["model"]
    doc = dict(zip(header, lines["testapp.Document"], strict=False))
    assert (doc["ready"], doc["processing"], doc["done"], doc["failed"], doc["cancelled"]) == (
        "2",
        "1",
        "5",
        "1",
        "1",
    )
    assert (doc["expired"], doc["done_5m"], doc["done_60m"], doc["total"]) == ("1", "3", "3", "10")
    job = dict(zip(header, lines["testapp.Job"], strict=False))
    assert (job["ready"], job["cancelled"], job["done_5m"]) == ("1", "-", "-")
    assert "live workers: 1" in out
    assert "host:1" in out


@pytest.mark.django_db
def test_stats_json_one_model():
    seed()
    data = json.loads(run("taskclaim_stats", "testapp.Document", "--json"))
    assert [m["label"] for m in data["models"]] == ["testapp.Document"]
    (doc,) = data["models"]
    assert doc["counts"] == {
        "ready": 2,
        "processing": 1,
        "done": 5,
        "failed": 1,
        "cancelled": 1,
        "waiting": 0,
    }
    assert doc["expired"] == 1
    assert doc["done_last"] == {"5m": 3, "60m": 3}
    assert doc["oldest_ready_age"] is not None
    assert doc["oldest_ready_age"] >= 0
    assert data["workers"] == []


@pytest.mark.django_db
def test_stats_count_rows_with_an_unmapped_status_as_unknown():
    """The counts per state add up to the total: a status no state maps is "unknown"."""
    seed()
    Document.objects.filter(title="d9").update(status="legacy")
    data = json.loads(run("taskclaim_stats", "testapp.Document", "--json"))
    (doc,) = data["models"]
    assert doc["counts"] == {
        "ready": 1,
        "processing": 1,
        "done": 5,
        "failed": 1,
        "cancelled": 1,
        "waiting": 0,
        "unknown": 1,
    }
    assert doc["total"] == 10


def test_stats_text_works_without_the_admin_app(transactional_db, tmp_path):
    """``taskclaim_stats`` needs no ``django.contrib.admin`` in ``INSTALLED_APPS``."""
    (tmp_path / "no_admin_settings.py").write_text(
        textwrap.dedent(
            """
            from tests.support.settings import *
            from tests.support.settings import INSTALLED_APPS as ALL_APPS

            INSTALLED_APPS = [a for a in ALL_APPS if a != "django.contrib.admin"]
            ROOT_URLCONF = "no_admin_settings"
            urlpatterns = []
            """
        )
    )
    env = child_env(DJANGO_SETTINGS_MODULE="no_admin_settings")
    env["PYTHONPATH"] = str(tmp_path) + os.pathsep + env["PYTHONPATH"]
    proc = subprocess.run(
        [sys.executable, "-m", "django", "taskclaim_stats", "testapp.Document"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "testapp.Document" in proc.stdout
    assert "live workers: 0" in proc.stdout


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("nope.Model",), "no model 'nope.Model' is installed"),
        (("notalabel",), "is not a model label"),
        (("--database", "other"), "unknown database alias 'other'"),
    ],
)
def test_stats_bad_arguments(args, message):
    with pytest.raises(CommandError, match=message):
        run("taskclaim_stats", *args)


@pytest.mark.django_db
def test_prune_dry_run_then_delete():
    seed()
    out = run("taskclaim_prune", "--older-than", "7d", "--dry-run")
    assert "testapp.Document: would delete 3 row(s)" in out  # 2 done + 1 cancelled, old
    assert "testapp.Job: skipped (no finished_at field)" in out
    assert Document.objects.count() == 10
    out = run("taskclaim_prune", "testapp.Document", "--older-than", "7d", "--batch-size", "1")
    assert "testapp.Document: deleted 3 row(s)" in out
    assert Document.objects.count() == 7
    assert Document.objects.filter(status="failed").count() == 1  # failed kept by default
    assert Document.objects.filter(status="done").count() == 3  # recent ones kept
    out = run("taskclaim_prune", "testapp.Document", "--older-than", "1d", "--states", "failed")
    assert "deleted 1 row(s)" in out


@pytest.mark.django_db
def test_prune_batches_are_bounded_and_recheck_state():
    docs = Document.objects.bulk_create([Document(title=f"d{i}") for i in range(25)])
    Document.objects.filter(pk__in=[d.pk for d in docs]).update(
        status="done", finished_at=DbNow() - timedelta(days=3)
    )
    deleted = prune(Document, older_than=timedelta(days=1), batch_size=10, max_batches=1)
    assert deleted == 10
    assert Document.objects.count() == 15
    # a row requeued meanwhile is not finished any more: it is kept
    Document.objects.filter(pk=docs[-1].pk).requeue()
    assert prune(Document, older_than=timedelta(days=1), batch_size=10) == 14
    assert list(Document.objects.values_list("pk", flat=True)) == [docs[-1].pk]


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--older-than", "seven days"), "is not a duration"),
        (("--older-than", "7"), "is not a duration"),
        (("--older-than", "7d", "--states", "ready"), "only finished states can be pruned"),
        (("--older-than", "7d", "--batch-size", "0"), "--batch-size must be > 0"),
        (("--older-than", "7d", "--batch-size", "1e20"), "--batch-size must be a whole number"),
        (("testapp.Job", "--older-than", "7d"), "testapp.Job has no finished_at field"),
        (("testapp.Nope", "--older-than", "7d"), "no model 'testapp.Nope' is installed"),
        (("testapp.Document", "--older-than", "7d", "--database", "x"), "unknown database"),
    ],
)
def test_prune_bad_arguments(args, message):
    Document.objects.create(title="keep")
    with pytest.raises(CommandError, match=message):
        run("taskclaim_prune", *args)
    assert Document.objects.count() == 1


def test_prune_requires_older_than():
    with pytest.raises(CommandError, match="--older-than"):
        run("taskclaim_prune")
