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

from django.conf import settings
from django.core import checks
from django.db import models, router
from django.db.models import Case, F, GeneratedField, Q, UniqueConstraint, Value, When
from django.utils.translation import gettext_lazy as _

from django_taskclaim.backends import for_engine
from django_taskclaim.config.options import SLOT_FIELD, ClaimOptions, checked_models, get_options
from django_taskclaim.config.settings import CHECK_TAG
from django_taskclaim.exceptions import TaskClaimError
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


def _hint(opts: ClaimOptions) -> str:
    conc = opts.concurrency
    assert conc is not None
    slot = conc.limit > 1
    lines = []
    if slot and conc.slot is None:
        lines.append("add `concurrency_slot = concurrency_slot()`")
    lines.append(
        f'PostgreSQL / SQLite: add `concurrency_constraint("{conc.key}"'
        f"{', slot=True' if slot else ''})` to Meta.constraints"
    )
    lines.append(
        f'MariaDB / MySQL: add `{conc.key}_held = processing_key("{conc.key}", <field of '
        f'its type>)` and `concurrency_constraint("{conc.key}_held", generated=True'
        f"{', slot=True' if slot else ''})`"
    )
    return (
        "; ".join(lines) + " (from django_taskclaim.model.concurrency_keys), then makemigrations."
    )


@checks.register(checks.Tags.models, CHECK_TAG)
def check_concurrency_keys(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """``taskclaim.E032``: a model with ``ClaimMeta.concurrency_key`` has no unique
    constraint enforcing it; ``taskclaim.E033``: its constraint is partial and its
    database ignores partial constraints (MariaDB / MySQL)."""
    errors: list[checks.CheckMessage] = []
    for model in checked_models(app_configs):
        try:
            opts = get_options(model)
        except TaskClaimError:
            continue  # reported by taskclaim.E002
        if opts.concurrency is None:
            continue
        guard = guard_of(model)
        if guard is None:
            errors.append(
                checks.Error(
                    f"{opts.label} declares concurrency_key {opts.concurrency.key!r} "
                    f"(limit {opts.concurrency.limit}) but no unique constraint enforces it.",
                    hint=_hint(opts),
                    obj=model,
                    id="taskclaim.E032",
                )
            )
            continue
        if guard.partial:
            backend = for_engine(settings.DATABASES.get(router.db_for_write(model), {}))
            if backend is not None and not backend.partial_unique_constraints:
                errors.append(
                    checks.Error(
                        f"{opts.label}: the constraint {guard.name!r} is partial and its "
                        f"database ignores partial constraints ({backend.vendor}).",
                        hint=_hint(opts),
                        obj=model,
                        id="taskclaim.E033",
                    )
                )
    return errors
