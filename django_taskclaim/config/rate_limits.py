"""A model's rate limits, as its ``ClaimMeta`` declares them, validated once.

``rate_limit = "100/m"`` (``N/s``, ``N/m``, ``N/h``, ``N/d``, or a multiple such as
``"500/30s"``): at most ``N`` claims (task starts) in any window of that length, across
the whole fleet; ``rate_limit_per = "queue"`` makes it one limit per ``queue_name``
value instead of one for the model. ``key_rate_limit = "10/s"``: the same, per value of
``ClaimMeta.concurrency_key``. Both may be set; a claim then respects both.

:func:`rate_limits_of` turns those options into :class:`RateLimit` values (read by
:mod:`~django_taskclaim.config.claim_meta`); the claim enforces them in the database
(:mod:`django_taskclaim.claim.rate`, docs/rate-limits.md).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from django_taskclaim.config import bounds
from django_taskclaim.exceptions import ConfigurationError

#: The field a model's queues are told apart by (the worker's ``--queue``).
QUEUE_FIELD = "queue_name"
#: What ``rate_limit_per`` accepts.
PER = ("model", "queue")

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_FORM = re.compile(r"^\s*(\d+)\s*/\s*(\d+(?:\.\d+)?)?\s*([smhd])\s*$")


@dataclass(frozen=True, slots=True)
class RateLimit:
    """At most ``count`` claims in any window of ``window`` seconds: for the whole model
    (``field`` is ``None``) or per value of ``field`` (``per`` = ``"queue"`` or ``"key"``).
    ``text`` is the option as written, ``option`` its name."""

    text: str
    count: int
    window: float
    per: str
    field: str | None
    option: str


def parse_rate(value: Any, name: str) -> tuple[int, float]:
    """``"N/window"`` as ``(N, window seconds)``, or :class:`ConfigurationError` with one
    line naming ``name``: ``N`` within :data:`~.bounds.RATE_COUNT`, the window within
    :data:`~.bounds.RATE_WINDOW`."""
    match = _FORM.match(value) if isinstance(value, str) else None
    if match is None:
        raise ConfigurationError(
            f"{name} must be a string like '100/m' (N per s, m, h or d, or per a multiple "
            f"such as '500/30s'), got {value!r}"
        )
    count = bounds.number(int(match[1]), f"{name} count", bounds.RATE_COUNT)
    window = float(match[2] or 1) * _UNITS[match[3]]
    bounds.number(window, f"{name} window (seconds)", bounds.RATE_WINDOW)
    return int(count), window


def rate_limits_of(
    label: str, meta: Any, names: set[str], concurrency_key: str | None
) -> tuple[RateLimit, ...]:
    """The rate limits ``meta`` (a ``ClaimMeta`` or ``None``) declares for the model
    ``label`` with concrete fields ``names``; ``()`` when it declares none (claims are
    then exactly as without this feature). Raises :class:`ConfigurationError` (one line,
    naming the model) on a malformed or out-of-range option."""
    out: list[RateLimit] = []
    value = getattr(meta, "rate_limit", None)
    per = getattr(meta, "rate_limit_per", "model")
    if per not in PER:
        raise ConfigurationError(
            f"{label}.ClaimMeta.rate_limit_per must be one of {', '.join(map(repr, PER))}, "
            f"got {per!r}"
        )
    if value is not None:
        count, window = parse_rate(value, f"{label}.ClaimMeta.rate_limit")
        field = None
        if per == "queue":
            if QUEUE_FIELD not in names:
                raise ConfigurationError(
                    f"{label}.ClaimMeta.rate_limit_per = 'queue' needs a concrete "
                    f"{QUEUE_FIELD!r} field"
                )
            field = QUEUE_FIELD
        out.append(RateLimit(value, count, window, per, field, "rate_limit"))
    elif per != "model":
        raise ConfigurationError(f"{label}.ClaimMeta.rate_limit_per needs a rate_limit")
    value = getattr(meta, "key_rate_limit", None)
    if value is not None:
        if concurrency_key is None:
            raise ConfigurationError(f"{label}.ClaimMeta.key_rate_limit needs a concurrency_key")
        count, window = parse_rate(value, f"{label}.ClaimMeta.key_rate_limit")
        out.append(RateLimit(value, count, window, "key", concurrency_key, "key_rate_limit"))
    return tuple(out)
