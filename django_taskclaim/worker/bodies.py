"""How a task body is called, read once per model from its handler's signature.

A handler is ``handler(row)``, a ``process(self)`` method included. Two opt-ins, each
seen in the signature:

- a parameter named ``cancel`` gets the row's cancellation flag, a
  ``threading.Event`` set when the claim is taken back (the same flag
  ``row.cancel_requested()`` reads), passed by keyword: ``def process(self, cancel)``;
- an ``async def`` handler runs on the process's event loop (:mod:`.aio`), unless the
  model is ``ClaimMeta.atomic`` (its body and completion share one transaction, so it
  runs on its executor thread, as before).

Handlers with neither are called exactly as before.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from asgiref.sync import iscoroutinefunction

#: The parameter name through which a handler asks for its cancellation flag.
CANCEL_PARAMETER = "cancel"


@dataclass(frozen=True)
class Body:
    """A model's handler and how to call it."""

    handler: Callable[..., Any]
    is_async: bool
    wants_cancel: bool
    #: For a sync body without ``cancel`` (the usual), what the executor runs, as it is:
    #: ``(handler, True)``, the callable and that it returns no coroutine; else ``None``.
    plain: tuple[Callable[..., Any], bool] | None = field(init=False)

    def __post_init__(self) -> None:
        plain = None if self.is_async or self.wants_cancel else (self.handler, True)
        object.__setattr__(self, "plain", plain)  # frozen: set once, here

    @classmethod
    def of(cls, handler: Callable[..., Any]) -> Body:
        return cls(
            handler=handler,
            is_async=is_async(handler),
            wants_cancel=takes_cancel(handler),
        )

    def kwargs(self, flag: Any) -> dict[str, Any]:
        """The keyword arguments beside the row: ``{"cancel": flag}`` or nothing."""
        return {CANCEL_PARAMETER: flag} if self.wants_cancel else {}


def is_async(handler: Callable[..., Any]) -> bool:
    """Whether calling ``handler`` returns a coroutine (``async def``, also behind a
    ``functools.partial`` or as an object's ``async def __call__``)."""
    if iscoroutinefunction(handler):
        return True
    call = getattr(handler, "__call__", None)  # noqa: B004 - the method, not callable()
    return call is not None and not inspect.isfunction(handler) and iscoroutinefunction(call)


def takes_cancel(handler: Callable[..., Any]) -> bool:
    """Whether ``handler`` declares a ``cancel`` parameter that can be passed by keyword."""
    try:
        parameters = inspect.signature(handler).parameters
    except (TypeError, ValueError):  # a builtin or a C callable: called as before
        return False
    p = parameters.get(CANCEL_PARAMETER)
    return p is not None and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
