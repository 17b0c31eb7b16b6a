"""DB CLOCK: a process whose clock is skewed by ±1 h behaves identically, because all
lease and schedule arithmetic happens in SQL on the database's clock."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
from django.db import connection

from django_taskclaim.db import DbNow
from tests.support.helpers import PYTHON, ROOT, child_env
from tests.support.testapp.models import Document

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize("offset", ["+1h", "-1h", "+0"])
def test_skewed_worker_clock_has_no_effect(offset):
    if connection.vendor == "sqlite":
        pytest.skip(
            "SQLite runs inside the worker process, so its clock is that process's clock; "
            "SQLite workers share one machine and one kernel clock"
        )
    faketime = shutil.which("faketime")
    if not faketime:
        pytest.skip("faketime is not installed (apt-get install faketime)")
    Document.objects.bulk_create([Document(title=str(i)) for i in range(3)])
    out = subprocess.run(
        [faketime, "-f", offset, PYTHON, "-m", "tests.support.clock_proc"],
        env=child_env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    expected_skew = {"+1h": 3600, "-1h": -3600, "+0": 0}[offset]
    assert abs(result["skew"] - expected_skew) < 120, "the child's clock was not skewed"
    assert result["reaped"] == 0  # nothing the child claimed looked expired to it
    rows = {d.pk: d for d in Document.objects.annotate(now=DbNow())}
    a, b, c = (rows[pk] for pk in result["claimed"])
    assert 100 < (a.locked_until - a.now).total_seconds() <= 120
    assert b.status == "ready"
    assert 50 < (b.run_after - b.now).total_seconds() <= 60
    assert 20 < (c.locked_until - c.now).total_seconds() <= 30


@pytest.mark.parametrize("zone", ["+05:00", "-07:00"])
def test_mysql_session_time_zone_never_moves_leases_or_schedules(zone):
    """MySQL/MariaDB ``NOW()`` follows the session's ``time_zone``; the library's clock is
    ``UTC_TIMESTAMP(6)``, so a session in another zone writes the same instants."""
    from datetime import timedelta

    from django.db import connections
    from django.utils import timezone

    from django_taskclaim import reap

    if connection.vendor != "mysql":
        pytest.skip("session time zones are a MySQL/MariaDB matter")
    doc = Document.objects.create(title="zoned")
    with connection.cursor() as cursor:
        cursor.execute("SET time_zone = %s", [zone])
    try:
        before = timezone.now()
        (row,) = Document.objects.claim(1, lease=60)
        row.refresh_from_db()
        assert before + timedelta(seconds=30) < row.locked_until < before + timedelta(seconds=90)
        assert reap(Document).total == 0  # the valid lease is not "expired" in this zone
        row.retry(delay=3600)
        row.refresh_from_db()
        assert before + timedelta(minutes=59) < row.run_after < before + timedelta(minutes=61)
        assert Document.objects.claim(1) == []  # not due in any zone
    finally:
        connections["default"].close()  # the next test gets a fresh session
    assert Document.objects.get(pk=doc.pk).status == "ready"
