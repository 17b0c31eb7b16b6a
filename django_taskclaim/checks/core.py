"""System checks (ids ``taskclaim.E…`` / ``taskclaim.W…``), registered by the AppConfig.

- E001 unknown ``TASKCLAIM_*`` setting (with a suggestion)
- E002 a model's claim options are invalid (``ClaimMeta``, fields, statuses)
- E003 a model's strategy is not supported by its database
- W001 no index serves the claim query of a model
- W002 SQLite database without ``transaction_mode = "IMMEDIATE"``
- W003 / W010 / W011 pooler checks (transaction pooling declared; server-side cursors
  behind a transaction pooler; port 6432 with no pooler mode declared) — see
  :mod:`django_taskclaim.checks.locks`
- W012 a table or column of a claimable model or of the app is missing, with its fix
  (``migrate``, or ``makemigrations`` first) — tagged ``database`` only: run with
  ``--database`` and by ``migrate``; see :mod:`django_taskclaim.checks.schema`
- W004 a claimable model has no processing entry point (``process`` / ``ClaimMeta.handler``)
- E004 invalid ``TASKCLAIM_POOLER_MODE``
- E009 invalid ``TASKCLAIM_ATTEMPT_LOG``
- E005 a numeric ``TASKCLAIM_*`` setting is not a finite number within its bounds
- E006 ``TASKCLAIM_HEARTBEAT_INTERVAL`` cannot keep some model's lease alive (it is not
  under half that lease)
- E007 a removed setting is still set (``TASKCLAIM_WORKER_DEAD_AFTER``)
- E030 / E031 unique enqueue: an ``ActiveKeyField`` without an unconditional unique
  constraint, or out of step with ``ClaimMeta`` — see :mod:`django_taskclaim.checks.unique`
- E032 / E033 per-key concurrency: a ``concurrency_key`` no constraint enforces, or a
  partial constraint on MariaDB/MySQL — see :mod:`django_taskclaim.checks.concurrency_keys`
- E040 ``ClaimMeta.archive`` cannot take the model's finished rows (unknown model,
  missing columns, foreign keys pointing at the model) — see
  :mod:`django_taskclaim.recovery.archive`
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core import checks
from django.db import connections, router

from django_taskclaim.backends import for_engine
from django_taskclaim.claim import resolve
from django_taskclaim.config.discovery import checked_models
from django_taskclaim.config.options import get_options
from django_taskclaim.config.settings import (
    BOUNDS,
    CHECK_TAG,
    PREFIX,
    setting_problem,
    taskclaim_settings,
)
from django_taskclaim.exceptions import TaskClaimError
from django_taskclaim.model.indexes import has_claim_index
from django_taskclaim.recovery.archive import archive_problems

#: The tag of every django-taskclaim check: ``manage.py check --tag taskclaim`` runs them
#: alone, and the worker runs them (and only them) when it starts.
TAG = CHECK_TAG


@checks.register(TAG)
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    errors: list[checks.CheckMessage] = []
    for name, suggestion in taskclaim_settings.unknown_names():
        errors.append(
            checks.Error(
                f"Unknown setting {name}.",
                hint=f"Did you mean {suggestion}?" if suggestion else "See docs/settings.md.",
                id="taskclaim.E001",
            )
        )
    for name, why in taskclaim_settings.removed_names():
        errors.append(checks.Error(f"{name} was removed.", hint=why, id="taskclaim.E007"))
    errors.extend(_check_numbers())
    mode = taskclaim_settings.POOLER_MODE
    if mode not in (None, "session", "transaction"):
        errors.append(
            checks.Error(
                f"TASKCLAIM_POOLER_MODE is {mode!r}.",
                hint='Use None, "session" or "transaction" (pgBouncer pool_mode).',
                id="taskclaim.E004",
            )
        )
    log = taskclaim_settings.ATTEMPT_LOG
    if log not in ("off", "errors", "all"):
        errors.append(
            checks.Error(
                f"TASKCLAIM_ATTEMPT_LOG is {log!r}.",
                hint='Use "errors" (the default), "all" or "off".',
                id="taskclaim.E009",
            )
        )
    for alias, conf in settings.DATABASES.items():
        backend = for_engine(conf)
        if backend is not None and backend.one_writer_at_a_time:
            mode_ = (conf.get("OPTIONS") or {}).get("transaction_mode")
            if str(mode_).upper() != "IMMEDIATE":
                errors.append(
                    checks.Warning(
                        f"SQLite database {alias!r} does not start transactions IMMEDIATE.",
                        hint="Set DATABASES[...]['OPTIONS']['transaction_mode'] = 'IMMEDIATE' "
                        "(and a busy timeout) so concurrent workers wait instead of failing "
                        "with 'database is locked'.",
                        id="taskclaim.W002",
                    )
                )
    return errors


def _check_numbers() -> list[checks.CheckMessage]:
    errors: list[checks.CheckMessage] = []
    for name, bound in BOUNDS.items():
        value = getattr(taskclaim_settings, name)
        if setting_problem(name, value) is not None:
            what = "a whole number" if bound.whole else "a number"
            errors.append(
                checks.Error(
                    f"{PREFIX}{name} is {value!r}.",
                    hint=f"Use {what} {bound.text()} (see docs/settings.md).",
                    id="taskclaim.E005",
                )
            )
    return errors


def heartbeat_problem(model: Any, lease: float) -> checks.CheckMessage | None:
    beat = taskclaim_settings.HEARTBEAT_INTERVAL
    if beat is None or isinstance(beat, bool) or not isinstance(beat, int | float):
        return None
    if beat >= lease / 2:
        return checks.Error(
            f"TASKCLAIM_HEARTBEAT_INTERVAL ({beat:g}s) is not under half the lease of "
            f"{model._meta.label} ({lease:g}s): one late heartbeat would let a live "
            "lease lapse and the task run twice.",
            hint="Lower TASKCLAIM_HEARTBEAT_INTERVAL (or leave it None: a third of each "
            "lease), or lengthen the lease.",
            obj=model,
            id="taskclaim.E006",
        )
    return None


@checks.register(checks.Tags.models, TAG)
def check_models(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    errors: list[checks.CheckMessage] = []
    for model in checked_models(app_configs):
        try:
            opts = get_options(model)
            lease = opts.lease
            opts.max_attempts  # noqa: B018 - validates the live options
            opts.retry_jitter  # noqa: B018
            opts.claim_gate  # noqa: B018
            opts.notify  # noqa: B018
            opts.timeout  # noqa: B018
            opts.backoff(1)
            strategy = opts.strategy
        except TaskClaimError as exc:
            errors.append(checks.Error(str(exc), obj=model, id="taskclaim.E002"))
            continue
        beat = heartbeat_problem(model, lease)
        if beat is not None:
            errors.append(beat)
        alias = router.db_for_write(model)
        if alias in connections:
            try:
                resolve(strategy, alias)
            except TaskClaimError as exc:
                errors.append(
                    checks.Error(
                        str(exc),
                        hint="Set ClaimMeta.strategy or TASKCLAIM_STRATEGY to 'auto'.",
                        obj=model,
                        id="taskclaim.E003",
                    )
                )
        if not has_claim_index(model, opts.status_field):
            errors.append(
                checks.Warning(
                    f"No index serves the claim query of {opts.label}.",
                    hint="Inherit ClaimableModel.Meta or add "
                    "django_taskclaim.models.claim_indexes(...) to Meta.indexes.",
                    obj=model,
                    id="taskclaim.W001",
                )
            )
        try:
            archive = archive_problems(model)
        except TaskClaimError as exc:
            archive = [str(exc)]
        errors.extend(checks.Error(p, obj=model, id="taskclaim.E040") for p in archive)
        try:
            handler = opts.handler()
        except TaskClaimError as exc:
            errors.append(checks.Error(str(exc), obj=model, id="taskclaim.E002"))
            continue
        # A model drained by its own runner (the outbox relay) says so with
        # ``taskclaim_runner``; workers leave it alone, as they do any handler-less model.
        if handler is None and not getattr(model, "taskclaim_runner", None):
            errors.append(
                checks.Warning(
                    f"{opts.label} has no processing entry point; workers cannot run it.",
                    hint="Define a process(self) method or set ClaimMeta.handler "
                    "(a method name, a dotted path or a callable).",
                    obj=model,
                    id="taskclaim.W004",
                )
            )
    return errors
