"""System checks about locks and connection poolers (registered on import).

- W003 ``TASKCLAIM_POOLER_MODE = "transaction"`` with a PostgreSQL database: session-scope
  advisory locks (``advisory(..., xact=False)``) are refused at call time and LISTEN
  wake-ups cannot work through the pooler (informational for the operator).
- W010 ``TASKCLAIM_POOLER_MODE = "transaction"`` but a PostgreSQL database does not set
  ``DISABLE_SERVER_SIDE_CURSORS = True`` (Django requires it behind transaction pooling).
- W011 a PostgreSQL database listens on port 6432 (pgBouncer's default) and
  ``TASKCLAIM_POOLER_MODE`` is not declared.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core import checks

from django_taskclaim.backends import for_engine
from django_taskclaim.config.settings import CHECK_TAG, taskclaim_settings

PGBOUNCER_DEFAULT_PORT = 6432


# Not tagged ``database``: the check reads settings only, and ``database`` checks run
# only with ``manage.py check --database``, never under runserver or a plain ``check``.
@checks.register(checks.Tags.compatibility, CHECK_TAG)
def check_pooler(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Warn where the declared pooler mode and the database settings disagree."""
    return pooler_messages(settings.DATABASES, taskclaim_settings.POOLER_MODE)


def pooler_messages(databases: dict[str, Any], mode: str | None) -> list[checks.CheckMessage]:
    """The pooler check for ``databases`` (a ``DATABASES`` dict) and a declared ``mode``."""
    messages: list[checks.CheckMessage] = []
    pooled = [
        (alias, conf)
        for alias, conf in databases.items()
        if (sql := for_engine(conf)) is not None and sql.pooler_mode_applies
    ]
    for alias, conf in pooled:
        if mode == "transaction":
            messages.append(
                checks.Warning(
                    f"Database {alias!r} is declared behind a transaction pooler: "
                    "session-scope advisory locks are refused and LISTEN wake-ups "
                    "do not reach workers.",
                    hint="Use advisory(...) with xact=True (the default) or lease locks "
                    "(LeaseLock, singleton); workers fall back to polling. Silence "
                    "taskclaim.W003 once this is understood.",
                    id="taskclaim.W003",
                )
            )
            if not conf.get("DISABLE_SERVER_SIDE_CURSORS"):
                messages.append(
                    checks.Warning(
                        f"Database {alias!r} is behind a transaction pooler but keeps "
                        "server-side cursors enabled.",
                        hint=f"Set DATABASES[{alias!r}]['DISABLE_SERVER_SIDE_CURSORS'] = "
                        "True; a server-side cursor does not survive a transaction "
                        "that moves to another server connection.",
                        id="taskclaim.W010",
                    )
                )
        elif mode is None and str(conf.get("PORT") or "") == str(PGBOUNCER_DEFAULT_PORT):
            messages.append(
                checks.Warning(
                    f"Database {alias!r} uses port {PGBOUNCER_DEFAULT_PORT}, pgBouncer's "
                    "default, but TASKCLAIM_POOLER_MODE is not set.",
                    hint='Set TASKCLAIM_POOLER_MODE = "transaction" (or "session") to '
                    "match pgBouncer's pool_mode, so that session-scope advisory locks "
                    "are refused where they would not exclude anything.",
                    id="taskclaim.W011",
                )
            )
    return messages
