"""Deprecated (removed in 0.2): ``from django_taskclaim.ops.doctor import diagnose, Thresholds``
(:mod:`django_taskclaim.deprecation`)."""

from django_taskclaim.deprecation import moved_names

__getattr__ = moved_names(__name__)
