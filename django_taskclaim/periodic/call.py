"""The body of a ``PeriodicRun`` task: import the schedule's function and call it.

Below ``django_taskclaim.models`` (whose ``PeriodicRun.process`` calls :func:`run_function`):
it imports no model. ``periodic/slots.py`` enqueues the runs; ``periodic/registry.py`` holds
the schedules.
"""

from __future__ import annotations

import inspect
import json
from typing import Any

from asgiref.sync import async_to_sync
from django.core.serializers.json import DjangoJSONEncoder
from django.utils.module_loading import import_string

from django_taskclaim.exceptions import Fail

__all__ = ["run_function"]


def _takes_run(func: Any) -> bool:
    try:
        parameters = inspect.signature(func).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(
        p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL) for p in parameters
    )


def _storable(value: Any) -> Any:
    try:
        json.dumps(value, cls=DjangoJSONEncoder)
    except (TypeError, ValueError):
        return repr(value)[:2000]
    return value


def run_function(run: Any) -> dict[str, Any] | None:
    """Run ``run``'s function once (the body of a ``PeriodicRun`` task): with the row if
    it takes an argument, else with none; ``async def`` functions too. A returned value
    is saved in ``result`` with the completion; ``Retry`` / ``Fail`` / errors follow the
    task rules. A function that can no longer be imported fails the run for good."""
    try:
        func = import_string(run.function)
    except ImportError as exc:
        raise Fail(f"periodic function {run.function!r} cannot be imported: {exc}") from exc
    args = (run,) if _takes_run(func) else ()
    value = async_to_sync(func)(*args) if inspect.iscoroutinefunction(func) else func(*args)
    return None if value is None else {"result": _storable(value)}
