"""What the workflow tables keep of a row, deleted with the row when it is pruned: its
durable steps (``TaskStep``), its event waits (``TaskEventWait``), its fan-in counter
(``TaskFanIn``), its edges as a dependent, and its closed edges as a prerequisite
(``TaskDependency``). An open edge from a pruned prerequisite stays: its dependent still
waits (on hold), and the doctor names it (``TC-D025``)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.apps import apps
from django.db import models

from django_taskclaim.settle.dependents import CHUNK, OPEN, key_of, label_of

#: The workflow tables keyed by a row's model label and primary key text: (model, the
#: label column, the key column).
KEYED = (
    ("taskclaim.TaskStep", "task_model", "task_pk"),
    ("taskclaim.TaskEventWait", "task_model", "task_pk"),
    ("taskclaim.TaskFanIn", "dependent_model", "dependent_pk"),
    ("taskclaim.TaskDependency", "dependent_model", "dependent_pk"),
)


def delete_leftovers(model: type[models.Model], pks: Iterable[Any], using: str) -> int:
    """Delete what the workflow tables keep of the rows ``pks`` of ``model`` (being
    deleted); return how many rows of those tables went."""
    label = label_of(model)
    keys = [key_of(pk) for pk in pks]
    deleted = 0
    for i in range(0, len(keys), CHUNK):
        chunk = keys[i : i + CHUNK]
        for name, label_column, key_column in KEYED:
            rows = apps.get_model(name)._base_manager.using(using)
            gone, _ = rows.filter(**{label_column: label, f"{key_column}__in": chunk}).delete()
            deleted += gone
        edges = apps.get_model("taskclaim.TaskDependency")._base_manager.using(using)
        gone, _ = (
            edges.filter(prerequisite_model=label, prerequisite_pk__in=chunk)
            .exclude(outcome=OPEN)
            .delete()
        )
        deleted += gone
    return deleted
