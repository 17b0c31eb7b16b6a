"""Deprecated (removed in 0.2): ``from django_taskclaim.config.options import retry_delay``
(:mod:`django_taskclaim.deprecation`)."""

from django_taskclaim.deprecation import moved_names

__getattr__ = moved_names(__name__)
