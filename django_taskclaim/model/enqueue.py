"""Bulk enqueue for producers: :func:`enqueue_many` writes many ready rows in one INSERT
per batch and wakes the workers once, after the commit.

``create()`` per row costs a round trip and Django's per-row ``save()`` machinery; this
is ``bulk_create()`` with the claim state checked and set the way ``create()`` leaves it
(``ready``, token 0, no lease, no attempts, ``created_at`` from the database clock) and
the wake-up that ``bulk_create()`` does not send (:func:`~django_taskclaim.wakeup.notify.notify`).
What ``enqueue_many()`` on a claimable queryset runs (:mod:`.queryset`). See
``docs/claiming.md``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import models, router, transaction
from django.db.models.base import ModelState
from django.db.models.expressions import DatabaseDefault
from django.utils import timezone

from django_taskclaim.config import bounds
from django_taskclaim.config.claim_meta import CLAIM_STATE_FIELDS, SLOT_FIELD
from django_taskclaim.config.options import ClaimOptions, get_options
from django_taskclaim.db import retry_transient
from django_taskclaim.exceptions import ConfigurationError, DependencyError, NotClaimableError
from django_taskclaim.settle.dependents import plan_after, seal_after, write_edges
from django_taskclaim.wakeup.notify import notify

#: Fields a producer may not set: the library writes them (``created_at`` is the FIFO key,
#: from the database clock). The status may be given only as the ``ready`` value.
PRODUCER_FORBIDDEN = CLAIM_STATE_FIELDS | {SLOT_FIELD, "created_at"}


def _forbidden(opts: ClaimOptions, model: type[models.Model]) -> dict[str, models.Field]:
    """The concrete fields of ``model`` a producer must leave alone (by name and attname)."""
    found: dict[str, models.Field] = {}
    for field in model._meta.concrete_fields:
        if field.name in PRODUCER_FORBIDDEN:
            found[field.name] = field
            found[field.attname] = field
    return found


def _field_names(model: type[models.Model]) -> set[str]:
    names: set[str] = set()
    for field in model._meta.concrete_fields:
        names.add(field.name)
        names.add(field.attname)
    return names


def _check_run_after(opts: ClaimOptions, obj: models.Model, label: str, i: int) -> None:
    if not opts.has("run_after") or not settings.USE_TZ:
        return
    when = getattr(obj, "run_after", None)
    if isinstance(when, datetime) and timezone.is_naive(when):
        raise ValueError(
            f"enqueue_many() on {label}: row {i} has a naive run_after {when!r} (USE_TZ is "
            "on); use django.utils.timezone.now() + timedelta(...)"
        )


def build_rows(model: type[models.Model], rows: Iterable[Any]) -> list[Any]:
    """The unsaved instances ``rows`` stand for (model instances, or mappings of field
    values), each checked and left in the claim state ``create()`` leaves: ``ready``, the
    claim bookkeeping at its defaults. Raises a one-line ``TypeError`` (a row of another
    model, an unknown field) or ``ValueError`` (a claim-state field set, a saved
    instance, a naive ``run_after``) before anything is written."""
    if isinstance(rows, (Mapping, models.Model, str, bytes)):
        raise TypeError(
            f"enqueue_many() takes an iterable of rows (instances or dicts), "
            f"not one {type(rows).__name__}"
        )
    opts = get_options(model)
    label = opts.label
    forbidden = _forbidden(opts, model)
    names = _field_names(model)
    status_attname = next(
        f.attname for f in model._meta.concrete_fields if f.name == opts.status_field
    )
    ready = opts.value("ready")
    claim_fields = [(f, f.get_default()) for f in {f.name: f for f in forbidden.values()}.values()]
    out: list[Any] = []
    for i, row in enumerate(rows):
        if isinstance(row, Mapping):
            unknown = [k for k in row if k not in names]
            if unknown:
                raise TypeError(
                    f"enqueue_many() on {label}: row {i} names unknown field(s) "
                    f"{', '.join(map(repr, unknown))}"
                )
            bad = [k for k in row if k in forbidden]
            if bad:
                raise ValueError(
                    f"enqueue_many() on {label}: row {i} sets {bad[0]!r}, a claim-state field "
                    "the library writes; leave it out"
                )
            for key in (opts.status_field, status_attname):
                if key in row and row[key] != ready:
                    raise ValueError(
                        f"enqueue_many() on {label}: row {i} has {opts.status_field}="
                        f"{row[key]!r}; rows are enqueued ready ({ready!r}) or not at all"
                    )
            obj = model(**row)
        elif isinstance(row, models.Model):
            if type(row) is not model:
                raise TypeError(
                    f"enqueue_many() on {label} got a {type(row)._meta.label} row (row {i}), "
                    f"not a {label}"
                )
            if not row._state.adding:
                raise ValueError(
                    f"enqueue_many() on {label}: row {i} ({row!r}) is already saved; "
                    "pass unsaved instances or dicts"
                )
            for field, default in claim_fields:
                value = row.__dict__.get(field.attname)
                if isinstance(value, DatabaseDefault) or value == default:
                    continue
                raise ValueError(
                    f"enqueue_many() on {label}: row {i} sets {field.name}={value!r}, a "
                    "claim-state field the library writes; leave it at its default"
                )
            obj = row
        else:
            raise TypeError(
                f"enqueue_many() on {label}: row {i} is a {type(row).__name__}, "
                f"not a {label} or a dict of its field values"
            )
        status = obj.__dict__.get(status_attname)
        if status is None or isinstance(status, DatabaseDefault):
            setattr(obj, status_attname, ready)
        elif status != ready:
            raise ValueError(
                f"enqueue_many() on {label}: row {i} has {opts.status_field}={status!r}; "
                f"rows are enqueued ready ({ready!r}) or not at all"
            )
        _check_run_after(opts, obj, label, i)
        out.append(obj)
    return out


def create_after(
    queryset: models.QuerySet, fields: dict[str, Any], after: Any, on_failure: str
) -> Any:
    """``create(**fields)`` of a row that waits for the rows ``after`` (docs/workflows.md):
    the row, its edges and, last, the lock on its unsettled prerequisites (held to the
    commit only: see ``seal_after``) in one transaction; it starts
    ``waiting`` (or ``ready`` when every prerequisite is done already, or ``cancelled``
    when one failed and ``on_failure`` is ``cancel``). The body of ``create(after=…)``."""
    model = queryset.model
    if model._meta.proxy:
        model = model._meta.concrete_model
    obj, using = model(**fields), queryset.db
    # A deadlock with a settle of a prerequisite is retried whole (outside the caller's
    # own transaction, as every retry), each try from the row as built.
    restore = _restorer([obj])

    def insert() -> Any:
        restore()
        return insert_after(model, obj, after, on_failure, using)

    return retry_transient(insert, using, what="create after=")


def insert_after(
    model: type[models.Model], obj: Any, after: Any, on_failure: str, using: str
) -> Any:
    """Insert the unsaved ``obj`` of ``model`` waiting for the rows ``after``, with its
    edges, in one transaction (see :func:`create_after`); return it. Raises
    :class:`~django_taskclaim.exceptions.DependencyError` before anything is written."""
    with transaction.atomic(using=using):
        plan = plan_after(model, after, using, on_failure=on_failure, rows=[obj])
        plan.apply(get_options(model), obj)
        obj.save(force_insert=True, using=using)  # a ready row notifies from post_save
        write_edges(plan, model, [obj], using)
        seal_after(plan, model, [obj], using)  # last: the prerequisites' locks, to the commit
    return obj


def enqueue_rows(
    queryset: models.QuerySet,
    rows: Iterable[Any],
    *,
    batch_size: int | None = None,
    after: Any = None,
    on_failure: str = "cancel",
) -> list[Any]:
    """Insert ``rows`` (instances or dicts) into ``queryset``'s model on its database,
    ready (or waiting for the rows ``after``, see :func:`create_after`), and wake the
    workers once after the commit; return the saved instances.

    The body of :func:`enqueue_many` and ``ClaimQuerySet.enqueue_many()``."""
    model = queryset.model
    if model._meta.proxy:
        model = model._meta.concrete_model
    try:
        get_options(model)
    except NotClaimableError as exc:
        raise NotClaimableError(f"enqueue_many(): {exc}") from None
    if batch_size is not None:
        batch_size = int(
            bounds.number(batch_size, "batch_size", bounds.BATCH_SIZE, error=ValueError)
        )
    objs = build_rows(model, rows)
    if not objs:
        return objs
    using = queryset.db
    if after is None and on_failure != "cancel":
        raise DependencyError(f"enqueue_many() on {model._meta.label}: on_failure= needs after=")
    if after is not None:
        # As create(after=…): a deadlock with a settle of a prerequisite is retried
        # whole, each try from the rows as built (see _restorer).
        restore = _restorer(objs)

        def insert() -> list[Any]:
            restore()
            return insert_many_after(model, objs, after, on_failure, using, batch_size)

        return retry_transient(insert, using, what="enqueue_many after=")
    _insert(model, objs, using, batch_size)
    notify(model, using=using)  # bulk_create sends no post_save: the one wake-up
    return objs


def insert_many_after(
    model: type[models.Model],
    objs: list[Any],
    after: Any,
    on_failure: str,
    using: str,
    batch_size: int | None,
) -> list[Any]:
    """Insert the unsaved ``objs`` of ``model``, each waiting for the rows ``after``, with
    their edges, in one transaction (see :func:`enqueue_rows`); wake the workers after
    the commit when they start ``ready``. Raises
    :class:`~django_taskclaim.exceptions.DependencyError` before anything is written."""
    with transaction.atomic(using=using):
        plan = plan_after(model, after, using, on_failure=on_failure, rows=objs)
        opts = get_options(model)
        for obj in objs:
            plan.apply(opts, obj)
        _insert(model, objs, using, batch_size)
        write_edges(plan, model, objs, using)
        seal_after(plan, model, objs, using)  # last: the prerequisites' locks, to the commit
        if plan.state == "ready":
            notify(model, using=using)
    return objs


def _restorer(objs: list[Any]) -> Callable[[], None]:
    """A function putting the unsaved ``objs`` back as they are now, called before each
    try of an insert that may be retried: a rolled-back try leaves on them the primary
    keys and database defaults the database returned, and ``_state`` saved; the next try
    starts from the rows as built (a no-op before the first)."""
    saved = [{k: v for k, v in obj.__dict__.items() if k != "_state"} for obj in objs]

    def restore() -> None:
        for obj, fields in zip(objs, saved, strict=True):
            obj.__dict__.clear()
            obj.__dict__.update(fields)
            obj._state = ModelState()

    return restore


def _insert(model: type[models.Model], objs: list[Any], using: str, batch_size: int | None) -> None:
    manager = model._base_manager.db_manager(using)
    try:
        manager.bulk_create(objs, batch_size=batch_size)
    except ValueError as exc:
        if "multi-table" in str(exc):  # Django's refusal, as one line naming the fix
            raise ConfigurationError(
                f"enqueue_many() on {model._meta.label}: a multi-table inherited model "
                "cannot be inserted in bulk; use create()"
            ) from None
        raise


def enqueue_many(
    model: type[models.Model],
    rows: Iterable[Any],
    *,
    using: str | None = None,
    batch_size: int | None = None,
    after: Any = None,
    on_failure: str = "cancel",
) -> list[Any]:
    """Enqueue many rows of the claimable ``model`` in one INSERT per batch; return them.

    With ``after=[rows…]`` every row waits for those rows (docs/workflows.md):
    it starts ``waiting`` and becomes ``ready`` in the transaction of the last one's
    final settle; ``on_failure`` (``cancel``, ``run``, ``hold``) says what a
    prerequisite that ends ``failed`` or ``cancelled`` does to it; a deadlock with a
    prerequisite's settle is retried whole from the rows as given (outside the caller's
    own transaction).

    ``rows`` are unsaved instances of ``model`` or dicts of field values. Guarantees:
    every row is written ``ready`` with the claim state ``create()`` leaves (token 0, no
    lease, no holder, no attempts, no error, ``created_at`` from the database clock;
    ``run_after`` and ``priority`` as given); the rows of one call commit together (one
    transaction when several statements are needed, or the caller's own); workers are
    woken once per call, after that commit (PostgreSQL ``NOTIFY``), never before. Bad
    input raises before anything is written: ``NotClaimableError`` (model not
    claimable), ``TypeError`` (a row of another model, an unknown field), ``ValueError``
    (a claim-state field set, a status other than ``ready``, a saved instance, a naive
    ``run_after``). Like ``bulk_create()``, no ``pre_save`` / ``post_save`` signal is
    sent and ``save()`` is not called. The returned instances carry their primary keys
    and ``created_at`` on PostgreSQL, MariaDB ≥ 10.5 and SQLite ≥ 3.35; on MySQL they
    come back without them (``pk`` is ``None``).
    """
    using = using or router.db_for_write(model)
    return enqueue_rows(
        model._base_manager.using(using),
        rows,
        batch_size=batch_size,
        after=after,
        on_failure=on_failure,
    )
