"""What a worker checks of its database before it claims anything, and how it reports a
database that keeps failing.

- :func:`schema_report`: the tables and columns of the models served and the app's own
  tables are in the database, asked of its introspection (one query for the table names
  per database, a few per model table: two on PostgreSQL, four on MariaDB). It runs once
  at start, never per claim; a mismatch stops the worker with one line naming the fix of
  each table: ``manage.py migrate``, or ``makemigrations`` first where the migrations on
  disk do not create what is missing (a field added to a mixin by an upgrade).
- :func:`wait_for_database`: connect and check the schema, retrying a database error
  with backoff. A worker retries for as long as it takes (the database may be starting);
  with ``--burst`` it gives up after :func:`burst_wait` seconds
  (:class:`DatabaseUnavailableError`). Its failures are an
  :class:`~django_taskclaim.worker.service.Outage` (the worker's one outage tracker):
  reported at once and then every :data:`~django_taskclaim.worker.service.WARN_EVERY`
  seconds while it lasts.
- :func:`refusal`: both, for :class:`~django_taskclaim.worker.process.Worker`: the exit
  code of a worker that must not start, its reason logged in one line.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.apps import apps
from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections, router
from django.db.models import Model

from django_taskclaim.backends import for_alias
from django_taskclaim.config.settings import taskclaim_settings
from django_taskclaim.exceptions import TaskClaimError
from django_taskclaim.worker.dbconn import close
from django_taskclaim.worker.exits import EXIT_CONFIG, EXIT_OK, EXIT_UNAVAILABLE
from django_taskclaim.worker.service import Outage

logger = logging.getLogger("django_taskclaim.worker")


def burst_wait() -> float:
    """Seconds a ``--burst`` worker retries a database that fails (unreachable at start,
    or every claim failing) before it exits with
    :data:`~django_taskclaim.worker.exits.EXIT_UNAVAILABLE`: ``TASKCLAIM_BURST_GIVE_UP``
    (30 s by default)."""
    return float(taskclaim_settings.BURST_GIVE_UP)


class DatabaseUnavailableError(TaskClaimError):
    """A ``--burst`` worker's database kept failing for :func:`burst_wait` seconds."""


class DatabaseMissingError(TaskClaimError):
    """The database named in the settings does not exist on its server: no wait helps."""


def missing_database_line(using: str) -> str:
    """One line naming the database that does not exist, and the fix."""
    name = connections[using].settings_dict.get("NAME")
    return (
        f"database {name!r} (DATABASES[{using!r}]) does not exist on its server: create it, "
        f"or fix DATABASES[{using!r}]['NAME'], then run python manage.py migrate"
    )


def migrate_fix(using: str) -> str:
    """``run python manage.py migrate`` (with ``--database`` for another alias)."""
    extra = "" if using == DEFAULT_DB_ALIAS else f" --database {using}"
    return f"run python manage.py migrate{extra}"


def makemigrations_fix(app_label: str, using: str) -> str:
    """``run python manage.py makemigrations <app>, then ...migrate``: the fix of a table
    or column that the migrations of ``app_label`` do not create."""
    return f"run python manage.py makemigrations {app_label}, then {migrate_fix(using)[4:]}"


@dataclass(frozen=True)
class SchemaProblem:
    """One thing the database lacks (:func:`schema_report`) and who makes it.

    ``what``: the phrase (``"table app_doc has no column note"``); ``app_label``: the app
    of the model whose table it is; ``unmigrated``: the migrations of that app on disk
    do not create it either (the model changed after its last migration, typically an
    upgrade that added a field to a mixin), so ``migrate`` alone has nothing to apply:
    ``makemigrations`` first. Otherwise a migration makes it and ``migrate`` is the fix
    (always so for the app's own tables, whose migrations ship with it)."""

    what: str
    app_label: str
    unmigrated: bool = False
    #: the database the table belongs on, where it is not the one checked
    database: str | None = None

    def fix(self, using: str) -> str:
        """The command that makes what is missing, as ``run python manage.py ...``."""
        using = self.database or using
        if self.unmigrated:
            return makemigrations_fix(self.app_label, using)
        return migrate_fix(using)

    def line(self, using: str) -> str:
        """``what`` and its fix: ``"table b_job has no column claimed_at: run ..."``."""
        return f"{self.what}: {self.fix(using)}"


