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

:func:`guard_of` finds the constraint on a model; the system check ``taskclaim.E032``
refuses a keyed model without one, ``taskclaim.E033`` a partial one on a database that
ignores partial constraints.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

from django.db import models
from django.db.models import Case, F, GeneratedField, Q, UniqueConstraint, Value, When
from django.utils.translation import gettext_lazy as _

from django_taskclaim.config.claim_meta import SLOT_FIELD
from django_taskclaim.config.options import ClaimOptions, get_options
from django_taskclaim.model.status import Status

__all__ = [
    "ConcurrencyGuard",
    "concurrency_constraint",
    "concurrency_slot",
    "guard_of",
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


@dataclass(frozen=True)
class ConcurrencyGuard:
    """The unique constraint enforcing a model's concurrency key: its name, its
    (unquoted) table and columns, whether it is partial (has a condition), and the
    field holding the key."""

    name: str
    table: str
    columns: tuple[str, ...]
    partial: bool
    #: The constrained field that holds the key: the key itself (partial form) or the
    #: generated column (NULL unless processing), for lookups its index serves.
    held: str


def _follows_status(field: Any, opts: ClaimOptions, key: str) -> bool:
    """Whether ``field`` is a generated column equal to ``key`` while processing, else NULL."""
    if not isinstance(field, GeneratedField):
        return False
    expr = cast(Any, field).expression
    if not isinstance(expr, Case) or len(expr.cases) != 1:
        return False
    when = expr.cases[0]
    default = expr.default
    return (
        isinstance(when, When)
        and when.condition == Q(**{opts.status_field: opts.value("processing")})
        and when.result == F(key)
        and isinstance(default, Value)
        and default.value is None
    )


def guard_of(model: type[models.Model]) -> ConcurrencyGuard | None:
    """The constraint of ``model`` that makes the database enforce its concurrency key,
    or ``None`` when it has none (or no key). A limit of 1 accepts a constraint on the
    key alone; any limit accepts one on (key, ``concurrency_slot``)."""
    opts = get_options(model)
    conc = opts.concurrency
    if conc is None:
        return None
    meta = model._meta
    held = {conc.key: False}  # field name -> is a generated "processing key"
    for field in meta.concrete_fields:
        if _follows_status(field, opts, conc.key):
            held[field.name] = True
    wanted_sets = []
    if conc.slot is not None:
        wanted_sets.append(lambda f: {f, SLOT_FIELD})
    if conc.limit == 1:
        wanted_sets.append(lambda f: {f})
    for constraint in meta.constraints:
        if not isinstance(constraint, UniqueConstraint) or not constraint.fields:
            continue
        if constraint.expressions or constraint.deferrable or getattr(constraint, "include", None):
            continue
        names = set(constraint.fields)
        for field_name, generated in held.items():
            if not any(names == wanted(field_name) for wanted in wanted_sets):
                continue
            condition = constraint.condition
            if generated and condition is not None:
                continue
            if not generated and condition != Q(**{opts.status_field: opts.value("processing")}):
                continue
            return ConcurrencyGuard(
                name=str(constraint.name),
                table=str(meta.db_table),
                columns=tuple(
                    str(meta.get_field(f).column)  # type: ignore[union-attr]
                    for f in constraint.fields
                ),
                partial=condition is not None,
                held=field_name,
            )
    return None
