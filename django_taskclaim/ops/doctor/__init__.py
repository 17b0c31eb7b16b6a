"""The doctor: what the real database holds and does, checked, each finding with its fix.

:func:`diagnose` is what ``manage.py taskclaim_doctor`` runs. Unlike the system checks
(which read settings and model metadata), it asks the database: its indexes
(introspection), the plans of the claim and reap queries (``EXPLAIN``), its clock, the
pooler in front of it, and the queue's rows. Every check and threshold is listed in
``docs/doctor.md``:

- ``TC-D001`` the database answers; ``TC-D002`` / ``TC-D003`` pooler mode; ``TC-D004``
  clock offset; ``TC-D005`` heartbeat against lease; ``TC-D006`` durable commits;
  ``TC-D007`` notify triggers (:mod:`.database`); ``TC-D008`` the model's table and
  columns, ``TC-D009`` the app's own tables (:mod:`.schema`);
- ``TC-D010`` – ``TC-D013`` claim and lease indexes, and the plans that read them
  (:mod:`.indexes`);
- ``TC-D020`` – ``TC-D023`` queue health, ``TC-D024`` paused queues, ``TC-D025`` waiting
  rows no settle will release, ``TC-D030`` finished rows to prune
  (:mod:`.queues`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import partial
from typing import Any

from django.db import DEFAULT_DB_ALIAS, router

from django_taskclaim.config.discovery import is_claimable
from django_taskclaim.config.options import get_options
from django_taskclaim.exceptions import TaskClaimError
from django_taskclaim.models import WorkerProcess
from django_taskclaim.ops.doctor import database, indexes, queues, schema
from django_taskclaim.ops.doctor.context import ModelContext
from django_taskclaim.ops.doctor.findings import (
    SEVERITIES,
    Finding,
    Severity,
    Thresholds,
    exit_code,
    format_findings,
    guarded,
)
from django_taskclaim.periodic.reported import reported_models

__all__ = [
    "SEVERITIES",
    "Finding",
    "Severity",
    "Thresholds",
    "diagnose",
    "exit_code",
    "format_findings",
]


def diagnose(
    models: Iterable[Any] | None = None,
    using: str | None = None,
    *,
    limits: Thresholds | None = None,
) -> list[Finding]:
    """Check ``models`` (default: every claimable model but an unused ``PeriodicRun``,
    :func:`~django_taskclaim.periodic.reported.reported_models`) on the database ``using``
    (default: each model's database for writes, as the reaper uses) and return every
    finding, ``ok`` ones included, in a stable order: per database, then per model.

    Never raises for what it finds: a database that cannot be reached is one error
    finding (its model checks are skipped), a check that fails on a database error or an
    invalid option is one error finding naming it. Raises
    :class:`~django_taskclaim.exceptions.NotClaimableError` only for a model in
    ``models`` that is not claimable at all. Only reads: it changes no row and no setting.
    """
    limits = limits or Thresholds()
    targets = list(models) if models is not None else list(reported_models(using))
    targets.sort(key=lambda m: m._meta.label)
    for model in targets:
        if not is_claimable(model):
            get_options(model)  # raises NotClaimableError, saying which fields are missing
    by_alias: dict[str, list[Any]] = {}
    for model in targets:
        by_alias.setdefault(using or router.db_for_write(model), []).append(model)
    if not by_alias:
        by_alias[using or DEFAULT_DB_ALIAS] = []
    registry = using or router.db_for_read(WorkerProcess)
    findings: list[Finding] = []
    reached: set[str] = set()
    for alias in sorted(by_alias):
        findings.extend(_database(alias, by_alias[alias], limits, reached, registry))
    if registry in reached:
        findings.extend(
            guarded(
                queues.SILENT,
                "silent workers",
                registry,
                None,
                _one(queues.silent_workers, registry),
            )
        )
    return findings


def _one(check: Callable[..., Finding], *args: Any) -> Callable[[], list[Finding]]:
    """``check(*args)`` as a check returning a list."""
    return lambda: [check(*args)]


def _database(
    alias: str, models: list[Any], limits: Thresholds, reached: set[str], registry: str
) -> list[Finding]:
    """The checks of one database and of the models on it."""
    answer = database.reachable(alias)
    connected = answer.severity == "ok"
    found = [answer, *database.pooler(alias, connected=connected)]
    if connected:
        reached.add(alias)
        leases = []
        for model in models:
            try:
                leases.append(get_options(model).lease)
            except TaskClaimError:  # reported by the model's own TC-D005
                continue
        found += guarded(
            database.CLOCK, "clock offset", alias, None, _one(database.clock, alias, leases, limits)
        )
        found += guarded(
            database.DURABLE,
            "commit durability",
            alias,
            None,
            _one(database.durable_commits, alias),
        )
    if connected and alias == registry:
        found += guarded(
            schema.APP_TABLES, "the app's tables", alias, None, _one(schema.app_tables, alias)
        )
    for model in models:
        found.append(database.heartbeat(model, alias))
        if connected:
            shape = guarded(
                schema.SCHEMA,
                "tables and columns",
                alias,
                model._meta.label,
                _one(schema.schema, model, alias),
            )
            found += shape
            if any(f.severity == "error" for f in shape):
                continue  # the checks that read the table would only repeat it
            found += guarded(
                database.TRIGGER,
                "notify trigger",
                alias,
                model._meta.label,
                partial(database.notify_trigger, model, alias),
            )
            found += _model(ModelContext(model, alias, limits, registry))
    return found


def _model(ctx: ModelContext) -> list[Finding]:
    """The checks that read one model's table."""
    label, alias = ctx.label, ctx.alias
    found: list[Finding] = []
    for kind in (indexes.CLAIM, indexes.LEASE):
        found += guarded(
            kind.index_id,
            f"{kind.name} index",
            alias,
            label,
            partial(indexes.check_index, ctx, kind),
        )
    for check_id, what, check in (
        (queues.READY_AGE, "oldest ready row", queues.ready_age),
        (queues.NOT_REAPED, "expired leases", queues.not_reaped),
        (queues.FAILED, "failed rows", queues.failed),
        (queues.PAUSED, "paused queues", queues.paused_queues),
        (queues.STUCK_WAITING, "stuck waiting rows", queues.stuck_waiting),
        (queues.PRUNE, "finished rows to prune", queues.prunable),
    ):
        found += guarded(check_id, what, alias, label, _one(check, ctx))
    return found