def _app_models() -> list[type[Model]]:
    """The app's own concrete models (registry, lease locks, periodic slots)."""
    app = apps.get_containing_app_config(__name__)
    return [] if app is None else [m for m in app.get_models() if m._meta.managed]


class _OnDisk:
    """The models as the migration files on disk leave them (no database is asked),
    loaded on first use: only a schema that does not match pays for reading them."""

    def __init__(self) -> None:
        self._state: Any = None
        self._unmigrated: set[str] = set()
        self._failed = False

    def _load(self) -> None:
        if self._state is not None or self._failed:
            return
        try:
            from django.db.migrations.loader import MigrationLoader

            loader = MigrationLoader(None, ignore_no_migrations=True)
            self._state = loader.project_state()
            self._unmigrated = set(loader.unmigrated_apps)
        except Exception:  # unreadable migrations: no advice beyond migrate
            logger.debug("could not read the migrations on disk", exc_info=True)
            self._failed = True

    def lacks(self, model: type[Model], field_names: Iterable[str] = ()) -> bool:
        """Whether the migrations on disk create neither ``model``'s table (no
        ``field_names``) or do not create its fields ``field_names``."""
        self._load()
        if self._failed:
            return False
        label = model._meta.app_label
        if label in self._unmigrated:
            return True
        found = self._state.models.get((label, model._meta.model_name))
        if found is None:
            return True
        return any(name not in found.fields for name in field_names)


def schema_report(
    models: Iterable[type[Model]], using: str, *, app_tables: bool = True
) -> list[SchemaProblem]:
    """What the database ``using`` lacks of ``models`` (each table, each column of their
    concrete fields, parents' tables included) and, with ``app_tables``, of the app's own
    tables on the databases they are routed to: one :class:`SchemaProblem` per table,
    empty when all is there. A table or column that the migrations on disk do not create
    either is marked ``unmigrated`` (its fix is ``makemigrations``, then ``migrate``).

    Cheap: one introspection query for the table names of each database, a few per model
    table (two on PostgreSQL, four on MariaDB/MySQL, in-process PRAGMAs on SQLite); the
    migration files are read only when something is missing.
    Raises :class:`~django.db.DatabaseError` when a database cannot be asked.
    """
    problems: list[SchemaProblem] = []
    tables: dict[str, set[str]] = {}
    on_disk = _OnDisk()

    def present(alias: str) -> set[str]:
        if alias not in tables:
            conn = connections[alias]
            with conn.cursor() as cursor:
                names = conn.introspection.table_names(cursor, include_views=True)
            tables[alias] = {name.lower() for name in names}
        return tables[alias]

    seen: set[str] = set()
    for model in models:
        concrete = model._meta.concrete_model or model
        for part in (concrete, *concrete._meta.get_parent_list()):
            table = part._meta.db_table
            if table in seen:
                continue
            seen.add(table)
            app_label = part._meta.app_label
            if table.lower() not in present(using):
                problems.append(
                    SchemaProblem(f"table {table} is missing", app_label, on_disk.lacks(part))
                )
                continue
            conn = connections[using]
            with conn.cursor() as cursor:
                description = conn.introspection.get_table_description(cursor, table)
            columns = {column.name.lower() for column in description}
            missing = [
                f
                for f in part._meta.local_concrete_fields
                if f.column and f.column.lower() not in columns
            ]
            if missing:
                plural = "s" if len(missing) > 1 else ""
                names = ", ".join(str(f.column) for f in missing)
                what = f"table {table} has no column{plural} {names}"
                unmigrated = on_disk.lacks(part, [f.name for f in missing])
                problems.append(SchemaProblem(what, app_label, unmigrated))
    if app_tables:
        for model in _app_models():
            alias = router.db_for_write(model)
            if not router.allow_migrate_model(alias, model):
                continue
            table = model._meta.db_table
            if table.lower() not in present(alias):
                where = "" if alias == using else f" on database {alias!r}"
                problems.append(
                    SchemaProblem(
                        f"table {table} is missing{where}",
                        model._meta.app_label,
                        database=None if alias == using else alias,
                    )
                )
    return problems


