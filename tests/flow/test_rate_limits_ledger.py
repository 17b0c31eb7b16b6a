"""The ledger test of rate limits: eight real worker processes drain 3,000 rows
under ``rate_limit = "300/s"``; one worker is SIGKILLed while it holds claims.

Every attempt records its claim time (the database clock value its claim wrote its lease
from) as it starts, committed at once, so a killed attempt stays counted. Then: no
window of one second holds more than 300 starts, every row is done, a row ran twice
only if the killed worker held it, and the ring still lends all its 300 slots (nothing
leaked).
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db.models import Max

from django_taskclaim.db import db_now
from django_taskclaim.model.status import Status
from django_taskclaim.models import RateSlot
from tests.flow.test_rate_limits import claim_meta, max_in_window
from tests.support.helpers import wait_for
from tests.support.keyedapp.models import KeyRun
from tests.support.testapp.models import Document
from tests.support.worker_procs import WorkerProc, stop_all

pytestmark = pytest.mark.django_db(transaction=True)

RATE = "300/s"
LIMIT, WINDOW = 300, 1.0
LEASE = 3.0
META = {
    "rate_limit": RATE,
    "lease": LEASE,
    "handler": "tests.support.rate_handlers.record_start",
}
SETTINGS = {"TASKCLAIM_REAP_INTERVAL": 0.5, "TASKCLAIM_RETRY_BACKOFF": 0.05}


def test_fleet_never_exceeds_the_limit_and_a_kill_leaks_no_slot() -> None:
    Document.objects.bulk_create(Document(title=str(i)) for i in range(3000))
    procs = [
        WorkerProc(
            "testapp.Document",
            "--concurrency=4",
            "--batch=5",
            "--poll=0.2",
            f"--worker-id=rl-{i}",
            settings=SETTINGS,
            claim_meta=META,
        )
        for i in range(8)
    ]
    try:
        victim = procs[0]
        victim.wait_started(timeout=60)
        # SIGKILL the victim while it holds claimed rows (mid-run).
        wait_for(
            lambda: (
                KeyRun.objects.count() >= 900
                and Document.objects.filter(status=Status.PROCESSING, locked_by="rl-0").exists()
            ),
            timeout=90,
            what="the victim holding claims mid-run",
        )
        held = set(
            Document.objects.filter(status=Status.PROCESSING, locked_by="rl-0").values_list(
                "pk", flat=True
            )
        )
        victim.kill()
        wait_for(
            lambda: Document.objects.filter(status=Status.DONE).count() == 3000,
            timeout=120,
            what="every row done",
        )
    finally:
        stop_all(procs)
    assert held
    runs = list(KeyRun.objects.values_list("task_id", "token", "claimed_until"))
    starts = [until - timedelta(seconds=LEASE) for _, _, until in runs]
    busiest = max_in_window(starts, WINDOW)
    assert busiest <= LIMIT
    assert {task for task, _, _ in runs} == set(Document.objects.values_list("pk", flat=True))
    per_task: dict[int, list[int]] = {}
    for task, token, _ in runs:
        per_task.setdefault(task, []).append(token)
    again = {task for task, tokens in per_task.items() if len(tokens) > 1}
    assert again <= held  # only the killed worker's rows ran a second time
    assert all(len(set(t)) == len(t) for t in per_task.values())  # one holder per token
    # Nothing leaked: the ring is whole and, a window later, lends every slot at once.
    assert RateSlot.objects.filter(model="testapp.Document").count() == LIMIT
    Document.objects.bulk_create(Document() for _ in range(LIMIT + 10))
    latest = RateSlot.objects.aggregate(m=Max("last_start"))["m"]
    wait_for(
        lambda: db_now() > latest + timedelta(seconds=WINDOW),
        timeout=30,
        what="one window past the last start (database clock)",
    )
    with claim_meta(Document, rate_limit=RATE, lease=LEASE):
        assert len(Document.objects.claim(LIMIT + 10)) == LIMIT
