"""Deprecated (removed in 0.2): ``from django_taskclaim import db_now``
(:mod:`django_taskclaim.deprecation`)."""

from django_taskclaim.deprecation import moved_names

__getattr__ = moved_names(__name__)