def schema_problems(
    models: Iterable[type[Model]], using: str, *, app_tables: bool = True
) -> list[str]:
    """:func:`schema_report` as phrases (``"table app_doc has no column note"``), empty
    when all is there."""
    return [p.what for p in schema_report(models, using, app_tables=app_tables)]


def schema_fix(problems: Iterable[SchemaProblem], using: str) -> str:
    """The fix of all of ``problems`` at once: ``makemigrations`` of each app whose
    migrations lack something, then ``migrate``; ``migrate`` alone when none does."""
    labels = sorted({p.app_label for p in problems if p.unmigrated})
    if not labels:
        return migrate_fix(using)
    return makemigrations_fix(" ".join(labels), using)


def describe_problems(problems: list[SchemaProblem], using: str) -> str:
    """One line for the problems :func:`schema_report` found, each table with its fix
    (``migrate``, or ``makemigrations`` first where the migrations lack it)."""
    return (
        f"the schema of database {using!r} does not match the models: "
        f"{'; '.join(p.line(using) for p in problems)}"
    )


def wait_for_database(
    models: Iterable[type[Model]],
    using: str,
    *,
    stopping: threading.Event,
    wake: threading.Event,
    worker_id: str,
    burst: bool,
) -> list[SchemaProblem] | None:
    """Connect to ``using`` and return :func:`schema_report` (empty: the worker may
    start), retrying a database error with backoff (reported by an :class:`Outage`);
    ``None`` if ``stopping`` is set meanwhile (``wake`` cuts a backoff short). With
    ``burst``, raise :class:`DatabaseUnavailableError` once the failures have lasted
    :func:`burst_wait` seconds."""
    models = list(models)
    outage = Outage(
        f"connect to {using!r}",
        worker_id,
        using=using,
        give_up_after=burst_wait() if burst else None,
    )
    while not stopping.is_set():
        try:
            connections[using].ensure_connection()
            problems = schema_report(models, using)
        except DatabaseError as exc:
            close(using)
            if for_alias(using).is_unknown_database(exc):
                raise DatabaseMissingError(missing_database_line(using)) from None
            outage.failed(exc)
            if outage.exhausted():
                raise DatabaseUnavailableError(outage.give_up_line(using)) from None
            delay = outage.delay()
            if outage.give_up_after is not None:
                delay = max(0.0, min(delay, outage.give_up_after - outage.lasted()))
            wake.wait(delay)
            wake.clear()
            continue
        outage.ok()
        return problems
    return None


def refusal(
    models: Iterable[type[Model]],
    using: str,
    *,
    stopping: threading.Event,
    wake: threading.Event,
    worker_id: str,
    burst: bool,
) -> int | None:
    """Before a worker starts: :func:`wait_for_database` and check the schema. The exit
    code of a worker that must not start, its reason logged in one line (``EXIT_OK``:
    stopped while waiting), else ``None``."""
    try:
        problems = wait_for_database(
            models, using, stopping=stopping, wake=wake, worker_id=worker_id, burst=burst
        )
    except DatabaseUnavailableError as exc:
        logger.error("%s worker=%s", exc, worker_id)
        return EXIT_UNAVAILABLE
    except DatabaseMissingError as exc:
        logger.error("%s worker=%s", exc, worker_id)
        return EXIT_CONFIG
    if problems is None:
        return EXIT_OK
    if problems:
        logger.error("%s worker=%s", describe_problems(problems, using), worker_id)
        connections.close_all()
        return EXIT_CONFIG
    return None


def check_now(plans: Iterable[Any]) -> str | None:
    """Before a command starts any worker: the one line describing what the database of
    one of ``plans`` (:class:`~.config.WorkerConfig`) lacks, or ``None``. A database that
    does not exist is named; one that cannot be reached now is left to the workers, which
    wait for it."""
    try:
        for plan in plans:
            try:
                problems = schema_report(plan.models, plan.using)
            except DatabaseError as exc:
                if for_alias(plan.using).is_unknown_database(exc):
                    return missing_database_line(plan.using)
                continue
            if problems:
                return describe_problems(problems, plan.using)
        return None
    finally:
        connections.close_all()
