"""PostgreSQL: workers woken by the database itself, from a trigger on the table.

With ``ClaimMeta.notify = "trigger"`` (or ``TASKCLAIM_NOTIFY = "trigger"``) the table of a
claimable model carries a row trigger that sends the model's notification whenever a row
is inserted ``ready`` or updated to it — whoever writes it: the ORM, ``bulk_create()``,
``QuerySet.update()``, raw SQL, ``COPY``, another program. The notification goes out when
the writing transaction commits, once per transaction. The process that enqueues sends
nothing itself (the ``post_save`` hook and :func:`~django_taskclaim.wakeup.notify.notify` stay
silent for such a model): an ``INSERT`` in autocommit is one round trip instead of two,
and workers hear of the row as it commits instead of one round trip later.

:func:`sync_notify_triggers` makes the triggers match the models: it creates the trigger
of every model that wants one and lacks it (or whose channel, label, status column or
ready value changed: a fingerprint is kept in the trigger's comment), and drops the
trigger of a model that no longer wants one. It runs after every ``migrate`` of a
PostgreSQL database (``post_migrate``), so a change of the option or of
``TASKCLAIM_NOTIFY_CHANNEL`` takes effect with the next ``migrate``; when there is
nothing to change it only reads ``pg_trigger``. Each change is one short transaction
that waits at most :data:`LOCK_TIMEOUT` for the table's lock (creating a trigger blocks
writes to the table for an instant): a busy table is skipped with a warning, and the next
``migrate`` tries again. Workers poll as well, so a missing trigger delays tasks by at most
one poll interval and loses none.

A trigger depends on the status column it reads, and PostgreSQL refuses to change the type
of such a column (``cannot alter type of a column used in a trigger definition``). So a
``migrate`` that has migrations to run first sets aside the triggers of the apps those
migrations belong to (:func:`set_triggers_aside`, ``pre_migrate``), and the
``post_migrate`` sync puts them back: an ``AlterField`` of the status column takes one
``migrate``. Between the two the table's workers are woken by their poll.
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any

from django.apps import apps
from django.db import DatabaseError, connections, models, router, transaction

from django_taskclaim.backends import for_connection
from django_taskclaim.config.discovery import is_claimable
from django_taskclaim.config.options import get_options
from django_taskclaim.config.settings import taskclaim_settings
from django_taskclaim.exceptions import TaskClaimError

logger = logging.getLogger("django_taskclaim.wakeup.notify")

#: How long a trigger change waits for its table's lock before giving up (it is then
#: tried again by the next ``migrate``).
LOCK_TIMEOUT = "5s"

#: Per database alias: the triggers :func:`set_triggers_aside` dropped for a ``migrate``
#: (table → fingerprint), until its ``post_migrate`` puts them back.
_SET_ASIDE: dict[str, dict[str, str]] = {}


def trigger_models(using: str) -> list[type[models.Model]]:
    """The claimable models whose table lives on ``using`` (per the routers), concrete
    and managed: the tables :func:`sync_notify_triggers` looks at. Not
    :func:`~django_taskclaim.config.discovery.claimable_models`: a model of an app that opts out
    of discovery (``taskclaim_discover = False``) may still ask for its trigger."""
    found = []
    for model in apps.get_models():
        meta = model._meta
        if meta.abstract or meta.proxy or not meta.managed or not is_claimable(model):
            continue
        if router.allow_migrate_model(using, model):
            found.append(model)
    return found


def wants_trigger(model: type[models.Model]) -> bool:
    """Whether ``model`` asks for the notify trigger (its ``notify`` option is
    ``"trigger"``); an invalid option counts as no (the system checks report it)."""
    try:
        return get_options(model).notify == "trigger"
    except TaskClaimError:
        return False


def sync_notify_triggers(
    using: str,
    models_: list[type[models.Model]] | None = None,
    *,
    set_aside: dict[str, str] | None = None,
) -> list[tuple[str, str]]:
    """Create, update or drop the notify triggers of ``models_`` (default:
    :func:`trigger_models`) on the database ``using`` so that exactly the models whose
    ``notify`` option is ``"trigger"`` have one, with the current channel, label, status
    column and ready value. Returns ``(label, what)`` for each change made (``"created"``,
    ``"updated"``, ``"dropped"``, ``"restored"``: put back as it was before
    ``set_aside``, ``"skipped: …"``). ``set_aside`` (table → fingerprint) names the
    triggers :func:`set_triggers_aside` dropped for a migration: each counts as still
    there. A no-op on databases without triggers that notify (anything but PostgreSQL).
    Tables that do not exist (yet) are left alone."""
    conn = connections[using]
    backend = for_connection(conn)
    if not backend.supports_notify_trigger:
        return []
    existing = set(conn.introspection.table_names())
    with conn.cursor() as cursor:
        triggers = backend.notify_trigger_fingerprints(cursor)
    qn = conn.ops.quote_name
    changes = []
    for model in trigger_models(using) if models_ is None else models_:
        table = model._meta.db_table
        if table not in existing:
            continue
        have = triggers.get(table)
        before = have if have is not None else (set_aside or {}).get(table)
        if wants_trigger(model):
            statements, fingerprint = wanted_trigger(model, conn)
            if have == fingerprint:
                continue
            statements.append(
                backend.notify_trigger_comment_sql(qn(table), _quoter(conn)(fingerprint))
            )
            if before is None:
                what = "created"
            else:
                what = "restored" if have is None and before == fingerprint else "updated"
        elif have is not None:
            statements = [backend.drop_notify_trigger_sql(qn(table))]
            what = "dropped"
        elif before is not None:  # set aside for the migration, and no longer wanted
            logger.info("notify trigger dropped model=%s table=%s", model._meta.label, table)
            changes.append((model._meta.label, "dropped"))
            continue
        else:
            continue
        try:
            _apply(conn, statements)
        except DatabaseError as exc:
            what = f"skipped: {str(exc).strip().splitlines()[0] if str(exc).strip() else exc}"
            logger.warning(
                "notify trigger of %s not changed (its workers keep polling; the next "
                "migrate tries again): %s",
                model._meta.label,
                what,
            )
        else:
            logger.info("notify trigger %s model=%s table=%s", what, model._meta.label, table)
        changes.append((model._meta.label, what))
    return changes


def wanted_trigger(model: type[models.Model], conn: Any) -> tuple[list[str], str]:
    """The statements creating ``model``'s notify trigger as it should be now (channel,
    label, status column, ready value), and their fingerprint (kept in the trigger's
    comment)."""
    opts = get_options(model)
    quote = _quoter(conn)
    qn = conn.ops.quote_name
    statements = for_connection(conn).notify_trigger_sql(
        table=qn(model._meta.db_table),
        status=qn(opts.status_column),
        ready=quote(opts.value("ready")),
        channel=quote(str(taskclaim_settings.NOTIFY_CHANNEL)),
        label=quote(model._meta.label),
    )
    return statements, "taskclaim " + hashlib.sha256("\n".join(statements).encode()).hexdigest()


def trigger_state(model: type[models.Model], using: str) -> str:
    """``"ok"`` (as it should be), ``"missing"``, ``"stale"`` (another channel, label,
    status column or ready value) or ``"unwanted"`` (present, not asked for), ``"none"``
    (absent, not asked for): ``model``'s notify trigger on ``using`` (PostgreSQL)."""
    conn = connections[using]
    with conn.cursor() as cursor:
        have = for_connection(conn).notify_trigger_fingerprints(cursor).get(model._meta.db_table)
    if not wants_trigger(model):
        return "none" if have is None else "unwanted"
    if have is None:
        return "missing"
    return "ok" if have == wanted_trigger(model, conn)[1] else "stale"


