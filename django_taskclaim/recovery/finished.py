"""Which finished rows a retention pass takes: one validation for ``prune`` and
``archive_finished`` (:mod:`.prune`, :mod:`.archive`).

Both take the rows of a model in terminal ``states`` whose ``finished_at`` is older than
``older_than`` on the database's clock, in batches of ``batch_size``: the same arguments,
checked the same way, before anything is touched.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.db import models, router
from django.db.models import Q

from django_taskclaim.config import bounds
from django_taskclaim.config.options import ClaimOptions
from django_taskclaim.db import DbNow
from django_taskclaim.exceptions import ConfigurationError
from django_taskclaim.row.status import TERMINAL_STATES


@dataclass(frozen=True)
class Finished:
    """The finished rows one pass takes: ``cond`` (the states and the age) on the model's
    table in database ``db``, ``batch_size`` rows per statement."""

    cond: Q
    batch_size: int
    db: str


def older_than_age(older_than: Any) -> timedelta:
    """``older_than`` as a ``timedelta`` from 0 to :data:`~..bounds.MAX_AGE`, else
    :class:`ConfigurationError` (checked first: before the model is looked at)."""
    return bounds.span(older_than, "older_than", bounds.AGE)


def finished_rows(
    model: type[models.Model],
    opts: ClaimOptions,
    *,
    older_than: timedelta,
    states: Sequence[str],
    batch_size: Any,
    using: str | None,
    verb: str,
    hint: str,
) -> Finished | None:
    """The rows to take, or ``None`` when none of ``states`` is mapped by the model.

    :class:`ConfigurationError` when the model has no ``finished_at`` (``hint`` says what
    to do), when ``states`` holds a state that is not terminal (``verb``: ``prune`` /
    ``archive``), or for a ``batch_size`` out of bounds."""
    if not opts.has("finished_at"):
        raise ConfigurationError(
            f"{opts.label} has no finished_at field, so the age of its finished rows is "
            f"unknown; {hint}"
        )
    bad = [s for s in states if s not in TERMINAL_STATES]
    if bad or not states:
        raise ConfigurationError(
            f"can only {verb} finished states ({', '.join(TERMINAL_STATES)}), got {list(states)}"
        )
    mapped = [s for s in states if opts.statuses.get(s) is not None]
    if not mapped:
        return None
    size = bounds.number(batch_size, "batch_size", bounds.BATCH_SIZE)
    db = using or router.db_for_write(model)
    cond = opts.status_q(*mapped) & Q(finished_at__lt=DbNow() - older_than)
    return Finished(cond, size, db)


__all__ = ["Finished", "finished_rows", "older_than_age"]
