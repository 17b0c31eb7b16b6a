"""Which claimable models the operator's overviews list (the admin dashboard, the admin
index, ``manage.py taskclaim_stats``, the metrics, the doctor) and a worker serves by
default: every claimable model, except the app's own ``PeriodicRun`` in a project that
does not use ``@periodic``.

Neighbours: :mod:`django_taskclaim.ops.figures` computes the figures of the models listed
here; :mod:`django_taskclaim.periodic.registry` knows the schedules.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from django.db import DatabaseError, models, router

from django_taskclaim.config.discovery import claimable_models
from django_taskclaim.models import PeriodicRun, PeriodicSlot
from django_taskclaim.periodic.registry import PERIODIC_RUN, discover, schedules

__all__ = ["periodic_in_use", "periodic_runs_in_use", "reported_models", "without_unused"]

logger = logging.getLogger("django_taskclaim.periodic.reported")


def _registered(function_runs_only: bool) -> bool:
    try:
        discover()
    except Exception as exc:  # a broken periodic module: show the models, say why
        logger.warning("periodic discovery failed error=%s: listing periodic models", exc)
        return True
    return any(not function_runs_only or s.target_label == PERIODIC_RUN for s in schedules())


def periodic_runs_in_use(using: str | None = None) -> bool:
    """Whether ``PeriodicRun`` is worth listing: a schedule of a function (whose slots
    create ``PeriodicRun`` rows) is registered in this process (after discovering the
    apps' ``periodic`` modules), or the table holds a row (schedules removed since, or
    declared only in the workers). One indexed ``EXISTS`` query when no schedule is
    registered; none otherwise."""
    if _registered(function_runs_only=True):
        return True
    db = using or router.db_for_read(PeriodicRun)
    return PeriodicRun._base_manager.using(db).exists()


def periodic_in_use(using: str | None = None) -> bool:
    """Whether periodic work is in use at all: any schedule is registered in this
    process, or a slot has been enqueued (``PeriodicSlot`` holds a row)."""
    if _registered(function_runs_only=False):
        return True
    db = using or router.db_for_read(PeriodicSlot)
    return PeriodicSlot._base_manager.using(db).exists() or periodic_runs_in_use(using)


def reported_models(using: str | None = None) -> list[type[models.Model]]:
    """The claimable models an overview lists by default: all of them, without
    ``PeriodicRun`` unless :func:`periodic_runs_in_use`. A model named explicitly is
    always reported; this is only the default list. A database that cannot be asked
    (down, not migrated) lists it: nothing is left out on a guess."""
    return without_unused(claimable_models(), using)


def without_unused(
    candidates: Iterable[type[models.Model]], using: str | None = None
) -> list[type[models.Model]]:
    """``candidates`` without ``PeriodicRun`` unless :func:`periodic_runs_in_use` (the
    rule of :func:`reported_models`, over a list of models chosen otherwise)."""
    found = list(candidates)
    if PeriodicRun in found:
        try:
            in_use = periodic_runs_in_use(using)
        except DatabaseError:
            in_use = True
        if not in_use:
            found.remove(PeriodicRun)
    return found
