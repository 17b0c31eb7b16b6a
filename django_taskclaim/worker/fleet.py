"""One worker fleet over several databases.

``manage.py worker --database a --database b`` (or ``TASKCLAIM_WORKER_DATABASES``)
drains the claimable models on each alias. Each alias gets its own worker processes
(``--processes`` of them, one by default) under one supervisor, so each database has its
own claims, leases, heartbeats, reaping and (PostgreSQL) ``LISTEN``, and the databases
share the fleet fairly by construction: a slow or dead server stalls only its own
processes. With no alias given, each model is drained on the database Django's routers
name for its writes (``router.db_for_write``), which is ``default`` without routers.

Periodic schedules (:mod:`django_taskclaim.periodic`) have one home database, the same for
every worker whatever its ``--database`` order: the alias Django's routers name for writes
of ``taskclaim.PeriodicSlot`` (:func:`schedule_home`; ``default`` without routers). Only
the processes of that alias run the scheduler, so a slot fires once across the fleet.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from django.conf import settings
from django.db import router

from django_taskclaim.config.settings import taskclaim_settings
from django_taskclaim.exceptions import ConfigurationError
from django_taskclaim.worker.config import WorkerConfig


def schedule_home() -> str:
    """The database periodic slots (and their runs) are enqueued in: the alias
    ``router.db_for_write`` names for ``taskclaim.PeriodicSlot`` (``default`` without
    routers). Every worker derives the same one, so one fleet fires each slot once."""
    from django_taskclaim.models import PeriodicSlot  # deferred: models need the app registry

    return router.db_for_write(PeriodicSlot) or "default"


def requested_databases(given: Sequence[str] | None) -> list[str]:
    """The aliases asked for: ``--database`` values, else ``TASKCLAIM_WORKER_DATABASES``,
    else none (each model on its router's alias). Duplicates dropped, order kept; an
    alias missing from ``settings.DATABASES`` is a :class:`ConfigurationError`."""
    if given:
        source, aliases = "--database", list(given)
    else:
        value = taskclaim_settings.WORKER_DATABASES
        if value is None:
            return []
        source = "TASKCLAIM_WORKER_DATABASES"
        if isinstance(value, str) or not isinstance(value, (list, tuple)) or not value:
            raise ConfigurationError(
                f"{source} must be a non-empty list of database aliases, not {value!r}"
            )
        aliases = list(value)
    chosen: list[str] = []
    for alias in aliases:
        if not isinstance(alias, str) or alias not in settings.DATABASES:
            raise ConfigurationError(
                f"{source} {alias!r} is not in settings.DATABASES; "
                f"choose from {', '.join(settings.DATABASES)}"
            )
        if alias not in chosen:
            chosen.append(alias)
    return chosen


def plan(
    labels: Sequence[str], databases: Sequence[str] | None, **options: Any
) -> list[WorkerConfig]:
    """The :class:`WorkerConfig` of each database the fleet drains, validated.

    ``databases`` are the ``--database`` values (see :func:`requested_databases`); with
    none, the models (``labels``, or every claimable model with an entry point) are
    grouped by ``router.db_for_write``. ``options`` are :meth:`WorkerConfig.build`'s.
    Only the configuration of :func:`schedule_home` runs the periodic scheduler (none when
    the fleet does not drain that database).
    """
    aliases = requested_databases(databases)
    if aliases:
        configs = [WorkerConfig.build(labels, using=alias, **options) for alias in aliases]
    else:
        everything = WorkerConfig.build(labels, using="default", **options)
        groups: dict[str, list[str]] = {}
        for model in everything.models:
            alias = router.db_for_write(model) or "default"
            groups.setdefault(alias, []).append(model._meta.label)
        if list(groups) == ["default"]:
            configs = [everything]
        else:
            configs = [
                WorkerConfig.build(group, using=alias, **options) for alias, group in groups.items()
            ]
    home = schedule_home()
    return [c if c.using == home else replace(c, scheduler=False) for c in configs]
