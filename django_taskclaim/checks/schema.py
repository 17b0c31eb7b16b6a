"""The schema check ``taskclaim.W012``: the tables and columns of the claimable models and
of the app's own tables are in the database, and each one missing is named with the
command that makes it: ``migrate``, or ``makemigrations`` first where the migrations on
disk do not create it either (an upgrade that added a field to a mixin leaves the user's
own migrations behind; ``migrate`` alone would have nothing to apply).

Tagged ``database`` only (not ``taskclaim``, whose checks the worker runs at start and
which a tag runs on every database): Django runs it when asked for the databases,
``manage.py check --database default`` and ``manage.py migrate`` (which checks the
database it migrates before it applies anything). What the migrations not yet applied
on that database create is left out (the ``migrate`` under way, or the next one, makes
it); the rest is what ``migrate`` cannot make. The same report as the worker's start
(:func:`~django_taskclaim.worker.preflight.schema_report`) and the doctor's ``TC-D008`` /
``TC-D009``. A warning, never an error: an error would stop the ``migrate`` that applies
the app's own migrations.
"""

from __future__ import annotations

from typing import Any

from django.core import checks
from django.db import DatabaseError, connections, router

from django_taskclaim.config.discovery import checked_models
from django_taskclaim.worker.preflight import SchemaProblem, schema_report


def _pending_apps(alias: str) -> set[str]:
    """The apps with migrations on disk not applied on the database ``alias``."""
    from django.db.migrations.loader import MigrationLoader

    loader = MigrationLoader(connections[alias], ignore_no_migrations=True)
    applied = set(loader.applied_migrations)
    return {app for app, name in loader.graph.nodes if (app, name) not in applied}


def schema_messages(alias: str, models: list[Any]) -> list[checks.CheckMessage]:
    """``taskclaim.W012`` for each table ``alias`` lacks of ``models`` (and of the app's
    own tables) that no pending migration makes; none when the database cannot be
    asked (the worker and the doctor say why)."""
    try:
        problems = schema_report(models, alias)
        pending = _pending_apps(alias) if problems else set()
    except DatabaseError:
        return []
    found: list[SchemaProblem] = [p for p in problems if p.unmigrated or p.app_label not in pending]
    return [
        checks.Warning(
            f"{p.what} (database {alias!r}).",
            hint=p.fix(alias)[0].upper()
            + p.fix(alias)[1:]
            + (
                f": the migrations of {p.app_label} do not create it"
                if p.unmigrated
                else ": its migration is applied, yet the database lacks it"
            )
            + ". A worker refuses to start on this database until it is there.",
            id="taskclaim.W012",
        )
        for p in found
    ]


@checks.register(checks.Tags.database)
def check_schema(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    messages: list[checks.CheckMessage] = []
    seen: set[str] = set()
    for alias in sorted(databases or ()):
        models = [
            m
            for m in checked_models(app_configs)
            if m._meta.managed and router.allow_migrate_model(alias, m)
        ]
        for message in schema_messages(alias, models):
            if message.msg not in seen:
                seen.add(message.msg)
                messages.append(message)
    return messages
