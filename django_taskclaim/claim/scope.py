"""What a claim may take: the rows of the caller's queryset that are ``ready`` and due
(``claimable()``), and whether that set is the same every time (so its SQL is compiled
once).

Every claim decides its scope here, before a strategy runs. It is where a condition on
what may be claimed belongs (a paused queue, a rate limit): one place, every strategy.
"""

from __future__ import annotations

from typing import Any

from django_taskclaim.capped import CappedCache


def plain_key(qs: Any, strategy: str) -> tuple[Any, ...] | None:
    """A cache key for claims on ``qs`` when it has no filters, slicing, ``extra()``,
    ``distinct()`` or set operation of the caller's: its claim SQL is then the same
    every time. ``None`` otherwise (the SQL is compiled afresh)."""
    query = qs.query
    if (
        query.has_filters()
        or query.is_sliced
        or query.extra
        or query.distinct
        or query.combinator
        or query.select_for_update
        or query.deferred_loading != (frozenset(), True)  # only() / defer()
    ):
        return None
    return (type(qs), qs.model, qs.db, strategy)


_CLAIMABLE: CappedCache[tuple[Any, ...], Any] = CappedCache()


def claimable(qs: Any, cache_key: tuple[Any, ...] | None) -> Any:
    """``qs.claimable()`` (its ``ready`` rows that are due), built once per
    ``cache_key``. The strategies only derive new querysets from it (or use its model
    and database), never evaluate it."""
    if cache_key is None:
        return qs.claimable()
    found = _CLAIMABLE.get(cache_key)
    if found is None:
        found = _CLAIMABLE.put(cache_key, qs.claimable())
    return found
