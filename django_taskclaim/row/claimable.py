"""Types shared by the library's modules (no runtime behaviour)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, ClassVar, Protocol, cast

from django.db.models import Model
from django.db.models.base import ModelState
from django.db.models.options import Options


class Claimable(Protocol):
    """A row of a claimable model, as the lifecycle and the worker use it.

    Any instance of a model with the claim fields (:class:`~.mixins.ClaimableModel` or
    the finer mixins) is one. Its status lives in the field ``ClaimMeta.status_field``
    names, read with ``getattr``; ``version`` is the claim token every fenced write
    compares.
    """

    _meta: ClassVar[Options[Any]]
    _state: ModelState
    pk: Any
    version: int
    attempts: int
    locked_until: datetime | None

    def complete(self, **fields: Any) -> None: ...


def model_of(task: Claimable) -> type[Model]:
    """The model class of a claimed row (for the ORM calls that want a ``Model`` type)."""
    return cast(type[Model], type(task))
