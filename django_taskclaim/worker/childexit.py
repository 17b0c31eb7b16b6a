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

A child killed because its leases were not renewed in time (its heartbeat silent: a
body holding the GIL, a stopped process) has its rows released with a ``last_error``
saying so (``the worker stalled for 12 s, past its lease margin: killed …``), the
attempt counted, and one ``TaskAttempt`` per row noting that attempt's end.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.apps import apps
from django.db import DatabaseError, connections, router
from django.db.models import Model

from django_taskclaim.config.options import get_options
from django_taskclaim.config.settings import taskclaim_settings
from django_taskclaim.db import db_now
from django_taskclaim.recovery.overdue import fail_overdue, give_back_held
from django_taskclaim.recovery.reap import release_worker
from django_taskclaim.worker.attempts import ERROR_CHARS
from django_taskclaim.worker.config import WorkerConfig
from django_taskclaim.worker.exits import describe_exit
from django_taskclaim.worker.maintenance.registry import mark_stopped

logger = logging.getLogger("django_taskclaim.supervisor")


def child_exited(
    config: WorkerConfig,
    worker_id: str,
    pid: int,
    code: int,
    late: list[dict[str, Any]],
    *,
    stalled: float | None = None,
) -> None:
    """Child ``pid`` (``worker_id``, serving ``config``) exited with ``code``; ``late``:
    the reports of the bodies it was killed for (:meth:`.childwatch.ChildWatch.killed_for`);
    ``stalled``: the seconds it had not renewed its leases when it was killed for that
    (:meth:`.childwatch.ChildWatch.stalled_for`), ``None`` if it was not."""
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
    reason = f"worker {{}} exited ({describe_exit(code)}); released by its supervisor"
    held: list[Held] = []
    if stalled is not None:
        reason = stall_reason(stalled)
        held = held_rows(config, worker_id)
    result = release_worker(worker_id, *config.models, using=config.using, reason=reason)
    if result.total:
        logger.warning(
            "released rows of exited worker worker=%s how=%s requeued=%s failed=%s",
            worker_id,
            describe_exit(code),
            result.requeued,
            result.failed,
        )
    if held:
        note_killed(config.using, worker_id, held, reason.replace("{}", worker_id))
    mark_stopped(worker_id, pid)


def stall_reason(stalled: float) -> str:
    """The ``last_error`` (``{}``: the worker) of the rows of a child killed because its
    leases were not renewed in time."""
    return (
        f"the worker stalled for {stalled:.0f} s, past its lease margin: killed by its "
        "supervisor before its leases could lapse (worker {})"
    )


@dataclass
class Held:
    """A row a killed child held: its model, key, attempt and when it was claimed."""

    model: type[Model]
    pk: Any
    attempts: int
    claimed_at: datetime | None


def held_rows(config: WorkerConfig, worker_id: str) -> list[Held]:
    """The rows ``worker_id`` (a child seen dead) still holds, read before they are
    released; ``[]`` when they cannot be read (the release then fails alike)."""
    held: list[Held] = []
    try:
        for model in config.models:
            opts = get_options(model)
            if not opts.has("locked_by"):
                continue
            fields = ["pk", "attempts"] + (["claimed_at"] if opts.has("claimed_at") else [])
            rows = (
                model._base_manager.using(config.using)
                .filter(opts.status_q("processing"), locked_by=worker_id)
                .values_list(*fields)
            )
            held.extend(
                Held(model, r[0], int(r[1] or 0), r[2] if len(r) > 2 else None) for r in rows
            )
    except DatabaseError:
        return []
    return held


def note_killed(using: str, worker_id: str, held: list[Held], error: str) -> None:
    """One ``TaskAttempt`` per row of a child killed for silence: the attempt it was in
    ended there, killed (``TASKCLAIM_ATTEMPT_LOG`` ``"off"``: none). Never raises."""
    from django_taskclaim.models import TaskAttempt  # the app registry first

    if taskclaim_settings.ATTEMPT_LOG == "off":
        return
    db = router.db_for_write(TaskAttempt) or using
    try:
        now = db_now(db)
        TaskAttempt.objects.using(db).bulk_create(
            [
                TaskAttempt(
                    model=h.model._meta.label[:100],
                    row=str(h.pk)[:191],
                    number=h.attempts,
                    worker=worker_id[:255],
                    started_at=h.claimed_at or now,
                    runtime=round(max(0.0, (now - (h.claimed_at or now)).total_seconds()), 6),
                    outcome=(
                        "failed" if h.attempts >= get_options(h.model).max_attempts else "retried"
                    ),
                    error=error[:ERROR_CHARS],
                )
                for h in held
            ]
        )
    except DatabaseError as exc:
        logger.warning(
            "could not note the attempts of the killed worker worker=%s error=%s",
            worker_id,
            " ".join(str(exc).split()) or repr(exc),
        )


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
