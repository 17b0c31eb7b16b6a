"""``TaskClaimBackend``: Django's Tasks API on a claimable table, with leases and retries.

``TASKS = {"default": {"BACKEND": "django_taskclaim.contrib.tasks.backend.TaskClaimBackend"}}``
stores each enqueued Task as a :class:`~django_taskclaim.contrib.tasks.models.QueuedTask`
row; ``manage.py worker taskclaim_tasks.QueuedTask`` runs them. What a row stores
of the call (its JSON arguments, its unique key) is worked out in :mod:`.arguments`; what
it checks of its options and of each task's priority and ``run_after``, in
:mod:`.validation`; what is wrong with its ``TASKS`` entry as a whole, and its system
check, in :mod:`.backend_options`.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from asgiref.sync import sync_to_async
from django.apps import apps
from django.db import DatabaseError, models, router
from django.tasks import Task, TaskResult, task_backends
from django.tasks.backends.base import BaseTaskBackend
from django.tasks.exceptions import InvalidTask, InvalidTaskBackend, TaskResultDoesNotExist
from django.tasks.signals import task_enqueued

from django_taskclaim.config.settings import taskclaim_settings
from django_taskclaim.contrib.tasks.arguments import check_key, encode_arguments, unique_key_for
from django_taskclaim.contrib.tasks.backend_options import (
    APP,
    backend_errors,
    retry_settings,
    setting_problems,
)
from django_taskclaim.contrib.tasks.exceptions import InvalidTaskDependency
from django_taskclaim.contrib.tasks.results import to_result
from django_taskclaim.contrib.tasks.validation import (
    check_priority,
    check_run_after,
    copy_task,
    max_attempts_value,
)
from django_taskclaim.db import DbNow, retry_transient
from django_taskclaim.exceptions import DependencyError
from django_taskclaim.model.enqueue import insert_after
from django_taskclaim.model.unique_insert import insert_unique
from django_taskclaim.settle.dependents import POLICIES

if TYPE_CHECKING:
    from django_taskclaim.contrib.tasks.models import QueuedTask

logger = logging.getLogger("django_taskclaim.tasks")


@dataclass(frozen=True, slots=True, kw_only=True)
class ClaimTask(Task):
    """Django's ``Task`` plus an optional per-task ``max_attempts``.

    ``@task(max_attempts=3)`` works when the task's backend is a ``TaskClaimBackend``
    (Django passes extra decorator arguments to the backend's ``task_class``);
    ``None`` means the backend's ``OPTIONS["max_attempts"]``.
    """

    max_attempts: int | None = None
    #: The rows this task's enqueue waits for (:meth:`after`); empty: none.
    prerequisites: tuple[Any, ...] = ()
    #: What a prerequisite that ends failed or cancelled does to it (:meth:`after`).
    on_failure: str = "cancel"

    def after(self, *prerequisites: Any, on_failure: str = "cancel") -> ClaimTask:
        """A copy of this task whose ``enqueue()`` stores a task that waits for
        ``prerequisites``: ``TaskResult``s of a ``TaskClaimBackend``, saved rows of a
        claimable model with ``ClaimMeta.dependents``, or lists of them.

        The waiting task is READY to Django but never claimed before every prerequisite
        has settled; the settle of the last one releases it in its own transaction.
        ``on_failure`` (``"cancel"``, ``"run"`` or ``"hold"``) says what a prerequisite
        that ends failed or cancelled does (docs/workflows.md). The prerequisites are
        checked and locked at enqueue, in the enqueue's transaction;
        ``InvalidTaskDependency`` (an ``InvalidTask``) means nothing was written.
        """
        if on_failure not in POLICIES:
            raise InvalidTaskDependency(
                f"on_failure must be one of {', '.join(POLICIES)}, got {on_failure!r}"
            )
        rows = tuple(prerequisite_rows(prerequisites))
        return replace(self, prerequisites=rows, on_failure=on_failure)


def prerequisite_rows(items: Iterable[Any]) -> list[models.Model]:
    """``after()``'s prerequisites as rows: a ``TaskResult`` of a ``TaskClaimBackend``
    becomes its ``QueuedTask`` (by id, on its backend's database), a model instance is
    kept, a list or tuple of either is flattened once. Anything else raises
    :class:`~.exceptions.InvalidTaskDependency`; whether the rows exist is checked at
    enqueue, in its transaction."""
    out: list[models.Model] = []
    for item in items:
        if isinstance(item, list | tuple | models.QuerySet):
            out.extend(prerequisite_rows(list(item)))
            continue
        if isinstance(item, models.Model):
            out.append(item)
            continue
        if not isinstance(item, TaskResult):
            raise InvalidTaskDependency(
                f"after() takes TaskResults of a TaskClaimBackend or saved rows of a claimable "
                f"model, got {item!r:.200}"
            )
        backend = item.backend
        owner = task_backends[backend] if isinstance(backend, str) else backend
        if not isinstance(owner, TaskClaimBackend):
            raise InvalidTaskDependency(
                f"after() holds a result of backend {backend!r} ({type(owner).__name__}), "
                "which does not store its tasks as rows: only a TaskClaimBackend's results "
                "can be waited for"
            )
        row = owner.model(pk=item.id)
        row._state.adding = False
        row._state.db = owner.database
        out.append(row)
    return out


def enqueue_unique(task: Task, key: str | None, /, *args: Any, **kwargs: Any) -> TaskResult:
    """``task.enqueue(*args, **kwargs)`` unless a ready or processing task has ``key``.

    Returns the new task's ``TaskResult``, or the existing one's for a duplicate
    (compare ``result.id``; :meth:`TaskClaimBackend.enqueue_unique` also says whether it
    was created). The task's backend must be a :class:`TaskClaimBackend`.
    """
    backend = task.get_backend()
    if not isinstance(backend, TaskClaimBackend):
        raise InvalidTaskBackend(
            f"enqueue_unique() needs a TaskClaimBackend; {task.module_path} uses "
            f"{type(backend).__name__} (TASKS[{task.backend!r}])"
        )
    result, _created = backend.enqueue_unique(task, key, args, kwargs)
    return result


async def aenqueue_unique(task: Task, key: str | None, /, *args: Any, **kwargs: Any) -> TaskResult:
    """Async twin of :func:`enqueue_unique` (runs it in a thread)."""
    return await sync_to_async(enqueue_unique)(task, key, *args, **kwargs)


class TaskClaimBackend(BaseTaskBackend):
    """A ``django.tasks`` backend storing tasks in a claimable table.

    Guarantees: ``enqueue`` validates everything first and writes nothing when it
    raises ``InvalidTask``; the row is written with the caller's connection, so inside
    ``transaction.atomic()`` the task exists (and can run) only once the caller commits;
    a task runs under a lease, is retried with backoff up to ``max_attempts`` and is
    recovered after a crash; ``get_result`` sees the database state from any process.
    """

    task_class = ClaimTask
    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        #: What is wrong with this backend's settings, one line each (empty: nothing).
        #: Reported by :meth:`check` (``manage.py check``, ``migrate``, the worker) rather
        #: than raised here: Django's check of ``TASKS`` builds every backend, and an
        #: exception here would end it in a traceback instead of the check's message.
        #: Using the backend (enqueue, validation, results) raises the first of them.
        self.problems: list[str] = setting_problems(
            alias, self.options, self.queues, type(self).__name__
        )

    def refuse_if_misconfigured(self) -> None:
        """Raise ``InvalidTaskBackend`` with the first of :attr:`problems`, if any: a
        backend whose settings are wrong stores and reads nothing."""
        if self.problems:
            raise InvalidTaskBackend(self.problems[0])

    # -- options ------------------------------------------------------------------
    @property
    def model(self) -> type[QueuedTask]:
        """The task model; a clear error if the sub-app is not installed."""
        if not apps.is_installed(APP):
            raise InvalidTaskBackend(
                f"TASKS[{self.alias!r}] uses {type(self).__name__}: add {APP!r} to "
                "INSTALLED_APPS and run migrate"
            )
        from django_taskclaim.contrib.tasks.models import (
            QueuedTask,  # deferred: models need the app registry
        )

        return QueuedTask

    @property
    def database(self) -> str:
        """The database alias holding this backend's tasks."""
        return str(self.options.get("database") or router.db_for_write(self.model))

    @property
    def max_attempts(self) -> int:
        """Default ``max_attempts`` of this backend's tasks (``TASKCLAIM_MAX_ATTEMPTS``)."""
        value = self.options.get("max_attempts", taskclaim_settings.MAX_ATTEMPTS)
        return max_attempts_value(value, f"TASKS[{self.alias!r}] max_attempts")

    def retry_settings(self) -> tuple[float, float, float]:
        """``(backoff, backoff_max, jitter)`` from ``OPTIONS`` or the ``TASKCLAIM_*`` settings."""
        return retry_settings(self.alias, self.options)

    # -- validation -----------------------------------------------------------------
    def validate_task(self, task: Task) -> None:
        """Raise ``InvalidTask`` with a clear message if this backend cannot run ``task``.

        On top of Django's checks: ``run_after`` may also be a ``timedelta`` (relative
        to the database clock at enqueue time) of at most 36500 days; an aware
        ``datetime`` must stay within years 1 to 9999 in UTC; ``priority`` must be a
        finite whole number (NaN and infinities raise :class:`~.exceptions.InvalidTaskValue`,
        also a ``ValueError``, naming the value and the bound); queue names must be
        listed in ``QUEUES`` (unless it is ``[]``) and fit the column; a task's own
        ``max_attempts`` must be between 1 and 1000. A backend whose settings are wrong
        (:attr:`problems`) raises ``InvalidTaskBackend`` for every task.
        """
        self.refuse_if_misconfigured()
        run_after = task.run_after
        if run_after is not None and not isinstance(run_after, datetime | timedelta):
            raise InvalidTask(
                f"run_after must be an aware datetime, a timedelta or None, got {run_after!r}"
            )
        check_run_after(run_after)
        if self.queues and task.queue_name not in self.queues:
            raise InvalidTask(
                f"queue_name {task.queue_name!r} is not valid for backend {self.alias!r}: "
                f"allowed queues are {', '.join(sorted(map(repr, self.queues)))} "
                f"(TASKS[{self.alias!r}]['QUEUES'])"
            )
        from django_taskclaim.contrib.tasks.models import (
            NAME_MAX_LENGTH,  # deferred: models need the app registry
        )

        if not isinstance(task.queue_name, str) or len(task.queue_name) > NAME_MAX_LENGTH:
            raise InvalidTask(
                f"queue_name must be a string of at most {NAME_MAX_LENGTH} characters, "
                f"got {task.queue_name!r}"
            )
        check_priority(task.priority)
        own = getattr(task, "max_attempts", None)
        if own is not None:
            try:
                max_attempts_value(own, f"max_attempts of {task.module_path}")
            except InvalidTaskBackend as exc:
                raise InvalidTask(str(exc)) from None
        probe = copy_task(task, run_after=None) if isinstance(run_after, timedelta) else task
        super().validate_task(probe)

    # -- enqueue --------------------------------------------------------------------
    @contextmanager
    def _migrated(self, using: str) -> Iterator[None]:
        """Turn the database error of a statement on a task table that was never
        migrated into ``InvalidTaskBackend`` saying to run ``migrate``; any other
        database error goes through as it is."""
        try:
            yield
        except DatabaseError as exc:
            from django_taskclaim.worker.preflight import (
                migrate_fix,  # deferred: only on this error path
                schema_problems,
            )

            try:
                problems = schema_problems([self.model], using, app_tables=False)
            except DatabaseError:  # cannot ask (e.g. an aborted transaction): as it is
                raise exc from None
            if not problems:
                raise
            raise InvalidTaskBackend(
                f"TASKS[{self.alias!r}] cannot store tasks: the database {using!r} lacks "
                f"the task table ({'; '.join(problems)}): {migrate_fix(using)}"
            ) from None

    def _new_row(
        self, task: Task, args_json: list[Any], kwargs_json: dict[str, Any], **extra: Any
    ) -> QueuedTask:
        """The unsaved row of ``task`` (validated, with its stored arguments)."""
        own = getattr(task, "max_attempts", None)
        row = self.model(
            task_path=task.module_path,
            args=args_json,
            kwargs=kwargs_json,
            queue_name=task.queue_name,
            backend_name=self.alias,
            priority=int(task.priority),
            max_attempts=own if own is not None else self.max_attempts,
            **extra,
        )
        if isinstance(task.run_after, timedelta):
            row.run_after = DbNow() + task.run_after  # database clock
        else:
            row.run_after = task.run_after
        return row

    def _enqueued(self, row: QueuedTask, task: Task) -> TaskResult:
        """The ``TaskResult`` of the row just inserted; sends ``task_enqueued``."""
        stale = [
            name
            for name in ("created_at", "run_after")
            if getattr(row, name) is not None and not isinstance(getattr(row, name), datetime)
        ]
        if stale:  # database-computed values the INSERT did not return
            row.refresh_from_db(using=self.database, fields=stale)
        # Workers listening on PostgreSQL are woken by the post_save hook of
        # django_taskclaim.wakeup.notify, when the row commits.
        result = to_result(row, task=task)
        task_enqueued.send(type(self), task_result=result)
        return result

    def enqueue(self, task: Task, args: Any, kwargs: Any) -> TaskResult:
        """Store ``task`` with its arguments as a READY row and return its ``TaskResult``.

        Everything is validated before the single INSERT; ``InvalidTask`` means nothing
        was written. Inside the caller's ``atomic()`` block the row commits or rolls
        back with the caller. ``task_enqueued`` is sent once the row is written.
        """
        self.validate_task(task)
        args_json, kwargs_json = encode_arguments(task, args, kwargs)
        row = self._new_row(task, args_json, kwargs_json)
        using = self.database
        prerequisites = getattr(task, "prerequisites", ())
        with self._migrated(using):
            if prerequisites:
                self._insert_after(row, prerequisites, getattr(task, "on_failure", "cancel"))
            else:
                retry_transient(
                    lambda: row.save(using=using, force_insert=True), using, what="enqueue task"
                )
        return self._enqueued(row, task)

    def _insert_after(self, row: QueuedTask, prerequisites: tuple[Any, ...], policy: str) -> None:
        """Insert ``row`` waiting for ``prerequisites`` (``ClaimTask.after``), its edges in
        the same transaction; ``InvalidTaskDependency`` and nothing written if they cannot
        be recorded."""
        using = self.database
        try:
            retry_transient(
                lambda: insert_after(type(row), row, list(prerequisites), policy, using),
                using,
                what="enqueue task",
            )
        except DependencyError as exc:
            if isinstance(exc, InvalidTaskDependency):
                raise
            raise InvalidTaskDependency(str(exc)) from None

    def enqueue_unique(
        self, task: Task, key: str | None, args: Any, kwargs: Any
    ) -> tuple[TaskResult, bool]:
        """Enqueue ``task`` unless a ready or processing task has the same ``key``; return
        ``(result, created)``: the existing task's result when not created.

        ``key`` is any string of at most 255 characters, compared exactly, across every
        task path and queue of this table; ``None`` derives it from the task path, the
        queue and the stored arguments (:func:`unique_key_for`). The database's unique
        constraint decides, so concurrent callers never enqueue two active tasks with one
        key. Same validation and transaction behaviour as :meth:`enqueue`;
        ``task_enqueued`` is sent only when a row was created.
        """
        self.validate_task(task)
        if getattr(task, "prerequisites", ()):
            raise InvalidTaskDependency(
                f"enqueue_unique() of {task.module_path}: a task enqueued after() other "
                "tasks cannot be unique (a waiting task holds no key); use enqueue()"
            )
        args_json, kwargs_json = encode_arguments(task, args, kwargs)
        key = unique_key_for(task, args_json, kwargs_json) if key is None else key
        check_key(key)
        using = self.database
        with self._migrated(using):
            row, created = insert_unique(
                lambda: self._new_row(task, args_json, kwargs_json, unique_key=key),
                using=using,
                key_field="unique_key",
            )
        if created:
            return self._enqueued(row, task), True
        return to_result(row), False

    # -- results --------------------------------------------------------------------
    def _key(self, result_id: Any) -> uuid.UUID:
        try:
            return uuid.UUID(str(result_id))
        except ValueError:
            raise TaskResultDoesNotExist(result_id) from None

    def get_result(self, result_id: Any) -> TaskResult:
        """The current ``TaskResult`` of ``result_id`` as stored in the database.

        Reads the database the tasks are written to (never a replica), so a result
        refreshed right after a state change sees it. Raises
        ``TaskResultDoesNotExist`` for an unknown or malformed id.
        """
        self.refuse_if_misconfigured()
        model = self.model
        try:
            with self._migrated(self.database):
                row = model._base_manager.using(self.database).get(pk=self._key(result_id))
        except model.DoesNotExist:
            raise TaskResultDoesNotExist(result_id) from None
        return to_result(row)

    async def aget_result(self, result_id: Any) -> TaskResult:
        """Async twin of :meth:`get_result`."""
        self.refuse_if_misconfigured()
        model = self.model
        try:
            row = await model._base_manager.using(self.database).aget(pk=self._key(result_id))
        except model.DoesNotExist:
            raise TaskResultDoesNotExist(result_id) from None
        return to_result(row)

    def check(self, **kwargs: Any) -> list[Any]:
        """System check (Django's check of ``TASKS`` calls it): the sub-app must be
        installed (``taskclaim_tasks.E001``) and ``OPTIONS`` / ``QUEUES`` valid
        (``taskclaim_tasks.E002``, one error per :attr:`problems` line)."""
        return backend_errors(self.alias, type(self).__name__, self.problems)
