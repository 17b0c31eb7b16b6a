"""What a claim may take: the rows of the caller's queryset that are ``ready`` and due
(``claimable()``), and whether that set is the same every time (so its SQL is compiled
once).

Every claim decides its scope here, before a strategy runs. It is where a condition on
what may be claimed belongs (a paused queue, a rate limit): one place, every strategy.
Paused queues are left out by :func:`unpaused` (docs/pause.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.db import transaction

from django_taskclaim.backends import for_alias
from django_taskclaim.capped import CappedCache
from django_taskclaim.claim.paused import paused_queues
from django_taskclaim.claim.rate import claim_limited
from django_taskclaim.exceptions import ConfigurationError

#: The attribute :func:`on_queue` sets on the one queryset it returns: the filter it added,
#: as part of the cache key. Django copies no such attribute to a clone, so a queryset
#: derived from that one (another filter, an ``order_by()``…) has none.
_FILTER_KEY = "_taskclaim_filter_key"


def plain_key(qs: Any, strategy: str) -> tuple[Any, ...] | None:
    """A cache key for claims on ``qs`` when it has no filters, slicing, ``extra()``,
    ``distinct()`` or set operation of the caller's (or only the queue filter of
    :func:`on_queue`): its claim SQL is then the same every time. ``None`` otherwise
    (the SQL is compiled afresh)."""
    query = qs.query
    added = qs.__dict__.get(_FILTER_KEY)
    if (
        (added is None and query.has_filters())
        or query.is_sliced
        or query.extra
        or query.distinct
        or query.combinator
        or query.select_for_update
        or query.deferred_loading != (frozenset(), True)  # only() / defer()
    ):
        return None
    if added is not None:
        return (type(qs), qs.model, qs.db, strategy, added)
    return (type(qs), qs.model, qs.db, strategy)


def on_queue(qs: Any, queue: str) -> Any:
    """``qs.filter(queue_name=queue)`` whose claims compile their SQL once, as an
    unfiltered queryset's do: when ``qs`` itself is plain (:func:`plain_key`), the
    result carries the filter for its cache key (compiling a filtered claim costs more
    than the rest of the claim's Python). The worker's ``--queue``."""
    out = qs.filter(**{QUEUE_FIELD: queue})
    if plain_key(qs, "") is not None and not out.query.is_sliced:
        out.__dict__[_FILTER_KEY] = (QUEUE_FIELD, queue)
    return out


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


#: The field a model's queues are told apart by (the worker's ``--queue``).
QUEUE_FIELD = "queue_name"


def has_queues(model: Any) -> bool:
    """Whether ``model`` has queues: a concrete field named :data:`QUEUE_FIELD`."""
    return any(f.name == QUEUE_FIELD for f in model._meta.concrete_fields)


def pauses_read_in_claim(using: str) -> bool:
    """Whether claims on ``using`` read the pause table inside their own transaction
    (:func:`in_claim_transaction`, ``unpaused(exact=True)``) instead of this process's
    snapshot: where one writer at a time holds the database (SQLite), the claim's
    transaction holds the write lock when it writes, so that read is exact and costs no
    round trip (the database is in the process)."""
    return bool(for_alias(using).one_writer_at_a_time)


def in_claim_transaction(claim: Callable[[], list[Any]], using: str) -> Callable[[], list[Any]]:
    """``claim`` run in one transaction on ``using``: the read of the pause table and the
    claim itself (the compare-and-set claim's transaction joins it without a savepoint;
    the keyed claim's is a savepoint of it). On SQLite that
    transaction starts ``IMMEDIATE`` (the write lock first) where the settings say so;
    otherwise a writer that committed after the read makes the claim's write fail as
    busy (retried): either way no pause committed before the claim wrote is missed."""

    def run() -> list[Any]:
        with transaction.atomic(using=using):
            return claim()

    return run


def unpaused(
    qs: Any, cache_key: tuple[Any, ...] | None, *, exact: bool = False
) -> tuple[Any, Any] | None:
    """:func:`claimable` without the paused queues of ``qs.model`` on ``qs.db``, with the
    cache key of that narrower set; ``None`` when the whole model is paused (the claim
    returns nothing).

    Paused queues come from this process's snapshot of the pause table
    (:func:`~.paused.paused_queues`, at most one poll interval old), or with ``exact``
    from the table itself, read now (inside the claim's transaction: see
    :func:`pauses_read_in_claim`): while nothing of the model is paused the claim is
    exactly :func:`claimable`, same SQL, same cache key; otherwise it excludes
    ``queue_name IN (paused…)`` and is compiled (once per set of paused queues) under
    its own key. A pause of a queue of a model without queues (written by hand) is
    ignored."""
    model = qs.model._meta.concrete_model
    queues = paused_queues(model._meta.label, qs.db, exact=exact)
    if not queues:
        return claimable(qs, cache_key), cache_key
    if "" in queues:
        return None
    if not has_queues(model):
        return claimable(qs, cache_key), cache_key
    names = tuple(sorted(queues))
    key = None if cache_key is None else (*cache_key, "paused", names)
    found = _CLAIMABLE.get(key) if key is not None else None
    if found is None:
        found = claimable(qs, cache_key).exclude(**{f"{QUEUE_FIELD}__in": names})
        if key is not None:
            _CLAIMABLE.put(key, found)
    return found, key


def within_rate_limits(strategy: Any, request: Any) -> list[Any]:
    """``strategy.claim(request)``, held to the model's rate limits
    (``ClaimMeta.rate_limit`` / ``key_rate_limit``: :func:`~.rate.claim_limited`, in
    one transaction with the claim; docs/rate-limits.md). A model without one claims
    exactly as before: no extra statement."""
    if not request.opts.rate_limits:
        return strategy.claim(request)
    if strategy.name == "serializable":
        raise ConfigurationError(
            f"{request.opts.label} has a rate limit: claim it with skip_locked, cas, "
            "advisory or hold (the serializable strategy must open its own transaction)"
        )
    return claim_limited(strategy.claim, request)
