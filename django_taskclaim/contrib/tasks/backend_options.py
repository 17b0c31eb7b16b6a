"""A ``TaskClaimBackend``'s entry of ``TASKS``, as a whole: what is wrong with it, one line
each (:func:`setting_problems`), the retry settings it gives its tasks
(:func:`retry_settings`) and the system check's errors (:func:`backend_errors`). Each
option alone is checked in :mod:`.validation`; :mod:`.backend` holds the backend.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from django.apps import apps
from django.core import checks
from django.tasks.exceptions import InvalidTaskBackend

from django_taskclaim.config.settings import taskclaim_settings
from django_taskclaim.contrib.tasks.validation import (
    OPTION_NAMES,
    max_attempts_value,
    number_option,
)

#: The app the backend's model lives in.
APP = "django_taskclaim.contrib.tasks"


def setting_problems(
    alias: str, options: Mapping[str, Any], queues: Iterable[Any], backend: str
) -> list[str]:
    """Each problem of the ``OPTIONS`` and ``QUEUES`` of ``TASKS[alias]`` and of the alias,
    as one line (``backend``: the backend's class name, for the messages)."""
    from django_taskclaim.contrib.tasks.models import (
        NAME_MAX_LENGTH,  # deferred: models need the app registry
    )

    problems: list[str] = []
    unknown = sorted(set(options) - set(OPTION_NAMES))
    if unknown:
        problems.append(
            f"TASKS[{alias!r}]['OPTIONS'] has unknown key(s) {', '.join(unknown)}; "
            f"{backend} accepts {', '.join(sorted(OPTION_NAMES))}"
        )
    if len(alias) > NAME_MAX_LENGTH:
        problems.append(f"backend alias {alias!r} is longer than {NAME_MAX_LENGTH} characters")
    for name in sorted(queues, key=repr):
        if not isinstance(name, str) or not name or len(name) > NAME_MAX_LENGTH:
            problems.append(
                f"TASKS[{alias!r}]['QUEUES'] entry {name!r} must be a non-empty string of "
                f"at most {NAME_MAX_LENGTH} characters"
            )
    try:
        if "max_attempts" in options:
            max_attempts_value(options["max_attempts"], f"TASKS[{alias!r}] max_attempts")
    except InvalidTaskBackend as exc:
        problems.append(str(exc))
    try:
        retry_settings(alias, options)  # the retry options now, not at the first failure
    except InvalidTaskBackend as exc:
        problems.append(str(exc))
    database = options.get("database")
    if database is not None and not isinstance(database, str):
        problems.append(f"TASKS[{alias!r}] database must be an alias string")
    return problems


def retry_settings(alias: str, options: Mapping[str, Any]) -> tuple[float, float, float]:
    """``(backoff, backoff_max, jitter)`` of ``TASKS[alias]``: from its ``options`` or the
    ``TASKCLAIM_*`` settings; ``InvalidTaskBackend`` naming the option that is wrong."""
    where = f"TASKS[{alias!r}]"
    base = number_option(
        options.get("retry_backoff", taskclaim_settings.RETRY_BACKOFF),
        f"{where} retry_backoff",
        low=0,
    )
    cap = number_option(
        options.get("retry_backoff_max", taskclaim_settings.RETRY_BACKOFF_MAX),
        f"{where} retry_backoff_max",
        low=0,
    )
    jitter = number_option(
        options.get("retry_jitter", taskclaim_settings.RETRY_JITTER),
        f"{where} retry_jitter",
        low=0,
        high=1,
    )
    return base, cap, jitter


def backend_errors(alias: str, backend: str, problems: Iterable[str]) -> list[Any]:
    """The system check's errors of ``TASKS[alias]`` (``backend``: its class name): the
    sub-app must be installed (``taskclaim_tasks.E001``) and its settings valid
    (``taskclaim_tasks.E002``, one error per line of ``problems``)."""
    errors = []
    if not apps.is_installed(APP):
        errors.append(
            checks.Error(
                f"TASKS[{alias!r}] uses {backend} but {APP!r} is not in INSTALLED_APPS.",
                hint=f"Add {APP!r} to INSTALLED_APPS and run migrate.",
                id="taskclaim_tasks.E001",
            )
        )
    errors += [
        checks.Error(
            problem,
            hint=f"Fix TASKS[{alias!r}] in your settings; docs/tasks-backend.md lists its options.",
            id="taskclaim_tasks.E002",
        )
        for problem in problems
    ]
    return errors
