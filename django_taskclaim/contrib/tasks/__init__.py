"""A ``django.tasks`` backend built on a claimable model (Django 6.0 and later).

Add ``"django_taskclaim.contrib.tasks"`` to ``INSTALLED_APPS`` and point ``TASKS`` at
:class:`django_taskclaim.contrib.tasks.backend.TaskClaimBackend`; run the tasks with
``manage.py taskclaim_worker taskclaim_tasks.QueuedTask``. See ``docs/tasks-backend.md``.

On Django < 6.0 importing this package raises ``ImproperlyConfigured`` with the reason:
``django.tasks`` does not exist there, and the ``django-tasks`` backport is not supported.
"""

from .apps import check_django_version

check_django_version()
