"""Exception classes recorded in task results and raised by the backend."""

from __future__ import annotations

from django.tasks.exceptions import InvalidTask


class InvalidTaskArguments(InvalidTask, TypeError):
    """The arguments of an enqueued task cannot be stored as JSON.

    It is both Django's :class:`~django.tasks.exceptions.InvalidTask` (what this
    backend raises for any bad input) and a ``TypeError`` (what Django's documentation
    shows for arguments that are not JSON-serialisable), so either ``except`` works.
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
