"""The doctor's schema check: the model's table and columns are in the database."""

from __future__ import annotations

from typing import Any

from django_taskclaim.ops.doctor.findings import Finding
from django_taskclaim.worker.preflight import migrate_fix, schema_problems

SCHEMA = "TC-D008"


def schema(model: Any, alias: str) -> Finding:
    """``TC-D008``: the database has the model's table (and its parents') with a column
    for each concrete field, asked of its introspection; an error naming what is missing
    and ``migrate`` when it has not (the worker refuses to start then)."""
    label = model._meta.label
    problems = schema_problems([model], alias, app_tables=False)
    if not problems:
        return Finding(
            SCHEMA, "ok", alias, f"table {model._meta.db_table} has every model column", label
        )
    fix = migrate_fix(alias)
    if not model._meta.managed:
        fix = "the model is unmanaged: create or alter its table yourself to match the model"
    return Finding(
        SCHEMA,
        "error",
        alias,
        "; ".join(problems),
        label,
        detail="the worker refuses to start on this database until it matches the model",
        fix=fix[0].upper() + fix[1:] + ".",
    )