def _quoter(conn: Any) -> Any:
    """A function making an SQL literal of a value (the driver's quoting, as the schema
    editor writes defaults)."""
    return conn.schema_editor().quote_value


def _apply(conn: Any, statements: list[str]) -> None:
    """Run ``statements`` in one transaction that waits at most :data:`LOCK_TIMEOUT` for a
    lock. They carry their values as quoted literals and are sent without parameters
    (a ``%`` in a literal stays as it is)."""
    timeout = for_connection(conn).set_lock_timeout(LOCK_TIMEOUT)
    with transaction.atomic(using=conn.alias), conn.cursor() as cursor:
        cursor.execute(timeout.sql, timeout.params)
        for sql in statements:
            cursor.execute(sql)


def set_triggers_aside(
    using: str, app_labels: set[str], registries: list[Any] | None = None
) -> dict[str, str]:
    """Drop the notify triggers on the tables of the models of ``app_labels`` (as the
    app registries ``registries`` know them; default: the project's) on the database
    ``using``, so that their migrations may change the columns the triggers read.
    Returns table → fingerprint of each trigger dropped; :func:`on_post_migrate` puts
    them back. A table whose lock cannot be had within :data:`LOCK_TIMEOUT` keeps its
    trigger (with a warning). A no-op on databases without triggers that notify."""
    conn = connections[using]
    backend = for_connection(conn)
    if not backend.supports_notify_trigger or not app_labels:
        return {}
    with conn.cursor() as cursor:
        triggers = backend.notify_trigger_fingerprints(cursor)
    if not triggers:
        return {}
    labels: dict[str, str] = {}
    for registry in registries or [apps]:
        for model in registry.get_models():
            meta = model._meta
            if meta.app_label in app_labels and meta.db_table in triggers:
                labels.setdefault(meta.db_table, meta.label)
    qn = conn.ops.quote_name
    dropped = {}
    for table, label in sorted(labels.items()):
        try:
            _apply(conn, [backend.drop_notify_trigger_sql(qn(table))])
        except DatabaseError as exc:
            logger.warning(
                "notify trigger of %s not set aside for the migration (a migration that "
                "changes a column it reads will fail; migrate again): %s",
                label,
                str(exc).strip().splitlines()[0] if str(exc).strip() else exc,
            )
            continue
        dropped[table] = triggers[table]
        logger.info("notify trigger set aside for the migration model=%s table=%s", label, table)
    return dropped


