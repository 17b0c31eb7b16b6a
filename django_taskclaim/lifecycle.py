"""Deprecated (removed in 0.2): ``from django_taskclaim.settle.outcome import BatchableResult``
(:mod:`django_taskclaim.deprecation`)."""

from django_taskclaim.deprecation import moved_names

__getattr__ = moved_names(__name__)
