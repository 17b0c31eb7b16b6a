"""Resolving and calling the Task of a claimed row.

A :class:`Plan` holds what running the Task stored under one path needs, resolved once
per process (:func:`plan_for`): the Task, its function, whether it is a coroutine
function and a check of stored arguments against its signature (:class:`Binder`).
:func:`decode` reads a row's stored arguments, :meth:`Plan.call` runs the function and
:func:`storable` turns its return value into what will be stored. Nothing here writes
to the database.
"""

from __future__ import annotations

import inspect
import json
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from asgiref.sync import async_to_sync
from django.tasks import Task, TaskContext, TaskResult
from django.utils.json import normalize_json

from django_taskclaim.contrib.tasks.exceptions import ArgumentsUndecodable
from django_taskclaim.contrib.tasks.results import import_task, task_for_row

if TYPE_CHECKING:
    from django_taskclaim.contrib.tasks.models import QueuedTask


class Binder:
    """Checks stored arguments against a task function's signature, computed once.

    For the usual signatures (named parameters only: no positional-only parameter, no
    ``*args`` / ``**kwargs``) a few lookups prove that the arguments bind; anything not
    proven that way goes to ``Signature.bind``, which decides and words the error.
    """

    __slots__ = ("context", "fast", "kwonly", "names", "positional", "required", "signature")

    def __init__(self, func: Callable[..., Any], takes_context: bool) -> None:
        try:
            self.signature: inspect.Signature | None = inspect.signature(func)
        except (TypeError, ValueError):
            self.signature = None
        self.context: list[None] = [None] if takes_context else []
        self.fast = False
        if self.signature is None:
            return
        kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        params = list(self.signature.parameters.values())
        if not all(p.kind in kinds for p in params):
            return
        positional = [p for p in params if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
        if takes_context:
            if not positional:
                return
            params.remove(positional.pop(0))  # the context, bound first by position
        empty, kwonly = inspect.Parameter.empty, inspect.Parameter.KEYWORD_ONLY
        self.positional = tuple(p.name for p in positional)
        self.names = frozenset(p.name for p in params)
        # Positional parameters without a default come first (Python's own rule).
        self.required = sum(1 for p in positional if p.default is empty)
        self.kwonly = tuple(p.name for p in params if p.kind is kwonly and p.default is empty)
        self.fast = True

    def _fits(self, args: list[Any], kwargs: dict[str, Any]) -> bool:
        positional = self.positional
        n = len(args)
        if n > len(positional):
            return False
        if kwargs:
            if not self.names.issuperset(kwargs):
                return False
            for name in positional[:n]:
                if name in kwargs:
                    return False
        for i in range(n, self.required):
            if positional[i] not in kwargs:
                return False
        return not self.kwonly or all(name in kwargs for name in self.kwonly)

    def check(self, args: list[Any], kwargs: dict[str, Any]) -> None:
        """Raise ``TypeError`` (``Signature.bind``'s) if the arguments do not bind."""
        if self.signature is None or (self.fast and self._fits(args, kwargs)):
            return
        self.signature.bind(*self.context, *args, **kwargs)


class Plan:
    """What running the Task stored under one path needs, resolved once per process:
    the Task, its function, whether it is a coroutine function, the signature check."""

    __slots__ = ("binder", "direct", "func", "is_async", "module_path", "takes_context", "template")

    def __init__(self, template: Task) -> None:
        self.template = template
        self.func = template.func
        self.module_path = template.module_path
        self.takes_context = bool(template.takes_context)
        self.is_async = inspect.iscoroutinefunction(self.func)
        # A Task class that overrides call() is called through it, on a Task per row.
        self.direct = type(template).call is Task.call
        self.binder = Binder(self.func, self.takes_context)

    def task(self, row: QueuedTask) -> Task:
        """The Task of ``row`` (its priority, queue, backend and run_after)."""
        return task_for_row(row, self.template)

    def call(
        self, row: QueuedTask, args: list[Any], kwargs: dict[str, Any], result: TaskResult | None
    ) -> Any:
        """Run the task function once with the decoded arguments and return its value;
        whatever it raises propagates. A task that takes a context gets one holding
        ``result`` (see :func:`~.announce.started`); a coroutine function runs on an
        event loop; a Task class that overrides ``call()`` is called through it."""
        if self.takes_context:
            args = [TaskContext(task_result=cast(TaskResult, result)), *args]
        if not self.direct:
            return (result.task if result is not None else self.task(row)).call(*args, **kwargs)
        if self.is_async:
            return async_to_sync(self.func)(*args, **kwargs)
        return self.func(*args, **kwargs)


#: One plan per task path (only paths that resolved to a Task: see ``import_task``).
_PLANS: dict[str, Plan] = {}


def plan_for(path: str) -> Plan:
    """The :class:`Plan` of ``path``, resolved at its first use in this process; raises
    :class:`~.exceptions.TaskUnavailable` (and is tried again next time) if the path
    does not import to a Task."""
    plan = _PLANS.get(path)
    if plan is None:
        plan = _PLANS[path] = Plan(import_task(path))  # raises TaskUnavailable
    return plan


def decode(row: QueuedTask, plan: Plan) -> tuple[list[Any], dict[str, Any]]:
    """The stored arguments of ``row``, checked against the function's signature;
    :class:`~.exceptions.ArgumentsUndecodable` (saying why) if they cannot be used."""
    args, kwargs = row.args, row.kwargs
    if not isinstance(args, list):
        raise ArgumentsUndecodable(
            f"stored positional arguments of {row.task_path} are not a JSON array: {args!r:.200}"
        )
    if not isinstance(kwargs, dict) or (kwargs and not all(isinstance(k, str) for k in kwargs)):
        raise ArgumentsUndecodable(
            f"stored keyword arguments of {row.task_path} are not a JSON object: {kwargs!r:.200}"
        )
    try:
        plan.binder.check(args, kwargs)
    except TypeError as exc:
        raise ArgumentsUndecodable(
            f"stored arguments do not match {row.task_path}{plan.binder.signature}: {exc}"
        ) from exc
    return args, kwargs


def storable(value: Any) -> Any:
    """``value`` as it will be stored (JSON-normalised, as Django's ``TaskResult``
    normalises it); ``TypeError`` / ``ValueError`` if it cannot be stored as JSON. A
    plain ``str``, ``int``, ``bool``, finite ``float`` or ``None`` is taken as is."""
    kind = type(value)
    if (
        value is None
        or kind is int
        or kind is str
        or kind is bool
        or (kind is float and math.isfinite(value))
    ):
        return value
    value = normalize_json(value)
    json.dumps(value, allow_nan=False)
    return value
