"""Optional integrations of django-taskclaim with other frameworks.

Each sub-package is its own Django app with its own label and migrations; nothing
here is loaded unless the project adds it to ``INSTALLED_APPS``.
"""
