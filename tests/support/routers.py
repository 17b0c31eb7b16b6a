"""Database routers the tests install with ``override_settings(DATABASE_ROUTERS=…)``."""

from __future__ import annotations

from tests.support.testapp.models import Document


class ElsewhereRouter:
    """Sends ``Document``'s reads and writes to an alias that does not exist: a claim of a
    queryset on ``default`` must never ask it."""

    def db_for_read(self, model, **hints):
        return "elsewhere" if model is Document else None

    def db_for_write(self, model, **hints):
        return "elsewhere" if model is Document else None


ELSEWHERE = "tests.support.routers.ElsewhereRouter"
