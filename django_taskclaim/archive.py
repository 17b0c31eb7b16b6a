"""Deprecated (removed in 0.2): ``from django_taskclaim import archive_of``;
``from django_taskclaim.recovery.archive import archive_finished``
(:mod:`django_taskclaim.deprecation`)."""

from django_taskclaim.deprecation import moved_names

__getattr__ = moved_names(__name__)
