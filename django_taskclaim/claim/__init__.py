"""Claim strategies, one small class each, and the registry that picks one by name.

Every strategy takes a queryset already narrowed to claimable rows (the user's filters
plus ``status = ready`` and ``run_after <= now()``) and turns at most ``n`` of them into
``processing`` rows held by ``worker`` until ``now() + lease`` (database clock), with
``version`` and ``attempts`` bumped. None ever hands one row to two claimers. The vendor
statements they run come from :mod:`django_taskclaim.backends`.

- :mod:`.base`: the :class:`Strategy` base class and the pieces all strategies share;
- :mod:`.statements`: the one-statement claim (``UPDATE … RETURNING``) and completion;
- :mod:`.skip_locked`, :mod:`.cas`, :mod:`.pg_strategies`: the strategies themselves;
  :mod:`.keyed` and :mod:`.key_slots` for models with a concurrency key;
- :mod:`.scope`: what a claim may take (the ready, due rows of the caller's queryset);
- :mod:`.request`: :class:`~.request.ClaimRequest`, one claim as every strategy gets it.

This module holds the registry (:data:`STRATEGIES`, :func:`resolve`), :func:`claim_rows`
(what ``queryset.claim()`` runs) and :func:`validate_lease`; every other name is
imported from the module that defines it.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from django.db import DatabaseError

from django_taskclaim import signals
from django_taskclaim.backends import for_alias
from django_taskclaim.claim import scope
from django_taskclaim.claim.base import Strategy
from django_taskclaim.claim.cas import CompareAndSet
from django_taskclaim.claim.pg_strategies import Advisory, Hold, Serializable
from django_taskclaim.claim.request import ClaimRequest
from django_taskclaim.claim.skip_locked import SkipLocked
from django_taskclaim.config import bounds
from django_taskclaim.config.claim_meta import STRATEGY_NAMES
from django_taskclaim.config.options import get_options
from django_taskclaim.db import default_worker_id, in_user_atomic, is_transient, retry_transient
from django_taskclaim.exceptions import (
    ClaimInTransactionError,
    ConfigurationError,
    StrategyNotSupportedError,
)

__all__ = ["STRATEGIES", "claim_rows", "resolve", "validate_lease"]

logger = logging.getLogger("django_taskclaim.claim")

STRATEGIES: dict[str, Strategy] = {
    s.name: s for s in (SkipLocked(), CompareAndSet(), Advisory(), Serializable(), Hold())
}


def resolve(name: str, using: str) -> Strategy:
    """Return the strategy called ``name`` (``auto`` picks per vendor) or raise clearly."""
    if name == "auto":
        for candidate in ("skip_locked", "cas"):
            if STRATEGIES[candidate].supported(using):
                return STRATEGIES[candidate]
    strategy = STRATEGIES.get(name)
    if strategy is None:
        raise StrategyNotSupportedError(
            f"unknown claim strategy {name!r}; choose one of {', '.join(STRATEGY_NAMES)}"
        )
    if not strategy.supported(using):
        raise StrategyNotSupportedError(
            f"claim strategy {name!r} is not supported on {for_alias(using).vendor} "
            f"(database {using!r}); use 'cas' (every database) or 'auto'"
        )
    return strategy


def validate_lease(lease: Any) -> float:
    """``lease`` in seconds as a float, or :class:`ConfigurationError` unless it is a
    finite number within :data:`~.bounds.LEASE` (a ``timedelta`` is accepted too)."""
    return float(bounds.number(lease, "lease", bounds.LEASE, seconds=True))


def claim_rows(
    queryset: Any,
    n: int = 1,
    *,
    lease: float | timedelta | None = None,
    worker: str | None = None,
    strategy: str | None = None,
) -> list[Any]:
    """``queryset.claim(n, …)``: validate the arguments, refuse a claim inside the
    caller's own ``atomic()`` (except ``hold``, which needs one), decide what may be
    claimed (:mod:`.scope`), run the strategy as one :class:`.request.ClaimRequest`
    (transient errors retried), and send ``task_claimed``. Guarantees: see
    :meth:`~django_taskclaim.model.queryset.ClaimQuerySetMixin.claim`."""
    n = bounds.number(n, "claim(n)", bounds.CLAIM_SIZE, error=ValueError)
    opts = get_options(queryset.model)
    using = queryset.db
    lease_s = validate_lease(opts.lease if lease is None else lease)
    if worker is not None and (not isinstance(worker, str) or len(worker) > 255):
        raise ConfigurationError(
            f"worker must be a string of at most 255 characters, got {worker!r}"
        )
    worker = worker or default_worker_id()
    strat = resolve(strategy or opts.strategy, using)
    if strat.needs_caller_atomic:
        if not in_user_atomic(using):
            raise ClaimInTransactionError(
                f"strategy {strat.name!r} holds row locks for a transaction: call it "
                f"inside transaction.atomic(using={using!r}) and process the rows there"
            )
    elif in_user_atomic(using):
        raise ClaimInTransactionError(
            "claim() was called inside an open transaction.atomic() block: the claim "
            "would stay invisible to other workers until that block commits and would "
            "hold row locks meanwhile. Claim outside the block, then use "
            "task.fenced() for transactional work on the claimed row."
        )
    cache_key = scope.plain_key(queryset, strat.name)
    exact = scope.pauses_read_in_claim(using)

    def claim() -> list[Any]:
        narrowed = scope.unpaused(queryset, cache_key, exact=exact)
        if narrowed is None:  # the whole model is paused: nothing to claim
            return []
        request = ClaimRequest(narrowed[0], n, opts, lease_s, worker, narrowed[1])
        return scope.within_rate_limits(strat, request)

    try:
        rows = retry_transient(
            scope.in_claim_transaction(claim, using) if exact else claim,
            using,
            what=f"claim {opts.label}",
        )
    except DatabaseError as exc:
        if not (strat.conflict_means_taken and is_transient(exc, using)):
            raise
        logger.info("claim of %s lost the race on every retry: claimed nothing", opts.label)
        return []
    if rows:
        signals.task_claimed.send(sender=queryset.model, tasks=rows, worker=worker, using=using)
    return rows
