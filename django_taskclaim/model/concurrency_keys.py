"""Per-key concurrency: the database constraint that enforces it, and its system check.

A model with ``ClaimMeta.concurrency_key = "customer_id"`` never has more than
``ClaimMeta.concurrency_limit`` (default 1) rows ``processing`` per ``customer_id`` at
once, because a unique constraint that follows the status says so:

- :func:`concurrency_constraint` — the constraint, one line in ``Meta.constraints``.
  On PostgreSQL and SQLite it is partial: unique ``(key)`` (or ``(key,
  concurrency_slot)``) over the ``processing`` rows only.
- :func:`processing_key` — for MariaDB / MySQL, which have no partial indexes: a stored
  generated column equal to the key while the row is ``processing`` and ``NULL``
  otherwise; a plain unique constraint on it (``concurrency_constraint(…,
  generated=True)``) then works on all three databases (``NULL`` never collides).
- :func:`concurrency_slot` — the slot field a limit above 1 needs: each claim writes a
  free slot number ``0 … limit-1`` and the constraint covers ``(key, slot)``.

:func:`django_taskclaim.claim.guard.guard_of` finds the constraint on a model (the claim
fills slots through it); the system check ``taskclaim.E032`` refuses a keyed model without
one, ``taskclaim.E033`` a partial one on a database that ignores partial constraints.
"""

from __future__ import annotations

from typing import Any

from django.db import models
from django.db.models import Case, F, GeneratedField, Q, UniqueConstraint, Value, When
from django.utils.translation import gettext_lazy as _

from django_taskclaim.config.claim_meta import SLOT_FIELD
from django_taskclaim.row.status import Status

__all__ = [
    "concurrency_constraint",
    "concurrency_slot",
    "processing_key",
]


def processing_key(
    key: str,
    output_field: models.Field,
    *,
    status_field: str = "status",
    processing: Any = Status.PROCESSING.value,
) -> GeneratedField:
    """A stored generated column that equals the field ``key`` while the row is
    ``processing`` and is ``NULL`` otherwise; ``output_field`` is a field of the key's
    type (``models.IntegerField()``). It follows the status by itself: every write that
    moves a row out of ``processing`` (complete, fail, retry, release, reap, cancel)
    clears it in the same statement. Unique by :func:`concurrency_constraint` with
    ``generated=True``."""
    return GeneratedField(
        expression=Case(When(Q(**{status_field: processing}), then=F(key)), default=Value(None)),
        output_field=output_field,
        db_persist=True,
        null=True,
        verbose_name=_("held key"),
    )


def concurrency_slot() -> models.PositiveSmallIntegerField:
    """The ``concurrency_slot`` field a ``concurrency_limit`` above 1 needs: the claim
    writes a slot number free for the row's key (``0 … limit-1``). Name the field
    ``concurrency_slot``."""
    return models.PositiveSmallIntegerField(
        default=0, editable=False, verbose_name=_("concurrency slot")
    )


def concurrency_constraint(
    field: str,
    *,
    slot: bool = False,
    generated: bool = False,
    status_field: str = "status",
    processing: Any = Status.PROCESSING.value,
    name: str | None = None,
) -> UniqueConstraint:
    """The unique constraint that enforces a model's ``concurrency_key``, for
    ``Meta.constraints``.

    ``field`` is the key field (partial constraint over the ``processing`` rows:
    PostgreSQL, SQLite), or with ``generated=True`` the :func:`processing_key` column
    (plain constraint: every database). ``slot=True`` adds ``concurrency_slot`` (needed
    for a ``concurrency_limit`` above 1). The default name is
    ``<app_label>_<class>_<field>_conc``, cut to fit every database's limit."""
    fields = [field, SLOT_FIELD] if slot else [field]
    if name is None:
        name = f"%(app_label).12s_%(class).16s_{field[:20]}_conc"
    if generated:
        return UniqueConstraint(fields=fields, name=name)
    return UniqueConstraint(fields=fields, condition=Q(**{status_field: processing}), name=name)
