"""Recovery of rows whose holder lost them: ``reap()`` and ``release_worker()``.

A row is taken back from its holder in exactly two cases (NO EARLY RE-RUN):

- its lease ended before the database's ``now()`` (:func:`reap`), or
- its holder is *proven* dead (:func:`release_worker`): the ``--processes`` supervisor saw
  the worker process exit, or an operator says so explicitly. Silence (a missed
  heartbeat, a paused process) is never proof, and nothing here acts on it.

Each batch is two bounded UPDATEs whose conditions (``processing``, and the lease or the
holder) are re-checked inside the UPDATE itself — never a SELECT followed by an UPDATE by
id alone — so a row a worker completes or re-leases meanwhile is left alone. The token is
bumped, fencing the old holder. A row whose attempts are used up ends ``failed``; the
others go back to ``ready`` *marked recovered*: ``locked_until`` keeps the end of the lost
lease (a ``ready`` row otherwise has none). The worker runs a recovered row near its last
attempt alone, after its batch-mates are settled (earlier ones in batches, with attempts
to spare), so a task that kills its worker is charged its attempts while the tasks
claimed with it are not dead-lettered for it.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from django.db import DatabaseError, connections, models, router, transaction
from django.db.models import F, Q

from django_taskclaim import signals
from django_taskclaim.claim.resets import Change, holder_text, writes
from django_taskclaim.config import bounds
from django_taskclaim.config.discovery import claimable_models
from django_taskclaim.config.options import ClaimOptions, get_options
from django_taskclaim.config.settings import taskclaim_settings
from django_taskclaim.db import retry_transient
from django_taskclaim.rules import lease_expired_q
from django_taskclaim.settle.dependents import settle_and_release

logger = logging.getLogger("django_taskclaim.recovery.reap")


@dataclass
class ReapResult:
    """Counts of one reap: rows put back to ``ready`` and rows ended ``failed``, per model."""

    requeued: int = 0
    failed: int = 0
    per_model: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return self.requeued + self.failed

    def add(self, label: str, requeued: int, failed: int) -> None:
        self.requeued += requeued
        self.failed += failed
        entry = self.per_model.setdefault(label, {"requeued": 0, "failed": 0})
        entry["requeued"] += requeued
        entry["failed"] += failed


def reap_queryset(
    qs: models.QuerySet,
    *,
    batch_size: int | None = None,
    held_by: Iterable[str] | None = None,
    dry_run: bool = False,
    max_batches: int | None = None,
    reason: str | None = None,
) -> ReapResult:
    """Recover the stuck rows of ``qs``; see :func:`reap` and :func:`release_worker`."""
    opts = get_options(qs.model)
    batch = bounds.number(
        taskclaim_settings.REAP_BATCH if batch_size is None else batch_size,
        "batch_size",
        bounds.BATCH_SIZE,
        error=ValueError,
    )
    holders = list(held_by) if held_by is not None else None
    stuck, why = _stuck(opts, holders, reason)
    scope = qs.filter(stuck)
    if dry_run:
        return _count_stuck(scope, opts)
    to_failed, to_ready = _reap_writes(opts, why)
    result = _reap_in_batches(
        qs, scope, stuck, opts, batch, to_failed, to_ready,
        by_holder=holders is not None, max_batches=max_batches,
    )  # fmt: skip
    _report(qs, opts, result)
    return result


def _stuck(opts: ClaimOptions, holders: list[str] | None, reason: str | None) -> tuple[Q, str]:
    """Which rows are stuck (held by ``holders``, or with an expired lease) and the
    ``last_error`` they get (``{}``: where the holder goes)."""
    if holders is not None:
        if not opts.has("locked_by"):
            raise ValueError(f"{opts.label} has no locked_by field; cannot reap by holder")
        stuck = opts.status_q("processing") & Q(locked_by__in=holders)
        why = reason or "released from worker {}"
    else:
        stuck = lease_expired_q(opts)
        why = reason or "lease expired; held by {}"
    if "{}" not in why:
        why += " (held by {})"
    return stuck, why


def _count_stuck(scope: models.QuerySet, opts: ClaimOptions) -> ReapResult:
    """A dry run: what a reap of ``scope`` would requeue and fail, nothing written."""
    result = ReapResult()
    n_failed = scope.filter(attempts__gte=opts.max_attempts).count()
    result.add(opts.label, scope.count() - n_failed, n_failed)
    return result


def _reap_writes(opts: ClaimOptions, why: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The values a reaped row gets: ``failed`` (its attempts used up) or ``ready``; the
    token moves on either way, and ``last_error`` says ``why`` (with the holder)."""
    prefix, suffix = why.split("{}", 1)
    text = holder_text(opts, prefix, suffix)
    bump = {"version": F("version") + 1}
    to_failed = {
        **bump,
        **writes(opts, Change.REAP_TO_FAILED, error=text),
        opts.status_field: opts.value("failed"),
        "locked_until": None,
    }
    # ``locked_until`` is kept: a ready row with one is marked recovered (run alone next).
    to_ready = {
        **bump,
        **writes(opts, Change.REAP_TO_READY, error=text),
        opts.status_field: opts.value("ready"),
    }
    return to_failed, to_ready


