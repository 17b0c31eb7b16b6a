"""The race lab, run small on the test database: ours never double-claims, the broken
recipes do (on PostgreSQL), and the lab leaves no scratch table behind."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import connection

from django_taskclaim.racelab import SCRATCH_MODELS, TECHNIQUES, RaceLab, format_table

pytestmark = pytest.mark.django_db(transaction=True)

SAFE = [name for name, t in TECHNIQUES.items() if t.safe]
BROKEN = [name for name, t in TECHNIQUES.items() if not t.safe]


def _scratch_tables_left() -> set[str]:
    names = {m._meta.db_table for m in SCRATCH_MODELS}
    return names & set(connection.introspection.table_names())


def test_safe_techniques_never_double_claim(vendor):
    lab = RaceLab(processes=3, rows=150, batch=2, timeout=90)
    results = lab.run(SAFE)
    assert [r.technique for r in results] == SAFE
    ran = [r for r in results if not r.skipped]
    assert ran, "no technique ran"
    for r in ran:
        assert not r.errors, (r.technique, r.errors)
        assert r.double_claims == 0, r
        assert r.never_claimed == 0, r
        assert r.claims == 150, r
        assert r.lost == 0, r
    skipped = {r.technique for r in results if r.skipped}
    if vendor == "postgresql":
        assert skipped == set()
    else:
        assert {"advisory", "serializable", "hold"} <= skipped
        assert "cas" not in skipped
    assert _scratch_tables_left() == set()


def test_broken_recipes_double_claim_on_postgresql(vendor):
    # A 2 ms pause between the recipe's read and its write stands for application code;
    # it makes the race show up every run instead of most runs.
    lab = RaceLab(processes=3, rows=150, window=0.002, timeout=90)
    results = lab.run(BROKEN)
    for r in results:
        assert not r.skipped, r
        assert not r.errors, r
        assert r.never_claimed == 0, r
        assert r.claims == 150 + r.double_claims, r
    if vendor == "postgresql":
        assert all(r.double_claims > 0 for r in results), [
            (r.technique, r.double_claims) for r in results
        ]
        assert all(r.verdict == "UNSAFE (expected)" for r in results)
    else:
        # SQLite serialises writers, so the write-skew recipe may see no race there;
        # the recipe without any condition still double-claims everywhere.
        by_name = {r.technique: r for r in results}
        assert by_name["broken: SELECT then UPDATE"].double_claims > 0
    table = format_table(results)
    assert "double claims" in table.splitlines()[0]
    assert _scratch_tables_left() == set()


def test_command_prints_json_and_table(vendor):
    out = StringIO()
    call_command(
        "taskclaim_racelab",
        "-n",
        "2",
        "-m",
        "40",
        "-t",
        "cas",
        "-t",
        "broken-select-update",
        "--window-ms",
        "1",
        "--json",
        stdout=out,
    )
    data = json.loads(out.getvalue())
    assert [d["technique"] for d in data] == ["cas", "broken: SELECT then UPDATE"]
    assert data[0]["double_claims"] == 0
    assert data[0]["claims"] == 40
    assert data[0]["verdict"] == "ok"
    out = StringIO()
    call_command("taskclaim_racelab", "-n", "2", "-m", "20", "-t", "advisory", stdout=out)
    text = out.getvalue()
    assert "advisory" in text
    if vendor != "postgresql":
        assert "skipped: strategy 'advisory' is not supported" in text
    assert _scratch_tables_left() == set()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["-n", "0"], "--processes must be at least 1"),
        (["-t", "nope"], "unknown technique 'nope'"),
        (["--database", "other"], "unknown database 'other'"),
        (["--window-ms", "-1"], "--window-ms must be >= 0"),
    ],
)
def test_command_rejects_bad_input(argv, message):
    with pytest.raises(CommandError, match=message):
        call_command("taskclaim_racelab", *argv, stdout=StringIO())
