"""Deprecated (removed in 0.2): ``from django_taskclaim import concurrency_constraint``
(:mod:`django_taskclaim.deprecation`)."""

from django_taskclaim.deprecation import moved_names

__getattr__ = moved_names(
    "django_taskclaim.concurrency",
    "django_taskclaim.model.concurrency_keys",
    {
        "concurrency_constraint": "django_taskclaim.model.concurrency_keys",
        "concurrency_slot": "django_taskclaim.model.concurrency_keys",
        "processing_key": "django_taskclaim.model.concurrency_keys",
    },
)