def _reap_in_batches(
    qs: models.QuerySet,
    scope: models.QuerySet,
    stuck: Q,
    opts: ClaimOptions,
    batch: int,
    to_failed: dict[str, Any],
    to_ready: dict[str, Any],
    *,
    by_holder: bool,
    max_batches: int | None,
) -> ReapResult:
    """Reap ``scope`` ``batch`` rows at a time (each batch retried on a transient error)
    until a batch finds fewer, or ``max_batches`` ran."""
    using = qs.db
    base = qs.model._base_manager.using(using)
    features = connections[using].features
    skip_locked = features.has_select_for_update and features.has_select_for_update_skip_locked
    result = ReapResult()
    batches = 0
    while max_batches is None or batches < max_batches:
        batches += 1
        found, requeued, failed = retry_transient(
            partial(_reap_batch, scope, base, stuck, batch, opts.max_attempts, to_failed,
                    to_ready, skip_locked=not by_holder and skip_locked),
            using,
            what="reap",
        )  # fmt: skip
        if not found:
            break
        result.add(opts.label, requeued, failed)
        if found < batch:
            break
    return result


def _report(qs: models.QuerySet, opts: ClaimOptions, result: ReapResult) -> None:
    """Log a reap that recovered rows and send ``task_reaped``."""
    if result.total:
        logger.info(
            "reaped model=%s requeued=%s failed=%s", opts.label, result.requeued, result.failed
        )
        signals.task_reaped.send(
            sender=qs.model, requeued=result.requeued, failed=result.failed, using=qs.db
        )


def _reap_batch(
    scope: models.QuerySet,
    base: models.QuerySet,
    stuck: Q,
    batch: int,
    max_attempts: int,
    to_failed: dict[str, Any],
    to_ready: dict[str, Any],
    *,
    skip_locked: bool,
) -> tuple[int, int, int]:
    """One batch of :func:`reap_queryset`: ``(rows found, requeued, failed)``.

    Every ``UPDATE`` re-checks the stuck condition. A lapsed lease is reaped only from a
    row no other session holds locked (``SELECT … FOR UPDATE SKIP LOCKED`` first, where
    the database has it): such a row is in use — a web request's ``select_for_update()``
    or its holder's outcome write waiting on one — and the next pass sees it again. The
    reaper then never waits behind a user's lock, and never overtakes a holder's
    completion queued on that lock the moment it is released."""
    if skip_locked:
        with transaction.atomic(using=scope.db):
            pks = list(
                scope.order_by()
                .select_for_update(skip_locked=True)
                .values_list("pk", flat=True)[:batch]
            )
            return (len(pks), *_reap_rows(base, pks, stuck, max_attempts, to_failed, to_ready))
    pks = list(scope.order_by().values_list("pk", flat=True)[:batch])
    return (len(pks), *_reap_rows(base, pks, stuck, max_attempts, to_failed, to_ready))


def _reap_rows(
    base: models.QuerySet,
    pks: list[Any],
    stuck: Q,
    max_attempts: int,
    to_failed: dict[str, Any],
    to_ready: dict[str, Any],
) -> tuple[int, int]:
    if not pks:
        return 0, 0
    target = base.filter(pk__in=pks).filter(stuck)
    failing = target.filter(attempts__gte=max_attempts)
    if get_options(base.model).dependents:  # dead-lettered rows release their dependents
        failed = len(
            settle_and_release(
                base.model,
                base.db,
                partial(_fail_locked, failing, to_failed),
                lambda locked: (locked, "failed"),
                what="reap",
            )
        )
    else:
        failed = failing.update(**to_failed)
    return target.update(**to_ready), failed


def _fail_locked(failing: models.QuerySet, to_failed: dict[str, Any]) -> list[Any]:
    """Dead-letter the rows of ``failing``, locked first; return their primary keys."""
    locked = list(failing.select_for_update().values_list("pk", flat=True))
    failing.model._base_manager.using(failing.db).filter(pk__in=locked).update(**to_failed)
    return locked


