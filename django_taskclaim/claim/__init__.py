"""Claim strategies, one small class each, and the registry that picks one by name.

Every strategy takes a queryset already narrowed to claimable rows (the user's filters
plus ``status = ready`` and ``run_after <= now()``) and turns at most ``n`` of them into
``processing`` rows held by ``worker`` until ``now() + lease`` (database clock), with
``version`` and ``attempts`` bumped. None ever hands one row to two claimers. The vendor
statements they run come from :mod:`django_taskclaim.backends`.

- :mod:`.base`: the :class:`Strategy` base class and the pieces all strategies share;
- :mod:`.statements`: the one-statement claim (``UPDATE … RETURNING``) and completion;
- :mod:`.skip_locked`, :mod:`.cas`, :mod:`.postgresql`: the strategies themselves.

This module holds the registry (:data:`STRATEGIES`, :func:`resolve`) and re-exports the
names the rest of the package imports from ``django_taskclaim.claim``.
"""

from __future__ import annotations

from typing import Any

from django_taskclaim.backends import for_alias
from django_taskclaim.claim.base import (
    RECOVERED_ATTR,
    Strategy,
    candidates,
    claim_columns,
    claim_order,
    claim_updates,
    column,
    status_recheck,
    was_recovered,
)
from django_taskclaim.claim.cas import CompareAndSet, read_claimed
from django_taskclaim.claim.postgresql import Advisory, Hold, Serializable, advisory_table_key
from django_taskclaim.claim.skip_locked import SkipLocked
from django_taskclaim.claim.statements import compile_queryset, complete_many_in_one
from django_taskclaim.config import bounds
from django_taskclaim.exceptions import StrategyNotSupportedError

__all__ = [
    "RECOVERED_ATTR",
    "STRATEGIES",
    "STRATEGY_NAMES",
    "Advisory",
    "CompareAndSet",
    "Hold",
    "Serializable",
    "SkipLocked",
    "Strategy",
    "advisory_table_key",
    "candidates",
    "claim_columns",
    "claim_order",
    "claim_updates",
    "column",
    "compile_queryset",
    "complete_many_in_one",
    "read_claimed",
    "resolve",
    "status_recheck",
    "validate_lease",
    "was_recovered",
]

STRATEGIES: dict[str, Strategy] = {
    s.name: s for s in (SkipLocked(), CompareAndSet(), Advisory(), Serializable(), Hold())
}
#: Every name ``ClaimMeta.strategy`` / ``TASKCLAIM_STRATEGY`` / ``claim(strategy=…)``
#: accepts: ``auto`` (picked per vendor by :func:`resolve`) and each strategy's own.
STRATEGY_NAMES: tuple[str, ...] = ("auto", *STRATEGIES)


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
