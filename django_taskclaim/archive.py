"""Deprecated (removed in 0.2): ``from django_taskclaim import archive_of``
(:mod:`django_taskclaim.deprecation`)."""

from django_taskclaim.deprecation import moved_names

__getattr__ = moved_names(
    "django_taskclaim.archive",
    "django_taskclaim.recovery.archive",
    {"archive_of": "django_taskclaim.recovery.archive"},
)