def reap(
    *models_: type[models.Model],
    using: str | None = None,
    batch_size: int | None = None,
    held_by: Iterable[str] | None = None,
    dry_run: bool = False,
    reason: str | None = None,
) -> ReapResult:
    """Recover rows stuck in ``processing`` for the given models (default: all claimable).

    A row is stuck when its lease ended before the database's ``now()``. (``held_by``
    takes the rows of those workers whatever their lease: only for holders proven dead,
    see :func:`release_worker`.) Stuck rows go back to ``ready`` marked recovered, or to
    ``failed`` when ``attempts`` reached ``max_attempts``; their token is bumped so the
    old holder's writes are fenced, and ``last_error`` says why. Works in bounded batches
    (``TASKCLAIM_REAP_BATCH``). ``dry_run`` only counts.
    """
    result = ReapResult()
    targets = list(models_) or list(claimable_models())
    holders = list(held_by) if held_by is not None else None
    for model in targets:
        db = using or router.db_for_write(model)
        part = reap_queryset(
            model._base_manager.db_manager(db).all(),
            batch_size=batch_size,
            held_by=holders,
            dry_run=dry_run,
            reason=reason,
        )
        for label, counts in part.per_model.items():
            result.add(label, counts["requeued"], counts["failed"])
    return result


def release_worker(
    worker_id: str,
    *models_: type[models.Model],
    using: str | None = None,
    reason: str | None = None,
    dry_run: bool = False,
) -> ReapResult:
    """Take back, at once, every row held by ``worker_id`` — whatever its lease.

    Call it only when that worker is *proven* dead: the ``--processes`` supervisor
    calls it when it reaps a child process (``waitpid``), and an operator may call it
    (``manage.py taskclaim_reap --release-worker ID``, the admin) for a worker they know
    is gone. If the worker is in fact alive, it is fenced (its later writes land
    nowhere) but its task body may still be running while another worker starts the
    same row: that is why nothing calls this on silence alone.

    The UPDATE is conditioned on holder, ``processing`` and the token it bumps; rows
    go back ``ready`` (marked recovered) or ``failed`` if their attempts are used up.
    Models without a ``locked_by`` field are skipped (their rows wait for the lease).
    """
    if not isinstance(worker_id, str) or not worker_id:
        raise ValueError(f"worker_id must be a non-empty string, got {worker_id!r}")
    targets = [
        m for m in (list(models_) or list(claimable_models())) if get_options(m).has("locked_by")
    ]
    return (
        reap(
            *targets,
            using=using,
            held_by=[worker_id],
            dry_run=dry_run,
            reason=reason or "released from worker {}",
        )
        if targets
        else ReapResult()
    )


def recover(
    models_: Iterable[type[models.Model]] = (),
    *,
    using: str | None = None,
    dry_run: bool = False,
    batch_size: int | None = None,
) -> ReapResult:
    """Recover the rows whose lease expired (database clock) of ``models_`` (default:
    every claimable model); see :func:`reap`. Rows with a valid lease are never touched,
    whatever the worker registry says. ``dry_run`` only counts. Safe to run concurrently
    from several hosts."""
    targets = list(models_) or list(claimable_models())
    return reap(*targets, using=using, batch_size=batch_size, dry_run=dry_run)


def recover_and_release(
    models_: Iterable[type[models.Model]],
    *,
    release_workers: Iterable[str] = (),
    using: str | None = None,
    dry_run: bool = False,
    batch_size: int | None = None,
    reason: str = "released from worker {} by an operator (taskclaim_reap)",
) -> ReapResult:
    """One operator's pass (``taskclaim_reap``): :func:`recover` the expired leases of
    ``models_`` (default: every claimable model), then :func:`release_worker` each of
    ``release_workers`` — workers the operator knows are dead. One result for both."""
    targets = list(models_)
    result = recover(targets, using=using, dry_run=dry_run, batch_size=batch_size)
    for worker_id in release_workers:
        part = release_worker(worker_id, *targets, using=using, dry_run=dry_run, reason=reason)
        for label, counts in part.per_model.items():
            result.add(label, counts["requeued"], counts["failed"])
    return result


def repeat_until_signalled(
    interval: float,
    one_pass: Callable[[], None],
    on_error: Callable[[DatabaseError], None],
) -> None:
    """Call ``one_pass`` now and then every ``interval`` seconds until SIGTERM or SIGINT
    (the pass under way finishes first; the previous handlers are put back). A
    :class:`DatabaseError` from a pass goes to ``on_error``, the connections are closed
    (the next pass reconnects) and the loop goes on. Main thread only (signals)."""
    stop = threading.Event()
    previous = {
        sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGTERM, signal.SIGINT)
    }
    try:
        while not stop.is_set():
            try:
                one_pass()
            except DatabaseError as exc:
                on_error(exc)
                connections.close_all()
            stop.wait(interval)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
