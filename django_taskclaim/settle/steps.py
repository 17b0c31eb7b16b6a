"""Durable steps: named parts of a task body whose results are kept with the row, so an
attempt that crashed and is retried skips the steps that completed. See
docs/workflows.md, "Durable steps".

A step runs in a fenced transaction (:func:`~django_taskclaim.settle.transitions.fenced`):
its function's database writes and the stored result commit together, and only while
the worker still holds the claim. A worker that lost its lease (a stale recoverer)
cannot record a step, nor commit the step's writes. A step's effects outside the
database are at least once: a crash after them and before the commit runs the step
again.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

from django.apps import apps
from django.core.serializers.json import DjangoJSONEncoder
from django.db import IntegrityError, models

from django_taskclaim.config.options import get_options
from django_taskclaim.settle import transitions

T = TypeVar("T")

#: The model of the stored steps, found through the app registry: it sits above this
#: layer (docs/architecture.md).
STEP_MODEL = "taskclaim.TaskStep"
#: The longest step name (its column's length).
NAME_LENGTH = 100


def _steps(using: str) -> models.QuerySet:
    return apps.get_model(STEP_MODEL)._base_manager.using(using)


def _where(task: models.Model) -> dict[str, str]:
    model = type(task)._meta.concrete_model or type(task)
    return {"task_model": str(model._meta.label), "task_pk": str(task.pk)}


def _db(task: models.Model) -> str:
    return task._state.db or "default"


def _check_name(task: models.Model, name: Any) -> str:
    if not isinstance(name, str) or not name or len(name) > NAME_LENGTH:
        raise ValueError(
            f"{get_options(task).label}: a step name is a non-empty text of at most "
            f"{NAME_LENGTH} characters, got {name!r}"
        )
    return name


def run_step(task: Any, name: str, fn: Callable[[], Any]) -> Any:
    """The result of the step ``name`` of ``task``: the stored one if an earlier attempt
    of the row completed it (``fn`` is not called), else ``fn()``'s, stored in the same
    fenced transaction as ``fn``'s database writes. The result must be JSON
    (``DjangoJSONEncoder``: dates, decimals and UUIDs become text); what is returned is
    always the value as stored, so a first run and a replay return the same thing.

    Raises :class:`~django_taskclaim.exceptions.ClaimLost` (nothing committed) when the
    claim was lost, ``TypeError`` for a result that is not JSON, ``ValueError`` for a
    bad name; an exception of ``fn`` rolls back its writes and propagates (the step is
    not recorded: the next attempt runs it again)."""
    name = _check_name(task, name)
    using = _db(task)
    where = _where(task)
    stored = list(_steps(using).filter(**where, name=name).values_list("result", flat=True)[:1])
    if stored:
        return stored[0]
    with transitions.fenced(task, using=using):
        result = fn()
        try:
            text = json.dumps(result, cls=DjangoJSONEncoder)
        except (TypeError, ValueError) as exc:
            raise TypeError(
                f"step {name!r} of {get_options(task).label} #{task.pk} returned "
                f"{type(result).__name__}, which is not JSON ({exc}): return a JSON value; "
                "nothing was stored and its writes were rolled back"
            ) from None
        value = json.loads(text)
        try:
            _steps(using).create(
                **where, name=name, result=value, token=task.version, attempt=task.attempts
            )
        except IntegrityError:  # only a caller that left the fence could get here
            raise RuntimeError(
                f"step {name!r} of {get_options(task).label} #{task.pk} was recorded by "
                "another holder meanwhile"
            ) from None
    return value


def completed_steps(task: models.Model) -> dict[str, Any]:
    """The steps of ``task`` completed so far, name → stored result, oldest first."""
    rows = _steps(_db(task)).filter(**_where(task)).order_by("created_at", "pk")
    return dict(rows.values_list("name", "result"))


def forget_steps(task: models.Model) -> int:
    """Delete the stored steps of ``task`` (its next run starts over); how many."""
    deleted, _ = _steps(_db(task)).filter(**_where(task)).delete()
    return int(deleted)
