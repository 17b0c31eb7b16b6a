"""Optional apps shipped with django-taskclaim; nothing here is loaded unless the project
adds it to ``INSTALLED_APPS``.

- ``django_taskclaim.contrib.tasks`` — the Django 6 Tasks backend (its own label and
  migrations);
- ``django_taskclaim.contrib.racelab`` — the race lab and ``manage.py taskclaim_racelab``
  (scratch tables it creates and drops itself: no migrations).
"""
