"""The shape of the claim and lease indexes, written once.

The claim query reads the ``ready`` rows in claim order; the reaper reads the
``processing`` rows by ``locked_until``. The index that serves each is declared here
(:func:`claim_indexes`, which :class:`~django_taskclaim.model.mixins.ClaimableModel` and
the user's ``Meta.indexes`` use), recognised here among a model's declared indexes
(:func:`serves_claim`, :func:`serves_lease`: the system check ``taskclaim.W001`` and the
doctor) and among the database's (:func:`claim_columns_serve`,
:func:`lease_columns_serve`: the doctor, :mod:`django_taskclaim.ops.doctor.indexes`), and
suggested as code here (:func:`claim_index_text`, :func:`lease_index_text`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from django.db import models

from django_taskclaim.row.status import Status

#: The claim order of :class:`~django_taskclaim.model.mixins.ClaimableModel`: the fields
#: of its claim index.
DEFAULT_ORDER = ("-priority", "created_at")
#: The column that orders the lease index (the reaper's).
LEASE_FIELD = "locked_until"


def claim_index(fields: Iterable[str], *, status_field: str, ready: Any, name: str) -> models.Index:
    """The claim query's index: ``fields`` (the claim order) over the ``ready`` rows."""
    return models.Index(fields=list(fields), condition=models.Q(**{status_field: ready}), name=name)


def lease_index(*, status_field: str, processing: Any, name: str) -> models.Index:
    """The reaper's index: ``locked_until`` over the ``processing`` rows."""
    return models.Index(
        fields=[LEASE_FIELD], condition=models.Q(**{status_field: processing}), name=name
    )


def claim_indexes(
    prefix: str,
    *,
    status_field: str = "status",
    ready: Any = Status.READY.value,
    processing: Any = Status.PROCESSING.value,
    order: Iterable[str] = DEFAULT_ORDER,
) -> list[models.Index]:
    """Return the two partial indexes the claim and reaper queries use.

    For models whose table, status values or ordering differ from
    :class:`~django_taskclaim.model.mixins.ClaimableModel`'s: put the result in
    ``Meta.indexes``. ``prefix`` makes the index names (keep it ≤ 24 characters).
    """
    return [
        claim_index(order, status_field=status_field, ready=ready, name=f"{prefix}_claim"),
        lease_index(status_field=status_field, processing=processing, name=f"{prefix}_lease"),
    ]


def _field_names(index: Any) -> list[str]:
    return [f.lstrip("-") for f in getattr(index, "fields", ())]


def serves_claim(index: Any, status_field: str) -> bool:
    """Whether a declared index serves the claim query: partial on the status, or led
    by the status column."""
    names = _field_names(index)
    condition = getattr(index, "condition", None)
    if names and condition is not None and status_field in str(condition):
        return True
    return bool(names) and names[0] == status_field


def serves_lease(index: Any, status_field: str) -> bool:
    """Whether a declared index serves the reap query: led by ``locked_until`` (partial
    on the status, or plain), or by the status then ``locked_until``."""
    names = _field_names(index)
    condition = getattr(index, "condition", None)
    if names[:1] == [LEASE_FIELD] and (condition is None or status_field in str(condition)):
        return True
    return names[:2] == [status_field, LEASE_FIELD]


def has_claim_index(model: Any, status_field: str) -> bool:
    """Whether one of ``model``'s ``Meta.indexes`` serves the claim query."""
    return any(serves_claim(index, status_field) for index in model._meta.indexes)


def serves_status(index: Any, status_field: str, value: Any) -> bool:
    """Whether a declared index finds the rows of one status ``value`` without a scan of
    the table: partial on exactly ``status_field = value`` (what docs/observability.md
    suggests for the ``failed`` rows), or led by the status column."""
    condition = getattr(index, "condition", None)
    if condition is None:
        return _field_names(index)[:1] == [status_field]
    if getattr(condition, "negated", False) or getattr(condition, "connector", "AND") != "AND":
        return False
    return any(
        isinstance(child, tuple)
        and child[0] in (status_field, f"{status_field}__exact")
        and str(child[1]) == str(value)
        for child in getattr(condition, "children", ())
    )


def claim_columns_serve(columns: Sequence[str], status_column: str) -> bool:
    """Whether a database index over ``columns`` (in order), not the one the model
    declares, serves the claim query: one led by the status column."""
    return list(columns[:1]) == [status_column]


def lease_columns_serve(columns: Sequence[str], status_column: str, until_column: str) -> bool:
    """Whether a database index over ``columns`` (in order) can serve the reap query."""
    return list(columns[:1]) == [until_column] or list(columns[:2]) == [
        status_column,
        until_column,
    ]


def claim_index_text(
    fields: list[str], *, status_field: str, ready: Any, name: str, partial: bool
) -> str:
    """The claim index as code to paste into ``Meta.indexes``: partial on ``ready``, or
    (where partial indexes are not enforced) led by the status."""
    if partial:
        return (
            f"models.Index(fields={fields!r}, condition=models.Q({status_field}={ready!r}), "
            f'name="{name}")'
        )
    return f'models.Index(fields={[status_field, *fields]!r}, name="{name}")'


def lease_index_text(*, status_field: str, processing: Any, name: str, partial: bool) -> str:
    """The lease index as code to paste into ``Meta.indexes`` (see :func:`claim_index_text`)."""
    if partial:
        return (
            f"models.Index(fields=[{LEASE_FIELD!r}], condition=models.Q({status_field}="
            f'{processing!r}), name="{name}")'
        )
    return f'models.Index(fields={[status_field, LEASE_FIELD]!r}, name="{name}")'
