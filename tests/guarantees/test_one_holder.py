"""ONE HOLDER: many OS processes claim concurrently; every row is claimed exactly once.

The same harness runs two well-known broken recipes and shows their double claims, so
the harness itself is proven able to fail.
"""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from pathlib import Path

import pytest
from django.db import connection

from tests.support.helpers import PYTHON, ROOT, child_env
from tests.support.testapp.models import Document, Job

PROCESSES = 8
ROWS = 2000  # 8 claimers × batches of up to 10: 25+ claims each, all overlapping


def _strategies() -> list[str]:
    from django_taskclaim.claim import STRATEGIES

    return [name for name, s in STRATEGIES.items() if s.supported("default")]


def run_claimers(
    tmp_path: Path,
    *,
    strategy="auto",
    recipe="",
    model="Document",
    batch_max=10,
    extra=(),
    env=None,
    processes=PROCESSES,
):
    go = tmp_path / "go"
    procs, outs = [], []
    for i in range(processes):
        out = tmp_path / f"out{i}.jsonl"
        outs.append(out)
        cmd = [
            PYTHON,
            "-m",
            "tests.support.claimer_proc",
            "--go",
            str(go),
            "--out",
            str(out),
            "--strategy",
            strategy,
            "--model",
            model,
            "--batch-max",
            str(batch_max),
        ]
        if recipe:
            cmd += ["--recipe", recipe]
        cmd += list(extra)
        procs.append(subprocess.Popen(cmd, env=env or child_env(), cwd=ROOT))
    go.write_text("go")
    for p in procs:
        assert p.wait(timeout=300) == 0, "a claimer process failed"
    claims, errors = [], 0
    for out in outs:
        for line in out.read_text().splitlines():
            rec = json.loads(line)
            if "errors" in rec:
                errors += rec["errors"]
            else:
                claims.append(rec)
    return claims, errors


def strategy_params():
    # Collected before the database exists: list every strategy, skip per vendor at run time.
    return ["skip_locked", "cas", "advisory", "serializable", "hold"]


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("strategy", strategy_params())
def test_every_row_claimed_exactly_once(tmp_path, strategy):
    if strategy not in _strategies():
        pytest.skip(f"strategy {strategy} is not supported on {connection.vendor}")
    Document.objects.bulk_create([Document(title=str(i)) for i in range(ROWS)], batch_size=1000)
    claims, _errors = run_claimers(tmp_path, strategy=strategy)
    oversized = [c for c in claims if c["got"] > c["n"]]
    assert not oversized, f"a claim returned more rows than asked: {oversized[:3]}"
    counts = Counter(c["pk"] for c in claims)
    doubles = {pk: k for pk, k in counts.items() if k > 1}
    assert not doubles, f"{len(doubles)} rows claimed twice, e.g. {list(doubles.items())[:5]}"
    assert len(counts) == ROWS, f"{ROWS - len(counts)} rows never claimed"
    # Every claim bumped the token exactly once and counted one attempt.
    assert Document.objects.processing().count() == ROWS
    assert set(Document.objects.values_list("version", "attempts").distinct()) == {(1, 1)}


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_integer_status_table_one_holder(tmp_path):
    """A legacy MySQL job table (NEW=1, PENDING=2, …) under the default strategy."""
    Job.objects.bulk_create([Job(name=str(i)) for i in range(2000)], batch_size=1000)
    claims, _ = run_claimers(tmp_path, model="Job")
    counts = Counter(c["pk"] for c in claims)
    assert max(counts.values()) == 1
    assert len(counts) == 2000
    assert Job.objects.filter(status=Job.PENDING).count() == 2000


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("recipe", ["naive_lock_table", "for_update_unconditional"])
def test_broken_recipes_double_claim(tmp_path, recipe):
    """The harness can fail: the well-known broken recipes hand rows to two claimers."""
    if connection.vendor != "postgresql":
        pytest.skip("the double claims are demonstrated on PostgreSQL")
    # Most rows (70-99 % in trial runs) are handed out twice; 1,000 of them keep the
    # claimers overlapping even when a loaded machine starts them far apart.
    Document.objects.bulk_create([Document(title=str(i)) for i in range(1000)])
    claims, _ = run_claimers(tmp_path, recipe=recipe, batch_max=5)
    counts = Counter(c["pk"] for c in claims)
    doubles = sum(1 for k in counts.values() if k > 1)
    assert doubles > 0, "the broken recipe produced no double claim: the harness would not notice"
