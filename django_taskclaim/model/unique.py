"""Unique enqueue: "insert this task unless an equal one is already ready or processing".

A model opts in with two declarations: an :class:`ActiveKeyField` (a stored generated
column that holds the row's key while the row is *active*, ``ready`` or ``processing``,
and ``NULL`` otherwise) and a plain ``UniqueConstraint`` on it. ``NULL`` never collides,
so the database refuses a second active row with the same key, and only that. Then
``Model.objects.enqueue_unique(dedupe_key=…, **fields)`` inserts, and on a violation of
*that* constraint returns the active row that holds the key (see
:func:`django_taskclaim.model.unique_insert.insert_unique`).

The same declarations work on PostgreSQL, MariaDB / MySQL and SQLite: MariaDB has no
partial indexes (Django skips a conditional ``UniqueConstraint`` there with
``models.W036``), while a unique index on a stored generated column works everywhere.
See ``docs/unique.md``.

The system check of these declarations (tag ``taskclaim``, ``taskclaim.E030`` /
``E031``: a model with an :class:`ActiveKeyField` but no unique constraint on it, or whose
field no longer matches the model's status field and values) is
:mod:`django_taskclaim.checks.unique`, registered by the AppConfig.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

from django.db import models
from django.db.models import Case, F, Q, When

from django_taskclaim.backends import for_connection
from django_taskclaim.exceptions import ConfigurationError
from django_taskclaim.row.status import Status

logger = logging.getLogger("django_taskclaim.model.unique")

#: The logical states in which a row holds its key: a second row with the same key is
#: refused while one is in them. A retry puts a row back to ``ready``: still active.
ACTIVE_STATES = ("ready", "processing")


def _model_statuses(cls: type[models.Model]) -> tuple[str, list[Any]]:
    """``(status field name, stored values of the active states)`` from ``ClaimMeta``, as
    :func:`django_taskclaim.config.options.get_options` reads them (checked by E031)."""
    meta = getattr(cls, "ClaimMeta", None)
    status_field = getattr(meta, "status_field", "status")
    statuses = getattr(meta, "statuses", None) or {s: Status(s).value for s in ACTIVE_STATES}
    # A state left unmapped is reported by taskclaim.E002; the column stays valid meanwhile.
    return status_field, [statuses[s] for s in ACTIVE_STATES if statuses.get(s) is not None]


def active_key_expression(key_field: str, status_field: str, active_values: Sequence[Any]) -> Case:
    """``CASE WHEN <status> IN (<active values>) THEN <key> END``: the value an
    :class:`ActiveKeyField` stores (``NULL`` when the row is not active)."""
    return Case(When(Q(**{f"{status_field}__in": list(active_values)}), then=F(key_field)))


#: ``Field`` options that define a column's type (copied from the key field).
_TYPE_OPTIONS = ("max_length", "max_digits", "decimal_places", "db_collation")


class ActiveKeyField(models.GeneratedField):
    """A stored generated column: the row's ``key_field`` while its status is ``ready`` or
    ``processing``, ``NULL`` otherwise. Put a ``UniqueConstraint`` on it (check E030)::

        class Report(ClaimableModel):
            dedupe_key = models.CharField(max_length=200, null=True, blank=True)
            active_dedupe_key = ActiveKeyField("dedupe_key")

            class Meta(ClaimableModel.Meta):
                constraints = [
                    models.UniqueConstraint(
                        fields=["active_dedupe_key"], name="report_active_dedupe_key"
                    )
                ]

    The status field and its active values come from the model's ``ClaimMeta``
    (``status_field``, ``statuses``) unless given. ``output_field`` defaults to the key
    field's type, which must then be declared above this field. The database keeps the
    column current on every write, whoever writes; migrations record a plain
    ``GeneratedField``, so they do not import this class.
    """

    def __init__(
        self,
        key_field: str,
        output_field: models.Field[Any, Any] | None = None,
        *,
        status_field: str | None = None,
        active_values: Sequence[Any] | None = None,
        **kwargs: Any,
    ) -> None:
        if not isinstance(key_field, str) or not key_field:
            raise TypeError(f"ActiveKeyField needs the name of the key field, got {key_field!r}")
        for name in ("expression", "db_persist", "unique", "primary_key"):
            if name in kwargs:
                raise TypeError(f"ActiveKeyField does not take {name}=")
        kwargs.setdefault("null", True)
        self.key_field = key_field
        self._status_field = status_field
        self._active_values = None if active_values is None else list(active_values)
        # Both are set in contribute_to_class, from the model this field joins.
        super().__init__(
            expression=cast(Any, None),
            output_field=cast(Any, output_field),
            db_persist=True,
            **kwargs,
        )

    def contribute_to_class(
        self, cls: type[models.Model], name: str, private_only: bool = False
    ) -> None:
        status_field, values = _model_statuses(cls)
        self.status_field = self._status_field or status_field
        self.active_values = self._active_values if self._active_values is not None else values
        self.expression = active_key_expression(
            self.key_field, self.status_field, self.active_values
        )
        if self.output_field is None:
            try:
                key = cls._meta.get_field(self.key_field)
            except Exception:
                raise TypeError(
                    f"{cls.__name__}.{name}: declare the key field {self.key_field!r} above "
                    "this ActiveKeyField, or pass output_field="
                ) from None
            if key.is_relation or not key.concrete:
                raise TypeError(
                    f"{cls.__name__}.{name}: the key field {self.key_field!r} must be a "
                    "plain column (not a relation); pass output_field= for a foreign key's id"
                )
            _, _, _, key_kwargs = key.deconstruct()
            options = {k: key_kwargs[k] for k in _TYPE_OPTIONS if k in key_kwargs}
            self.output_field = type(key)(**options)
        super().contribute_to_class(cls, name, private_only=private_only)

    def deconstruct(self) -> Any:
        name, _path, args, kwargs = super().deconstruct()
        return name, "django.db.models.GeneratedField", args, kwargs

    def clone(self) -> Any:
        """A plain ``GeneratedField`` with the same column (what migrations record)."""
        _name, _path, args, kwargs = self.deconstruct()
        return models.GeneratedField(*args, **kwargs)


@dataclass(frozen=True)
class UniqueKey:
    """A model's active key: the key field, its :class:`ActiveKeyField` and the unique
    constraint over it, with the names a violation reports."""

    model: type[models.Model]
    key_field: str
    field: str
    column: str
    constraint: str

    @property
    def table(self) -> str:
        return str(self.model._meta.db_table)


class SparseUniqueConstraint(models.UniqueConstraint):
    """A ``UniqueConstraint`` over one mostly-``NULL`` column (an :class:`ActiveKeyField`),
    indexed only where the column is set on the databases that have partial indexes.

    ``NULL`` never collides, so ``WHERE <column> IS NOT NULL`` changes nothing the
    constraint allows; it keeps the rows without a key (and every finished row) out of
    the index, so the writes of a claim and a completion do not each add an index entry
    for them. On PostgreSQL and SQLite that is a partial unique index; on MariaDB / MySQL
    (no partial indexes; ``NULL`` entries are cheap there) the plain unique constraint.
    Declared without a condition, it passes check E030 as a plain one does::

        constraints = [SparseUniqueConstraint(fields=["active_dedupe_key"], name="…")]
    """

    def _get_condition_sql(self, model: Any, schema_editor: Any) -> str | None:
        if self.condition is not None or len(self.fields) != 1:
            return super()._get_condition_sql(model, schema_editor)  # type: ignore[misc]
        if not schema_editor.connection.features.supports_partial_indexes:
            return None
        column = model._meta.get_field(self.fields[0]).column
        backend = for_connection(schema_editor.connection)
        return backend.not_null_sql(schema_editor.quote_name(column))


def active_key_fields(model: type[models.Model]) -> list[ActiveKeyField]:
    """The :class:`ActiveKeyField` s of ``model``."""
    return [f for f in model._meta.concrete_fields if isinstance(f, ActiveKeyField)]


def unique_constraint_on(model: type[models.Model], field: str) -> str | None:
    """The name of an unconditional ``UniqueConstraint`` over exactly ``field``, or
    ``None`` (a constraint with a condition is skipped on MariaDB / MySQL)."""
    for constraint in model._meta.constraints:
        if (
            isinstance(constraint, models.UniqueConstraint)
            and tuple(constraint.fields) == (field,)
            and constraint.condition is None
            and not constraint.expressions
            and constraint.deferrable is None
        ):
            return str(constraint.name)
    return None


def unique_key(model: type[models.Model], key_field: str | None = None) -> UniqueKey:
    """The :class:`UniqueKey` of ``model`` for ``key_field`` (may be left out when the
    model has one active key). Raises :class:`ConfigurationError` with the fix."""
    label = model._meta.label
    found = active_key_fields(model)
    if key_field is not None:
        found = [f for f in found if f.key_field == key_field]
    if not found:
        what = f"for {key_field!r} " if key_field is not None else ""
        raise ConfigurationError(
            f"{label} has no ActiveKeyField {what}to enqueue uniquely by; add "
            "ActiveKeyField('<key field>') and a UniqueConstraint on it (docs/unique.md)"
        )
    if len(found) > 1:
        names = ", ".join(sorted(f.key_field for f in found))
        raise ConfigurationError(f"{label} has several active keys ({names}): pass key_field=")
    field = found[0]
    constraint = unique_constraint_on(model, field.name)
    if constraint is None:
        raise ConfigurationError(
            f"{label}.{field.name} has no UniqueConstraint(fields=[{field.name!r}]) without "
            "a condition: nothing would stop a duplicate (system check taskclaim.E030)"
        )
    return UniqueKey(model, field.key_field, field.name, str(field.column), constraint)
