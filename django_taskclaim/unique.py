"""Deprecated (removed in 0.2): ``from django_taskclaim import ActiveKeyField``
(:mod:`django_taskclaim.deprecation`)."""

from django_taskclaim.deprecation import moved_names

__getattr__ = moved_names(
    "django_taskclaim.unique",
    "django_taskclaim.model.unique",
    {
        "ActiveKeyField": "django_taskclaim.model.unique",
        "insert_unique": "django_taskclaim.model.unique_insert",
        "UniqueKeyRaceError": "django_taskclaim.model.unique_insert",
    },
)
