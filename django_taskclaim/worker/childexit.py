"""What a supervisor does once ``waitpid`` has seen a child exit (proof of death), before
it starts a replacement.

The rows the child still held are released at once on its database
(:func:`~django_taskclaim.recovery.reap.release_worker`, fenced on holder, status and
token), so a task of a SIGKILLed or OOM-killed child runs again within a second or two
instead of after its lease: the only early recovery the library makes. A child killed
for bodies past their deadline and grace (:mod:`.childwatch`) first has each such
attempt failed with ``TimeoutError`` and its other rows given back without losing an
attempt (:mod:`~django_taskclaim.recovery.overdue`). Its registry row is then marked
stopped, so that its replacement (same worker id) registers as the same worker, not as
a second process using its id.
"""

from __future__ import annotations

import logging
from typing import Any

from django.apps import apps
from django.db import DatabaseError, connections

from django_taskclaim.recovery.overdue import fail_overdue, give_back_held
from django_taskclaim.recovery.reap import release_worker
from django_taskclaim.worker.config import WorkerConfig
from django_taskclaim.worker.exits import describe_exit
from django_taskclaim.worker.maintenance.registry import mark_stopped

logger = logging.getLogger("django_taskclaim.supervisor")


def child_exited(
    config: WorkerConfig, worker_id: str, pid: int, code: int, late: list[dict[str, Any]]
) -> None:
    """Child ``pid`` (``worker_id``, serving ``config``) exited with ``code``; ``late``:
    the reports of the bodies it was killed for (:meth:`.childwatch.ChildWatch.killed_for`)."""
    if late:
        try:
            settle_late(config, worker_id, late)
        except Exception as exc:  # what is left is released below, as for any exit
            logger.error(
                "could not settle the rows of the replaced worker worker=%s error=%s",
                worker_id,
                " ".join(str(exc).split()) or repr(exc),
                exc_info=None if isinstance(exc, DatabaseError) else exc,
            )
            connections.close_all()
    result = release_worker(
        worker_id,
        *config.models,
        using=config.using,
        reason=f"worker {{}} exited ({describe_exit(code)}); released by its supervisor",
    )
    if result.total:
        logger.warning(
            "released rows of exited worker worker=%s how=%s requeued=%s failed=%s",
            worker_id,
            describe_exit(code),
            result.requeued,
            result.failed,
        )
    mark_stopped(worker_id, pid)


def settle_late(config: WorkerConfig, worker_id: str, late: list[dict[str, Any]]) -> None:
    """The child was killed for bodies past their deadline and grace: each such
    attempt fails with ``TimeoutError``; its other rows go back without losing an
    attempt (:mod:`~django_taskclaim.recovery.overdue`)."""
    keep = []
    for report in late:
        model = apps.get_model(report["label"])
        outcome = fail_overdue(
            model,
            report["pk"],
            int(report["version"]),
            using=config.using,
            timeout=float(report["timeout"]),
        )
        keep.append((model, report["pk"]))
        logger.warning(
            "task past its deadline failed worker=%s task=%s:%s timeout=%gs outcome=%s",
            worker_id,
            report["label"],
            report["pk"],
            float(report["timeout"]),
            outcome or "already settled",
        )
    given = give_back_held(worker_id, config.models, using=config.using, keep=keep)
    if given:
        logger.warning(
            "gave back the other rows of the replaced worker worker=%s rows=%s "
            "(attempts not counted)",
            worker_id,
            given,
        )
