"""What an enqueue stores of a call: its arguments and its unique key.

:func:`encode_arguments` turns a call's ``args`` / ``kwargs`` into the JSON values stored
with the task (or says which argument cannot be stored); :func:`unique_key_for` is the
key of a unique enqueue given none (also importable from
:mod:`django_taskclaim.contrib.tasks`), :func:`check_key` the check of one given. Their
caller: :mod:`.backend`.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from django.tasks import Task
from django.tasks.exceptions import InvalidTask
from django.utils.json import normalize_json

from django_taskclaim.contrib.tasks.exceptions import InvalidTaskArguments


def encode_arguments(task: Task, args: Any, kwargs: Any) -> tuple[list[Any], dict[str, Any]]:
    """Return ``args`` / ``kwargs`` as the JSON values that will be stored.

    Raises :class:`InvalidTaskArguments` (an ``InvalidTask`` and a ``TypeError``) naming
    the offending argument when one cannot be stored as JSON. Tuples become lists and
    UTF-8 bytes become strings, exactly as Django's ``TaskResult`` normalises them.
    """
    path = task.module_path
    if not isinstance(args, list | tuple):
        raise InvalidTaskArguments(f"positional arguments of {path} must be a list or tuple")
    if not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
        raise InvalidTaskArguments(f"keyword arguments of {path} must be a dict with str keys")
    items = [(f"args[{i}]", v) for i, v in enumerate(args)] + [
        (f"kwargs[{k!r}]", v) for k, v in kwargs.items()
    ]
    for where, value in items:
        try:
            json.dumps(normalize_json(value), allow_nan=False)
        except (TypeError, ValueError, RecursionError) as exc:
            detail = str(exc)
            if detail.startswith("Unsupported type") or detail.startswith("Unsupported value"):
                detail = (
                    f"Object of type {type(_first_bad(value)).__name__} is not JSON serializable"
                )
            raise InvalidTaskArguments(
                f"{where} of {path} cannot be stored as JSON: {detail}. Task arguments must "
                "survive a json.dumps()/json.loads() round trip; pass ids, strings and "
                "numbers instead of objects (e.g. model instances, datetimes, sets)."
            ) from exc
    stored_args: list[Any] = normalize_json(list(args))  # type: ignore[assignment]
    stored_kwargs: dict[str, Any] = normalize_json(dict(kwargs))  # type: ignore[assignment]
    return stored_args, stored_kwargs


def unique_key_for(task: Task, args_json: list[Any], kwargs_json: dict[str, Any]) -> str:
    """The key :meth:`TaskClaimBackend.enqueue_unique` uses when given none:
    ``"<task path>:<sha256>"`` of the task path, the queue name and the stored
    arguments (keys sorted), so equal calls of one task to one queue share it."""
    body = json.dumps(
        [task.module_path, task.queue_name, args_json, kwargs_json],
        sort_keys=True,
        separators=(",", ":"),
    )
    digest = hashlib.sha256(body.encode()).hexdigest()
    from django_taskclaim.contrib.tasks.models import (
        UNIQUE_KEY_MAX_LENGTH,  # deferred: models need the app registry
    )

    return f"{task.module_path}:{digest}"[-UNIQUE_KEY_MAX_LENGTH:]


def check_key(key: Any) -> None:
    """``InvalidTask`` unless ``key`` is a unique key the table can store."""
    from django_taskclaim.contrib.tasks.models import (
        UNIQUE_KEY_MAX_LENGTH,  # deferred: models need the app registry
    )

    if not isinstance(key, str) or not key or len(key) > UNIQUE_KEY_MAX_LENGTH:
        raise InvalidTask(
            f"unique key must be a non-empty string of at most {UNIQUE_KEY_MAX_LENGTH} "
            f"characters, got {key!r}"
        )


def _first_bad(value: Any) -> Any:
    """The innermost value ``normalize_json`` rejects (for the error message)."""
    if isinstance(value, dict):
        for k, v in value.items():
            for part in (k, v):
                try:
                    normalize_json(part)
                except (TypeError, ValueError):
                    return _first_bad(part)
    elif isinstance(value, list | tuple):
        for v in value:
            try:
                normalize_json(v)
            except (TypeError, ValueError):
                return _first_bad(v)
    return value
