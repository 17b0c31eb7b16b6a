"""What ``manage.py worker`` checks of the ``django.tasks`` backend before it serves
:class:`~django_taskclaim.contrib.tasks.models.QueuedTask`.

The worker command runs only django-taskclaim's own system checks (tag ``taskclaim``);
Django's check of ``TASKS`` is untagged, so :func:`worker_refusal` runs it here for a
worker of the task table, and refuses a ``--queue`` that no ``TaskClaimBackend`` of
``TASKS`` lists (no task can be enqueued there: the worker would wait forever).
Called through the app config's hook
(:meth:`~django_taskclaim.contrib.tasks.apps.TaskClaimTasksConfig.taskclaim_worker_refusal`),
which ``manage.py worker`` asks of every installed app; the backend's own check is
:meth:`~django_taskclaim.contrib.tasks.backend.TaskClaimBackend.check`.
"""

from __future__ import annotations

from collections.abc import Iterable

from django.db.models import Model
from django.tasks import task_backends
from django.tasks.checks import check_tasks
from django.tasks.exceptions import InvalidTaskBackend

from django_taskclaim.contrib.tasks.backend import TaskClaimBackend


def backend_problem() -> str | None:
    """The first error Django's check of ``TASKS`` reports, as one line
    (``"<message> (<id>) <hint>"``), or ``None`` when the check passes."""
    try:
        errors = [e for e in check_tasks() if e.is_serious()]
    except InvalidTaskBackend as exc:  # a backend that cannot even be built
        return str(exc)
    if not errors:
        return None
    error = errors[0]
    hint = f" {error.hint}" if error.hint else ""
    return f"{error.msg} ({error.id}){hint}"


def queue_problem(queue: str) -> str | None:
    """Why ``--queue queue`` can never find a task, or ``None``: it is in the ``QUEUES``
    of no ``TaskClaimBackend`` of ``TASKS`` (a backend with ``QUEUES = []`` takes any)."""
    listed: set[str] = set()
    for backend in task_backends.all():
        if not isinstance(backend, TaskClaimBackend):
            continue
        if not backend.queues or queue in backend.queues:
            return None
        listed.update(q for q in backend.queues if isinstance(q, str))
    names = ", ".join(repr(q) for q in sorted(listed)) or "none"
    return (
        f"--queue {queue!r} is in the QUEUES of no TaskClaimBackend of TASKS (they list "
        f"{names}): no task can be enqueued there; choose one of those or add it to QUEUES"
    )


def worker_refusal(models: Iterable[type[Model]], queue: str | None) -> str | None:
    """One line saying why a worker of ``models`` must not start, or ``None``: nothing
    when the task table is not among ``models``; else the first error of Django's check
    of ``TASKS`` (an unknown ``OPTIONS`` key, an out-of-range number, the app missing),
    then a ``queue`` that :func:`queue_problem` refuses."""
    from django_taskclaim.contrib.tasks.models import (
        QueuedTask,  # deferred: models need the app registry
    )

    if QueuedTask not in list(models):
        return None
    return backend_problem() or (queue_problem(queue) if queue is not None else None)