def on_pre_migrate(using: str = "default", **kwargs: Any) -> None:
    """``pre_migrate`` receiver: when migrations are about to run, set aside the notify
    triggers of their apps (:func:`set_triggers_aside`; the registry of the migration
    state as well as the project's, for a table renamed since) until ``post_migrate``."""
    plan = kwargs.get("plan") or []
    labels = {migration.app_label for migration, _backwards in plan}
    if not labels:
        return
    registries = [apps] + ([kwargs["apps"]] if kwargs.get("apps") is not None else [])
    dropped = set_triggers_aside(using, labels, registries)
    _SET_ASIDE.setdefault(using, {}).update(dropped)
    stdout = kwargs.get("stdout")
    if dropped and kwargs.get("verbosity", 1) >= 2 and stdout is not None:
        for table in dropped:
            stdout.write(f"  taskclaim: notify trigger of table {table} set aside\n")


def on_post_migrate(using: str = "default", **kwargs: Any) -> None:
    """``post_migrate`` receiver: :func:`sync_notify_triggers` on the migrated database,
    putting back the triggers :func:`on_pre_migrate` set aside. Prints each change, not
    a trigger put back as it was (unless ``verbosity`` ≥ 2)."""
    changes = sync_notify_triggers(using, set_aside=_SET_ASIDE.pop(using, {}))
    verbosity = kwargs.get("verbosity", 1)
    stdout = kwargs.get("stdout")
    if changes and verbosity >= 1 and stdout is not None:
        for label, what in changes:
            if what != "restored" or verbosity >= 2:
                stdout.write(f"  taskclaim: notify trigger of {label} {what}\n")
