"""Retention: deleting old finished rows (``manage.py taskclaim_prune``), or moving them
to the model's archive (:mod:`django_taskclaim.recovery.archive`).

:func:`prune` deletes one model's finished rows older than an age, in short batches
that re-check state and age on the database's clock; :func:`prune_models` does it for
several models (default: every claimable one); :func:`parse_age` reads the command's
``--older-than``.
"""

from __future__ import annotations

import itertools
import logging
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.apps import apps
from django.db import connections, models, router
from django.db.models import Exists, OuterRef, Q

from django_taskclaim.backends.history import KEEP_DAYS, history_sql
from django_taskclaim.config import bounds
from django_taskclaim.config.discovery import claimable_models
from django_taskclaim.config.options import get_options
from django_taskclaim.db import DbNow
from django_taskclaim.exceptions import ConfigurationError
from django_taskclaim.recovery.archive import archive_finished
from django_taskclaim.recovery.finished import finished_rows, older_than_age
from django_taskclaim.settle.leftovers import delete_leftovers

logger = logging.getLogger("django_taskclaim.recovery.prune")


_AGE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_AGE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")


def parse_age(text: str) -> timedelta:
    """``"90s"``, ``"15m"``, ``"12h"``, ``"7d"``, ``"2w"`` as a ``timedelta``, from 0 to
    :data:`~django_taskclaim.config.bounds.MAX_AGE` (36500 days); anything else raises
    :class:`ConfigurationError` in one line naming the text and saying how to write one
    or what the bound is."""
    match = _AGE.match(text or "")
    if not match:
        raise ConfigurationError(
            f"--older-than {text!r} is not a duration; use a number and a unit "
            "(s, m, h, d, w), e.g. --older-than 7d"
        )
    seconds = float(match.group(1)) * _AGE_UNITS[match.group(2)]  # inf for a huge number
    if not seconds <= bounds.MAX_AGE:
        raise ConfigurationError(
            f"--older-than {text!r} is out of range: at most "
            f"{bounds.MAX_AGE / bounds.DAY:g}d (100 years)"
        )
    return timedelta(seconds=seconds)


@dataclass
class PruneResult:
    """Rows deleted (or, in a dry run, that would be) per model label, and the models
    left alone because they have no ``finished_at``."""

    per_model: dict[str, int] = field(default_factory=dict)
    dry_run: bool = False
    skipped: list[str] = field(default_factory=list)
    #: model label → its archive's label, for the models whose rows were moved there
    #: (``ClaimMeta.archive``) instead of deleted
    archived: dict[str, str] = field(default_factory=dict)
    #: rows of the admin charts' per-minute history deleted (older than 7 days)
    history: int = 0
    #: emitted events (``TaskEvent``) deleted, or that a dry run would delete; ``None``:
    #: not pruned (models were named)
    events: int | None = None

    @property
    def total(self) -> int:
        return sum(self.per_model.values())


def keyset_batches(
    scope: models.QuerySet, batch_size: int, max_batches: int | None = None
) -> Iterator[list[Any]]:
    """The primary keys of ``scope``, ``batch_size`` at a time, for a caller that deletes
    each batch before asking for the next. Keyset order: each batch starts past the last
    one's highest key, not over the index entries its deletion leaves behind until vacuum
    (each batch would be slower than the last). Ends after a short batch, or after
    ``max_batches``."""
    pick = scope.order_by("pk")
    for _ in itertools.count() if max_batches is None else range(max_batches):
        pks = list(pick.values_list("pk", flat=True)[:batch_size])
        if not pks:
            return
        yield pks
        if len(pks) < batch_size:
            return
        pick = scope.order_by("pk").filter(pk__gt=pks[-1])


def prune(
    model: type[models.Model],
    *,
    older_than: timedelta,
    states: Sequence[str] = ("done", "cancelled"),
    batch_size: int = 1000,
    dry_run: bool = False,
    using: str | None = None,
    max_batches: int | None = None,
) -> int:
    """Delete finished rows of ``model`` whose ``finished_at`` is older than ``older_than``.

    Only rows in the terminal ``states`` are touched; the age is measured with the
    database's ``now()``. Works in batches of ``batch_size`` primary keys, each deleted
    by a short statement that re-checks state and age, so the table is never locked
    for long and a row requeued meanwhile is kept. Returns the number of rows deleted
    (or that a ``dry_run`` would delete). ``older_than`` must be a ``timedelta`` from 0
    to 36500 days, else :class:`ConfigurationError` and nothing is deleted.
    """
    older_than = older_than_age(older_than)
    opts = get_options(model)
    rows = finished_rows(
        model,
        opts,
        older_than=older_than,
        states=states,
        batch_size=batch_size,
        using=using,
        verb="prune",
        hint="add TimestampFieldsMixin or prune it with your own query",
    )
    if rows is None:
        return 0
    batch_size, db, cond = rows.batch_size, rows.db, rows.cond
    scope = model._base_manager.using(db).filter(cond)
    if dry_run:
        return scope.count()
    deleted = 0
    for batches, pks in enumerate(keyset_batches(scope, batch_size, max_batches), 1):
        _, per = model._base_manager.using(db).filter(pk__in=pks).filter(cond).delete()
        deleted += per.get(model._meta.label, 0)
        # The workflow tables' rows of the rows deleted (a row requeued meanwhile was
        # kept, and its rows with it: only the pks deleted are passed).
        kept = set(model._base_manager.using(db).filter(pk__in=pks).values_list("pk", flat=True))
        delete_leftovers(model, [pk for pk in pks if pk not in kept], db)
        logger.debug("pruned model=%s batch=%s rows=%s", opts.label, batches, len(pks))
    if deleted:
        logger.info("pruned model=%s rows=%s older_than=%s", opts.label, deleted, older_than)
    return deleted


