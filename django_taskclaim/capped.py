"""A cache that empties itself when full: :class:`CappedCache`.

The worker's hot paths keep what they build once per model, database and strategy (the
claimable queryset in :mod:`django_taskclaim.model.queryset`, the compiled candidates
SELECTs in :mod:`django_taskclaim.claim.statements` and :mod:`django_taskclaim.claim.keyed`).
Their keys are few in a real process; the cap only bounds a process that makes endless
distinct ones (a test run, a long-lived shell). At the bottom of the stack: imports nothing.
"""

from __future__ import annotations

#: Entries a cache holds before it is emptied.
CAPPED_CACHE_SIZE = 512


class CappedCache[K, V](dict[K, V]):
    """A ``dict`` whose :meth:`put` empties it first once it holds ``limit`` entries."""

    def __init__(self, limit: int = CAPPED_CACHE_SIZE) -> None:
        super().__init__()
        self.limit = limit

    def put(self, key: K, value: V) -> V:
        """Store ``value`` under ``key`` (after emptying a full cache) and return it."""
        if len(self) >= self.limit:
            self.clear()
        self[key] = value
        return value
