"""Mapping between ``QueuedTask`` rows and Django's ``Task`` / ``TaskResult`` objects."""

from __future__ import annotations

import types
from dataclasses import fields
from datetime import datetime
from typing import Any

from django.tasks import Task, TaskResult, TaskResultStatus
from django.tasks.base import TaskError
from django.utils import timezone
from django.utils.module_loading import import_string

from django_taskclaim.config.options import get_options
from django_taskclaim.contrib.tasks.exceptions import TaskUnavailable

#: Logical claim state of a row -> status of its ``TaskResult``.
STATUS_MAP = {
    "ready": TaskResultStatus.READY,
    "waiting": TaskResultStatus.READY,  # after(): not claimed before its prerequisites
    "processing": TaskResultStatus.RUNNING,
    "done": TaskResultStatus.SUCCESSFUL,
    "failed": TaskResultStatus.FAILED,
    "cancelled": TaskResultStatus.FAILED,
}


#: Tasks resolved by :func:`import_task`, by path (successes only: a path that fails is
#: looked up again next time, so a fixed module is picked up without a restart).
_TASKS: dict[str, Task] = {}


def import_task(path: str) -> Task:
    """Import the ``django.tasks`` Task stored under ``path`` or raise ``TaskUnavailable``.

    The error message names the path and says why it does not resolve (module or
    attribute gone, import-time error, or the object is no longer a Task). A path that
    resolved is remembered for the life of the process (one dictionary lookup after the
    first); a path that failed is tried again at every call.
    """
    task = _TASKS.get(path)
    if task is not None:
        return task
    try:
        obj = import_string(path)
    except ImportError as exc:
        raise TaskUnavailable(f"task {path!r} cannot be imported: {exc}") from exc
    except Exception as exc:
        raise TaskUnavailable(
            f"task {path!r} cannot be imported: importing its module raised "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    if not isinstance(obj, Task):
        raise TaskUnavailable(
            f"task {path!r} resolves to a {type(obj).__name__}, not a django.tasks Task "
            "(was its @task decorator removed?)"
        )
    _TASKS[path] = obj
    return obj


def _unavailable(*args: Any, **kwargs: Any) -> Any:
    raise TaskUnavailable("this task's function can no longer be imported")


def _placeholder_func(path: str) -> types.FunctionType:
    """A module-level-looking function whose ``module_path`` is ``path``."""
    module, _, qualname = path.rpartition(".")
    func = types.FunctionType(_unavailable.__code__, _unavailable.__globals__, qualname)
    func.__module__ = module or __name__
    func.__qualname__ = qualname or path
    return func


#: Dataclass field names of each Task class (``dataclasses.fields()`` is not free).
_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def _field_names(cls: type[Task]) -> tuple[str, ...]:
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = tuple(f.name for f in fields(cls))
    return names


def _build_task(template: Task | None, row: Any) -> Task:
    """A Task for ``row`` without re-validating it against the current settings.

    The row was validated when it was enqueued; a backend alias or queue removed from
    ``TASKS`` since then must not make its result unreadable.
    """
    if template is not None:
        cls: type[Task] = type(template)
        names = _field_names(cls)
        values = {name: getattr(template, name) for name in names}
    else:
        cls = Task
        names = _field_names(cls)
        values = {"func": _placeholder_func(row.task_path), "takes_context": False}
    values.update(
        priority=row.priority,
        queue_name=row.queue_name,
        backend=row.backend_name,
        run_after=row.run_after,
    )
    task = object.__new__(cls)
    for name in names:
        object.__setattr__(task, name, values[name])
    return task


def task_for_row(row: Any, template: Task | None = None) -> Task:
    """The Task of ``row``; a placeholder whose call raises if its path no longer imports."""
    if template is None:
        try:
            template = import_task(row.task_path)
        except TaskUnavailable:
            template = None
    return _build_task(template, row)


def _loaded(row: Any, name: str, fallback: Any = None) -> Any:
    """The field's value if loaded (never triggers a query), else ``fallback``."""
    attname = row._meta.get_field(name).attname
    if attname not in row.__dict__:
        return fallback
    value = row.__dict__[attname]
    if name.endswith("_at") and value is not None and not isinstance(value, datetime):
        return fallback  # an expression (e.g. DbNow()) not read back yet
    return value


def error_entries(row: Any) -> list[TaskError]:
    """The stored errors of ``row`` as Django ``TaskError`` objects."""
    out: list[TaskError] = []
    for entry in row.errors if isinstance(row.errors, list) else []:
        if isinstance(entry, dict) and "exception_class_path" in entry:
            out.append(
                TaskError(
                    exception_class_path=str(entry["exception_class_path"]),
                    traceback=str(entry.get("traceback", "")),
                )
            )
    return out


def to_result(row: Any, *, task: Task | None = None, now: datetime | None = None) -> TaskResult:
    """Map a ``QueuedTask`` row to the ``TaskResult`` Django's API returns.

    ``ready`` and ``waiting`` → READY, ``processing`` → RUNNING, ``done`` → SUCCESSFUL,
    ``failed`` and ``cancelled`` → FAILED. ``attempts`` is the number of attempts started (one
    worker id each); ``errors`` holds one entry per failed or lost attempt.
    Timestamps written with the database clock but not read back yet are reported
    as ``now`` (the caller's clock) instead of costing a query.
    """
    opts = get_options(row)
    state = opts.state_of(row.status) or "ready"
    now = now or timezone.now()
    args = row.args if isinstance(row.args, list) else []
    kwargs = row.kwargs if isinstance(row.kwargs, dict) else {}
    started_at = _loaded(row, "started_at", now)
    enqueued_at = _loaded(row, "created_at", now)
    if started_at is not None and enqueued_at is not None and started_at < enqueued_at:
        # a snoozed or parked task took a new place in line (``created_at``) after its
        # first start: Django's result never reads as enqueued after it started
        enqueued_at = started_at
    result: TaskResult = TaskResult(
        task=task if task is not None else task_for_row(row),
        id=str(row.pk),
        status=STATUS_MAP[state],
        enqueued_at=enqueued_at,
        started_at=started_at,
        finished_at=_loaded(row, "finished_at", now if state in ("done", "failed") else None),
        last_attempted_at=_loaded(row, "last_attempted_at", now),
        args=args,
        kwargs=kwargs,
        backend=row.backend_name,
        errors=error_entries(row),
        worker_ids=[str(w) for w in row.worker_ids] if isinstance(row.worker_ids, list) else [],
    )
    if state == "done":
        object.__setattr__(result, "_return_value", row.return_value)
    return result
