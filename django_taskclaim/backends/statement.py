"""One statement to send, text and parameters (:class:`Statement`): what the vendor
classes of :mod:`django_taskclaim.backends.base` (and its ``base_locks``) return."""

from __future__ import annotations

from typing import Any, NamedTuple


class Statement(NamedTuple):
    """One statement to send: its text (``%s`` placeholders) and its parameters."""

    sql: str
    params: tuple[Any, ...] = ()
