"""Poison values at the edges of the retention API: ``taskclaim_prune --older-than`` (for
models that are pruned and models whose rows move to their archive) and the ``older_than``
of :func:`~django_taskclaim.recovery.prune.prune` /
:func:`~django_taskclaim.recovery.archive.archive_finished`.

An age no database can subtract from its clock, a negative one or one that is not a duration
is refused with one line naming the value and the bound; nothing is deleted or moved.
"""

from __future__ import annotations

import subprocess
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from django_taskclaim.config import bounds
from django_taskclaim.db import DbNow
from django_taskclaim.exceptions import ConfigurationError
from django_taskclaim.recovery.archive import archive_finished
from django_taskclaim.recovery.prune import parse_age, prune
from tests.support.archiveapp.models import Report, ReportArchive
from tests.support.helpers import PYTHON, ROOT, child_env
from tests.support.testapp.models import Document

pytestmark = pytest.mark.django_db(transaction=True)


def _old_finished_rows() -> None:
    """Two finished rows of each model, finished ten days ago (database clock)."""
    for i in range(2):
        Document.objects.create(title=f"doc {i}", status="done")
        Report.objects.create(title=f"report {i}", status="done")
    Document.objects.update(finished_at=DbNow() - timedelta(days=10))
    Report.objects.update(finished_at=DbNow() - timedelta(days=10))


def _nothing_went() -> None:
    assert Document.objects.count() == 2
    assert Report.objects.count() == 2
    assert ReportArchive.objects.count() == 0


@pytest.mark.parametrize(
    ("age", "says"),
    [
        ("99999999999d", r"--older-than '99999999999d' is out of range: at most 36500d"),
        ("99999999999w", r"--older-than '99999999999w' is out of range: at most 36500d"),
        ("1" + "0" * 400 + "s", r"is out of range: at most 36500d"),
        ("36501d", r"--older-than '36501d' is out of range: at most 36500d \(100 years\)"),
        ("-1d", r"--older-than '-1d' is not a duration"),
        ("7 days", r"--older-than '7 days' is not a duration; use a number and a unit"),
        ("7y", r"--older-than '7y' is not a duration"),
        ("7", r"--older-than '7' is not a duration"),
        ("nand", r"--older-than 'nand' is not a duration"),
        ("", r"--older-than '' is not a duration"),
    ],
)
@pytest.mark.parametrize("label", ["testapp.Document", "archiveapp.Report"])
def test_prune_command_refuses_an_age_it_cannot_use_and_touches_nothing(label, age, says):
    _old_finished_rows()
    with pytest.raises(CommandError, match=says):
        call_command("taskclaim_prune", label, f"--older-than={age}", stdout=StringIO())
    with pytest.raises(CommandError, match=says):  # every model at once: same refusal
        call_command("taskclaim_prune", f"--older-than={age}", stdout=StringIO())
    _nothing_went()


def test_prune_command_in_a_real_process_says_one_line_and_exits_1():
    _old_finished_rows()
    proc = subprocess.run(
        [PYTHON, "-m", "django", "taskclaim_prune", "--older-than", "99999999999d"],
        env=child_env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip() == (
        "CommandError: --older-than '99999999999d' is out of range: at most 36500d (100 years)"
    )
    _nothing_went()


def test_the_largest_and_the_smallest_age_work():
    _old_finished_rows()
    out = StringIO()
    call_command("taskclaim_prune", "--older-than", "36500d", stdout=out)
    assert "total: pruned 0 row(s) finished more than 36500d ago" in out.getvalue()
    _nothing_went()
    # 0 is an age like any other: every row finished before the database's now().
    call_command("taskclaim_prune", "testapp.Document", "--older-than", "0s", stdout=out)
    call_command("taskclaim_prune", "archiveapp.Report", "--older-than", "0d", stdout=out)
    assert Document.objects.count() == 0
    assert ReportArchive.objects.count() == 2


def test_parse_age_reads_every_unit_and_fractions():
    assert parse_age("90s") == timedelta(seconds=90)
    assert parse_age("1.5h") == timedelta(minutes=90)
    assert parse_age("2w") == timedelta(days=14)
    assert parse_age("36500d") == timedelta(seconds=bounds.MAX_AGE)


@pytest.mark.parametrize(
    ("older_than", "says"),
    [
        (timedelta(days=999_999_999), r"older_than must be from 0 to 36500 days, got "),
        (timedelta(days=-1), r"older_than must be from 0 to 36500 days, got "),
        (7, r"older_than must be a timedelta, got 7"),
        (float("nan"), r"older_than must be a timedelta, got nan"),
        ("7d", r"older_than must be a timedelta, got '7d'"),
    ],
)
def test_prune_and_archive_refuse_an_older_than_out_of_bounds(older_than, says):
    _old_finished_rows()
    with pytest.raises(ConfigurationError, match=says):
        prune(Document, older_than=older_than)
    with pytest.raises(ConfigurationError, match=says):
        prune(Document, older_than=older_than, dry_run=True)
    with pytest.raises(ConfigurationError, match=says):
        archive_finished(Report, older_than=older_than)
    with pytest.raises(ConfigurationError, match=says):
        archive_finished(Report, older_than=older_than, dry_run=True)
    _nothing_went()
