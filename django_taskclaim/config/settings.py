"""Project-wide settings, all prefixed ``TASKCLAIM_`` and read live on every access.

``from django_taskclaim.config.settings import taskclaim_settings`` then
``taskclaim_settings.LEASE`` returns ``settings.TASKCLAIM_LEASE`` if the project sets
it, else the default below. Because nothing is cached, ``override_settings`` works.
Unknown ``TASKCLAIM_*`` names are reported by the system check ``taskclaim.E001``;
numeric ones are bounded by :data:`django_taskclaim.config.bounds.SETTINGS` (``taskclaim.E005``).
Every setting is documented in ``docs/settings.md``.
"""

from __future__ import annotations

import difflib
from typing import Any

from django.conf import settings

PREFIX = "TASKCLAIM_"
#: The tag of every django-taskclaim system check (``manage.py check --tag taskclaim``).
CHECK_TAG = "taskclaim"

#: name (without prefix) -> default value
DEFAULTS: dict[str, Any] = {
    # Claiming
    "STRATEGY": "auto",  # auto | skip_locked | cas | advisory | serializable | hold
    "LEASE": 300.0,  # seconds a claim is held before the reaper may take it back
    "MAX_ATTEMPTS": 5,  # claims before a task ends failed
    "RETRY_BACKOFF": 2.0,  # seconds; delay = RETRY_BACKOFF * 2 ** (attempts - 1)
    "RETRY_BACKOFF_MAX": 3600.0,  # cap of the exponential backoff, seconds
    "RETRY_JITTER": 0.25,  # +/- fraction of random jitter applied to the backoff
    "CAS_CANDIDATES": 16,  # rows read per round by the cas strategy
    "CLAIM_GATE": 50,  # claims of this many rows or more take turns per table; None = never
    "DB_RETRIES": 10,  # retries of deadlocks / serialization failures / "database is locked"
    # Recovery
    "REAP_BATCH": 1000,  # rows per reaper statement
    "REAP_INTERVAL": 30.0,  # seconds between periodic reaps inside workers
    # Worker
    "POLL_INTERVAL": 1.0,  # seconds between polls when no notification arrives
    "WORKER_DATABASES": None,  # aliases one worker fleet drains; None = each model's router alias
    "ACK_WINDOW": 0.05,  # seconds a worker may hold completions to write them in one batch
    "HEARTBEAT_INTERVAL": None,  # seconds; None = a third of the lease
    "WORKER_SILENT_AFTER": 60.0,  # shown as silent after this long; display only, never death
    "NOTIFY": True,  # PostgreSQL: NOTIFY workers when ready rows are committed
    "NOTIFY_CHANNEL": "taskclaim",
    # Locks / poolers
    "POOLER_MODE": None,  # None | "session" | "transaction" (pgBouncer pool_mode)
}


class TaskClaimSettings:
    """Live view of the ``TASKCLAIM_*`` settings with their defaults."""

    def __getattr__(self, name: str) -> Any:
        if name not in DEFAULTS:
            raise AttributeError(f"unknown django-taskclaim setting {PREFIX}{name}")
        return getattr(settings, PREFIX + name, DEFAULTS[name])

    def unknown_names(self) -> list[tuple[str, str | None]]:
        """Return ``(name, suggestion)`` for each ``TASKCLAIM_*`` setting we do not know."""
        found = []
        known = [PREFIX + k for k in DEFAULTS]
        for name in dir(settings):
            if name.startswith(PREFIX) and name[len(PREFIX) :] not in DEFAULTS:
                if name[len(PREFIX) :] in REMOVED:
                    continue  # reported with its own message
                close = difflib.get_close_matches(name, known, n=1)
                found.append((name, close[0] if close else None))
        return found

    def removed_names(self) -> list[tuple[str, str]]:
        """``(name, what to do instead)`` for each removed ``TASKCLAIM_*`` setting set."""
        return [(PREFIX + n, why) for n, why in REMOVED.items() if hasattr(settings, PREFIX + n)]


#: Settings that existed once, with what to do instead (reported by ``taskclaim.E001``).
REMOVED: dict[str, str] = {
    "WORKER_DEAD_AFTER": (
        "silence is no longer taken as death: a silent worker's rows wait for their lease "
        "(or for its supervisor, or an operator, to release them). Use "
        "TASKCLAIM_WORKER_SILENT_AFTER to say when the admin and stats show a worker as silent."
    ),
}

taskclaim_settings = TaskClaimSettings()
