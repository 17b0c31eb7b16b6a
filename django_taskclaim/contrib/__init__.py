"""Optional apps shipped with django-taskclaim; nothing here is loaded unless the project
adds it to ``INSTALLED_APPS``.

- ``django_taskclaim.contrib.tasks`` — the Django 6 Tasks backend (its own label and
  migrations);
- ``django_taskclaim.contrib.racelab`` — the race lab and ``manage.py taskclaim_racelab``
  (its tables come from its migration; its claimable model is not one of the project's
  queues).
"""

#: app label -> app, of each contrib app whose models a command may name: what
#: ``manage.py worker`` says to add when one of them is named but not installed. Nothing
#: outside ``contrib/`` names a contrib module; an installed contrib app speaks to the
#: worker command through its app config (``taskclaim_worker_refusal``).
APPS: dict[str, str] = {"taskclaim_tasks": "django_taskclaim.contrib.tasks"}
