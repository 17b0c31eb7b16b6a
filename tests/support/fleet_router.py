"""A database router for the fleet tests: one model (``TASKCLAIM_SHARD_ROUTE``) lives on
the ``shard`` database, everything else on ``default``."""

from __future__ import annotations

import os
from typing import Any


class ShardRouter:
    def _alias(self, model: Any) -> str | None:
        label = os.environ.get("TASKCLAIM_SHARD_ROUTE")
        return "shard" if label and model._meta.label == label else None

    def db_for_read(self, model: Any, **hints: Any) -> str | None:
        return self._alias(model)

    def db_for_write(self, model: Any, **hints: Any) -> str | None:
        return self._alias(model)