def prune_models(
    models_: Sequence[type[models.Model]] = (),
    *,
    older_than: timedelta,
    states: Sequence[str] = ("done", "cancelled"),
    batch_size: int = 1000,
    dry_run: bool = False,
    using: str | None = None,
) -> PruneResult:
    """:func:`prune` each of ``models_``, or (none named) every claimable model.

    A model that declares ``ClaimMeta.archive`` has its rows moved there instead
    (:func:`~django_taskclaim.recovery.archive.archive_finished`), listed in ``archived``. A
    named model without ``finished_at`` raises :class:`ConfigurationError`; when every
    claimable model is pruned, such a model is listed in ``skipped`` instead. A bad
    ``older_than`` is refused before any model is touched. Unless ``dry_run``, the rows
    of the per-minute history (the admin's charts) older than
    :data:`~django_taskclaim.backends.history.KEEP_DAYS` (7) days are deleted too,
    whatever ``older_than`` (``history``). When no model is named, the events emitted
    more than ``older_than`` ago that no row waits for go too (:func:`prune_events`,
    ``events``).
    """
    older_than = older_than_age(older_than)
    result = PruneResult(dry_run=dry_run)
    for model in models_ or list(claimable_models()):
        opts = get_options(model)
        if not opts.has("finished_at"):
            if models_:
                raise ConfigurationError(
                    f"{opts.label} has no finished_at field, so the age of its finished "
                    "rows is unknown; add TimestampFieldsMixin to it, or leave it out"
                )
            result.skipped.append(opts.label)
            continue
        target = opts.archive
        if target is not None:
            result.archived[opts.label] = target._meta.label
        result.per_model[opts.label] = (prune if target is None else archive_finished)(
            model,
            older_than=older_than,
            states=states,
            batch_size=batch_size,
            dry_run=dry_run,
            using=using,
        )
    if not models_:
        result.events = prune_events(
            older_than=older_than,
            batch_size=batch_size,
            dry_run=dry_run,
            using=using or router.db_for_write(apps.get_model("taskclaim", "TaskEvent")),
        )
    if not dry_run:
        result.history = prune_history(
            using or router.db_for_write(apps.get_model("taskclaim", "TaskHistory"))
        )
    return result


def prune_events(
    *, older_than: timedelta, batch_size: int = 1000, dry_run: bool = False, using: str
) -> int:
    """Delete the events (``emit()``, ``TaskEvent``) emitted more than ``older_than`` ago
    (database clock) that no row still waits for; return how many (or, ``dry_run``, how
    many would go). Batches of ``batch_size``, each re-checking age and waits.

    An event some row waits for is kept however old: the waiting row, made due by the
    emit, reads the payload when it runs again. A wait that starts after its event was
    pruned waits for a new emit (or its timeout), and a new emit of the name wins again;
    an event not emitted yet is never deleted here."""
    older_than = older_than_age(older_than)
    event = apps.get_model("taskclaim", "TaskEvent")
    waits = apps.get_model("taskclaim", "TaskEventWait")._base_manager.using(using)
    old = Q(emitted_at__lt=DbNow() - older_than) & ~Exists(waits.filter(name=OuterRef("name")))
    scope = event._base_manager.using(using).filter(old)
    if dry_run:
        return scope.count()
    deleted = 0
    for pks in keyset_batches(scope, batch_size):
        deleted += event._base_manager.using(using).filter(pk__in=pks).filter(old).delete()[0]
    if deleted:
        logger.info("pruned events=%s older_than=%s", deleted, older_than)
    return deleted


def prune_history(using: str) -> int:
    """Delete the per-minute history rows (the admin's charts) older than
    :data:`~django_taskclaim.backends.history.KEEP_DAYS` days, database clock; return
    how many. The workers do it too, hourly."""
    connection = connections[using]
    sql = history_sql(connection)
    if sql is None:
        return 0
    with connection.cursor() as cursor:
        deleted = sql.prune(cursor, KEEP_DAYS)
    if deleted:
        logger.info("pruned history rows=%s older_than=%sd", deleted, KEEP_DAYS)
    return deleted
