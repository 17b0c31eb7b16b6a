"""Exception classes recorded in task results and raised by the backend."""

from __future__ import annotations

from django.tasks.exceptions import InvalidTask

from django_taskclaim.exceptions import DependencyError, TaskClaimError


class InvalidTaskArguments(InvalidTask, TypeError):
    """The arguments of an enqueued task cannot be stored as JSON.

    It is both Django's :class:`~django.tasks.exceptions.InvalidTask` (what this
    backend raises for any bad input) and a ``TypeError`` (what Django's documentation
    shows for arguments that are not JSON-serialisable), so either ``except`` works.
    """


class InvalidTaskValue(InvalidTask, ValueError):
    """A ``priority`` or ``run_after`` of a task is out of the bounds the table can store
    (NaN or an infinite priority, a ``run_after`` beyond the range of timestamps).

    Both Django's :class:`~django.tasks.exceptions.InvalidTask` and a ``ValueError``;
    nothing was written when it is raised.
    """


class WorkerLost(Exception):
    """An attempt never recorded an outcome: its worker died or lost its lease.

    Never raised; its path is recorded in ``TaskResult.errors`` for such attempts.
    """


class TaskUnavailable(ImportError):
    """The task's function path no longer imports to a ``django.tasks`` Task."""


class ArgumentsUndecodable(ValueError):
    """The stored arguments cannot be decoded into a call of the task function."""


class ReturnValueNotSerializable(TypeError):
    """The task returned a value that cannot be stored as JSON."""


class InvalidTaskDependency(InvalidTask, DependencyError):
    """A task's ``after()`` cannot be recorded: a prerequisite that is not a saved row or
    a ``TaskResult`` of a ``TaskClaimBackend``, gone, on another database, or a bad
    ``on_failure``. Both Django's :class:`~django.tasks.exceptions.InvalidTask` and the
    core's :class:`~django_taskclaim.exceptions.DependencyError`; nothing was written."""


class NotInTaskBody(TaskClaimError, RuntimeError):
    """A workflow call (``step()``, ``wait_for_event()``, ``fan_in()``…) made outside a
    task body run by a ``TaskClaimBackend`` worker: it has no row to work on."""
