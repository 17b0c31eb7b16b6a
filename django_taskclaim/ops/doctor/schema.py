"""The doctor's schema check: the model's table and columns are in the database."""

from __future__ import annotations

from typing import Any

from django_taskclaim.ops.doctor.findings import Finding
from django_taskclaim.worker.preflight import schema_fix, schema_report

SCHEMA = "TC-D008"
APP_TABLES = "TC-D009"


def schema(model: Any, alias: str) -> Finding:
    """``TC-D008``: the database has the model's table (and its parents') with a column
    for each concrete field, asked of its introspection; an error naming what is missing
    and its fix when it has not (the worker refuses to start then): ``migrate``, or
    ``makemigrations`` first where the model's migrations do not create it either (an
    upgrade that added a field to a mixin)."""
    label = model._meta.label
    problems = schema_report([model], alias, app_tables=False)
    if not problems:
        return Finding(
            SCHEMA, "ok", alias, f"table {model._meta.db_table} has every model column", label
        )
    fix = schema_fix(problems, alias)
    if not model._meta.managed:
        fix = "the model is unmanaged: create or alter its table yourself to match the model"
    return Finding(
        SCHEMA,
        "error",
        alias,
        "; ".join(p.what for p in problems),
        label,
        detail="the worker refuses to start on this database until it matches the model",
        fix=fix[0].upper() + fix[1:] + ".",
    )


def app_tables(alias: str) -> Finding:
    """``TC-D009``: the app's own tables (the worker registry, lease locks, events, …)
    are on the databases they are routed to; an error naming each one missing and
    ``migrate`` when one is not (its migrations ship with the app: nothing to make)."""
    problems = schema_report([], alias, app_tables=True)
    if not problems:
        return Finding(APP_TABLES, "ok", alias, "the app's own tables are all there")
    fix = "; ".join(dict.fromkeys(p.fix(alias) for p in problems))
    return Finding(
        APP_TABLES,
        "error",
        alias,
        "; ".join(p.what for p in problems),
        detail="the worker refuses to start until they are there",
        fix=fix[0].upper() + fix[1:] + ".",
    )
