"""History out of the hot table: finished rows moved to an archive model.

Finished rows never slow the claim (its index is partial: ``status = 'ready'`` only),
but they make the table, its primary-key index, vacuum, backups and every unfiltered
count grow forever. A claimable model that declares ``ClaimMeta.archive`` keeps them
elsewhere: :func:`archive_finished` (``manage.py taskclaim_prune`` for such a model)
moves its finished rows older than an age into the archive model's table, in short
batches. Each batch is one transaction that locks the rows it picked, copies them
(``INSERT … SELECT``) and deletes them, so at every commit a row is in exactly one of
the two tables; a row requeued meanwhile is not picked (or, picked, stays locked until
the move commits), and a row that is ``ready`` or ``processing`` is never moved.

:func:`archive_of` builds an archive model from a claimable one (same columns, no
indexes, no constraints, foreign keys without database constraints);
:func:`archive_problems` says what makes a declared archive unusable (the system check
``taskclaim.E040`` reports it).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import timedelta
from typing import Any, cast

from django.db import connections, models, transaction
from django.db.models import GeneratedField, Q
from django.db.models.fields import AutoFieldMixin

from django_taskclaim.backends import for_connection
from django_taskclaim.config.options import get_options
from django_taskclaim.db import retry_transient
from django_taskclaim.exceptions import ConfigurationError
from django_taskclaim.recovery.finished import finished_rows, older_than_age

logger = logging.getLogger("django_taskclaim.recovery.prune")

#: The plain integer type an archive keeps an auto-increment primary key in (the
#: archive must store the hot table's ids, not make new ones).
_PLAIN_OF_AUTO: dict[str, type[models.Field]] = {
    "SmallAutoField": models.SmallIntegerField,
    "AutoField": models.IntegerField,
    "BigAutoField": models.BigIntegerField,
}


def copied_fields(model: type[models.Model]) -> list[models.Field]:
    """The fields whose columns a move copies: every concrete column of ``model`` but
    the generated ones (a generated column is computed, never written)."""
    return [
        cast(models.Field, f)
        for f in model._meta.concrete_fields
        if not isinstance(f, GeneratedField)
    ]


def _archive_field(field: models.Field) -> models.Field:
    if field.is_relation and (field.many_to_one or field.one_to_one):
        remote = cast(Any, field.remote_field)
        return models.ForeignKey(
            remote.model,
            on_delete=models.DO_NOTHING,
            db_constraint=False,
            db_index=False,
            related_name="+",
            to_field=remote.field_name,
            null=field.null,
            blank=field.blank,
            db_column=field.column,
            editable=field.editable,
            primary_key=field.primary_key,
        )
    # Not for a relation: deconstructing one needs the app registry ready.
    _name, _path, args, kwargs = field.deconstruct()
    for key in ("unique", "db_index", "primary_key", "db_default", "validators"):
        kwargs.pop(key, None)
    kwargs["db_column"] = field.column
    if field.primary_key:
        kwargs["primary_key"] = True
        if isinstance(field, AutoFieldMixin):
            base = next(k for k in type(field).__mro__ if k.__name__ in _PLAIN_OF_AUTO)
            return _PLAIN_OF_AUTO[base.__name__](**kwargs)
    return type(field)(*args, **kwargs)


def archive_of(
    model: type[models.Model], *, name: str | None = None, db_table: str | None = None
) -> type[models.Model]:
    """A new model with a column for every column of ``model`` (same names and types),
    to name in ``ClaimMeta.archive``; call it at module level of ``models.py`` and run
    ``makemigrations``::

        class Report(ClaimableModel):
            ...
            class ClaimMeta:
                archive = "reports.ReportArchive"

        ReportArchive = archive_of(Report)

    The archive keeps the primary key (an auto-increment one as a plain integer: the
    archive stores the hot table's ids) and drops every index, unique constraint and
    foreign-key constraint, so moving a row never fails on what the hot table allowed.
    Generated columns are left out (their values are derived). ``name`` defaults to
    ``<Model>Archive``; ``db_table`` to Django's default for that name.
    """
    opts = model._meta
    if opts.parents:
        raise ConfigurationError(
            f"{opts.label}: archive_of() does not support multi-table inheritance; "
            "declare the archive model yourself"
        )
    meta: dict[str, Any] = {"app_label": opts.app_label}
    if db_table:
        meta["db_table"] = db_table
    attrs: dict[str, Any] = {
        "__module__": model.__module__,
        "__doc__": f"Finished rows of {opts.label}, moved out of its table.",
        "Meta": type("Meta", (), meta),
        # Never claimed (see config.claim_meta.is_archive), though it has the claim fields.
        "taskclaim_archive_of": opts.label,
    }
    for field in copied_fields(model):
        attrs[field.name] = _archive_field(field)
    return cast(
        type[models.Model], type(name or f"{model.__name__}Archive", (models.Model,), attrs)
    )


def archive_problems(model: type[models.Model]) -> list[str]:
    """What keeps the archive ``model`` declares from taking its rows (empty: none).

    Every copied column of ``model`` (:func:`copied_fields`) must be a concrete,
    non-generated column of the archive; a model other rows point at with a foreign key
    cannot move its rows (deleting them would cascade or fail)."""
    opts = get_options(model)
    target = opts.archive
    if target is None:
        return []
    problems = []
    columns = {
        getattr(f, "column", None)
        for f in target._meta.concrete_fields
        if not isinstance(f, GeneratedField)
    }
    missing = [str(f.column) for f in copied_fields(model) if f.column not in columns]
    if missing:
        problems.append(
            f"{opts.label} ClaimMeta.archive {target._meta.label} has no column(s) "
            f"{', '.join(missing)}; build it with archive_of({model.__name__}) or add them"
        )
    pointing = sorted(
        rel.related_model._meta.label
        for rel in model._meta.related_objects
        if rel.related_model is not target and not rel.many_to_many
    )
    if pointing:
        problems.append(
            f"{opts.label} cannot move its finished rows to an archive: "
            f"{', '.join(pointing)} point(s) at it with a foreign key"
        )
    return problems


def archive_finished(
    model: type[models.Model],
    *,
    older_than: timedelta,
    states: Sequence[str] = ("done", "cancelled"),
    batch_size: int = 1000,
    dry_run: bool = False,
    using: str | None = None,
    max_batches: int | None = None,
) -> int:
    """Move finished rows of ``model`` whose ``finished_at`` is older than
    ``older_than`` to its ``ClaimMeta.archive`` model. Returns the rows moved (or, in a
    ``dry_run``, that would be).

    Only rows in the terminal ``states`` are moved, their age measured on the database's
    clock. Batches go in primary-key order. Each batch of ``batch_size`` rows is one
    transaction: the rows are picked and locked (``FOR UPDATE SKIP LOCKED`` where the
    database has it: a row another transaction holds is left for the next run), copied,
    and deleted by primary key; if the copy and the delete do not count the same rows,
    the batch is rolled back and :class:`ConfigurationError` raised. A row is never in
    both tables, nor in neither, at any commit. ``older_than`` must be a ``timedelta``
    from 0 to 36500 days, else :class:`ConfigurationError` and nothing is moved.
    """
    older_than = older_than_age(older_than)
    opts = get_options(model)
    target = opts.archive
    if target is None:
        raise ConfigurationError(
            f"{opts.label} declares no ClaimMeta.archive; name an archive model "
            "(django_taskclaim.recovery.archive.archive_of builds one) or prune it instead"
        )
    problems = archive_problems(model)
    if problems:
        raise ConfigurationError("; ".join(problems))
    rows = finished_rows(
        model,
        opts,
        older_than=older_than,
        states=states,
        batch_size=batch_size,
        using=using,
        verb="archive",
        hint="add TimestampFieldsMixin",
    )
    if rows is None:
        return 0
    batch_size, db, cond = rows.batch_size, rows.db, rows.cond
    if dry_run:
        return model._base_manager.using(db).filter(cond).count()
    moved = batches = 0
    after: list[Any] = []  # the last primary key moved: each batch starts past it
    while max_batches is None or batches < max_batches:
        batches += 1
        n = retry_transient(
            lambda: _move_batch(model, target, db, cond, batch_size, after),
            db,
            what=f"archive {opts.label}",
        )
        moved += n
        logger.debug("archived model=%s batch=%s rows=%s", opts.label, batches, n)
        if n < batch_size:
            break
    if moved:
        logger.info(
            "archived model=%s rows=%s to=%s older_than=%s",
            opts.label,
            moved,
            target._meta.label,
            older_than,
        )
    return moved


def _move_batch(
    model: type[models.Model],
    target: type[models.Model],
    db: str,
    cond: Q,
    batch_size: int,
    after: list[Any],
) -> int:
    """Move one batch; ``after`` holds the last primary key a batch of this run moved
    and is advanced. Picking past it (keyset order) keeps a batch from stepping over
    the index entries of every row moved before it, which their deletion leaves behind
    until vacuum: without it each batch is slower than the last."""
    connection = connections[db]
    qn = connection.ops.quote_name
    base = model._base_manager.using(db)
    fields = copied_fields(model)
    pk_field = cast(models.Field, model._meta.pk)
    with transaction.atomic(using=db):
        pick = base.filter(cond).order_by("pk")
        if after:
            pick = pick.filter(pk__gt=after[0])
        if connection.features.has_select_for_update_skip_locked:
            pick = pick.select_for_update(skip_locked=True)
        pks = list(pick.values_list("pk", flat=True)[:batch_size])
        if not pks:
            return 0
        # INSERT … SELECT: the ORM compiles the SELECT (the same columns in the same
        # order, the state and age re-checked); only the INSERT head is written here.
        select = base.filter(pk__in=pks).filter(cond).order_by()
        select = select.values_list(*[f.attname for f in fields])
        select_sql, select_params = select.query.get_compiler(db).as_sql()
        vendor = for_connection(connection)
        copy = vendor.copy_rows_sql(
            qn(target._meta.db_table), [qn(str(f.column)) for f in fields], select_sql
        )
        delete = vendor.delete_by_pk_sql(
            qn(model._meta.db_table), qn(str(pk_field.column)), len(pks)
        )
        keys = [pk_field.get_db_prep_value(pk, connection) for pk in pks]
        with connection.cursor() as cursor:
            cursor.execute(copy, select_params)
            copied = cursor.rowcount
            cursor.execute(delete, keys)
            deleted = cursor.rowcount
        if copied != deleted or deleted != len(pks):
            raise ConfigurationError(
                f"archive of {model._meta.label}: {len(pks)} row(s) picked, {copied} "
                f"copied, {deleted} deleted; the batch was rolled back"
            )
    after[:] = [pks[-1]]
    return deleted
