"""Optional apps shipped with django-taskclaim; nothing here is loaded unless the project
adds it to ``INSTALLED_APPS``.

- ``django_taskclaim.contrib.tasks`` — the Django 6 Tasks backend (its own label and
  migrations);
- ``django_taskclaim.contrib.racelab`` — the race lab and ``manage.py taskclaim_racelab``
  (its tables come from its migration; its claimable model is not one of the project's
  queues).
"""
