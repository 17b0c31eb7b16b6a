"""The constraint that makes the database enforce a model's concurrency key, as the claim
sees it: :func:`guard_of` finds it among the model's constraints (declared with
:func:`django_taskclaim.model.concurrency_keys.concurrency_constraint`), and
:class:`ConcurrencyGuard` names its table, columns and the field holding the key. The
keyed claim (:mod:`.key_slots`) and the system checks (``taskclaim.E032`` / ``E033``) use
it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

from django.db import models
from django.db.models import Case, F, GeneratedField, Q, UniqueConstraint, Value, When

from django_taskclaim.config.claim_meta import SLOT_FIELD
from django_taskclaim.config.options import ClaimOptions, get_options

__all__ = ["ConcurrencyGuard", "guard_of"]


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
