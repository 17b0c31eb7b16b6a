"""The relay's numeric options, declared once: name, type, default, bound.

:data:`RELAY_OPTIONS` drives both ``manage.py taskclaim_relay``'s argparse (the options
marked ``flag``: ``--partitions``, ``--max-partitions``, …) and the validation of
:class:`~django_taskclaim.outbox.relay.Relay`'s arguments (:func:`validate`), so one
option has one range wherever it is given. A bound may depend on an option declared
before it (``max_partitions`` ≤ ``partitions``; ``backoff_max`` ≥ ``backoff``).

Neighbours: :mod:`django_taskclaim.config.bounds` (the shared :class:`Bound` and its
validator), :mod:`.runner` (what the command calls with the validated values).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from django_taskclaim.config import bounds
from django_taskclaim.config.bounds import Bound
from django_taskclaim.exceptions import ConfigurationError

#: Most partitions a relay layout may have.
MAX_PARTITIONS = 4096


@dataclass(frozen=True)
class RelayOption:
    """One numeric relay option.

    ``name`` is the :class:`~django_taskclaim.outbox.relay.Relay` keyword (and, with
    dashes, the command's ``--flag``); ``default`` ``None`` means "derived" (see
    ``help``); ``bound`` is a :class:`Bound` or a function of the values validated so
    far that returns one; ``flag`` says whether the command offers it; ``relay`` whether
    :class:`~django_taskclaim.outbox.relay.Relay` takes it (``timeout`` is the
    publisher's)."""

    name: str
    type: type[int] | type[float]
    default: int | float | None
    bound: Bound | Callable[[Mapping[str, Any]], Bound]
    help: str
    flag: bool = True
    relay: bool = True

    @property
    def option(self) -> str:
        """The command-line flag (``--max-partitions``)."""
        return "--" + self.name.replace("_", "-")

    def bound_for(self, values: Mapping[str, Any]) -> Bound:
        """The bound given the values validated before this option."""
        return self.bound if isinstance(self.bound, Bound) else self.bound(values)


#: Every numeric option of the relay, in validation order.
RELAY_OPTIONS: tuple[RelayOption, ...] = (
    RelayOption(
        "partitions",
        int,
        1,
        Bound(1, MAX_PARTITIONS, whole=True),
        "key-hash partitions; every relay of the model must use the same number",
    ),
    RelayOption(
        "max_partitions",
        int,
        None,
        lambda values: Bound(1, values["partitions"], whole=True),
        "hold at most this many (default: all)",
    ),
    RelayOption("batch", int, 100, bounds.CLAIM_SIZE, "rows claimed per batch"),
    RelayOption(
        "lease", float, 30.0, Bound(1.0, 3600.0), "partition and row lease in seconds (default 30)"
    ),
    RelayOption("poll", float, 0.5, Bound(0.01, 60.0), "seconds between idle passes"),
    RelayOption(
        "backoff",
        float,
        0.5,
        Bound(0.01, 60.0),
        "first wait before a failed round is retried, doubling",
        flag=False,
    ),
    RelayOption(
        "backoff_max",
        float,
        30.0,
        lambda values: Bound(values["backoff"], 3600.0),
        "longest wait between retries of a failed round",
        flag=False,
    ),
    RelayOption(
        "timeout",
        float,
        10.0,
        Bound(0.1, 300.0),
        "seconds to wait for the broker: connecting, confirming a batch (default 10)",
        relay=False,
    ),
)


def flag_options() -> Iterable[RelayOption]:
    """The options ``manage.py taskclaim_relay`` offers."""
    return (o for o in RELAY_OPTIONS if o.flag)


def validate(
    given: Mapping[str, Any],
    *,
    flags: bool = False,
    error: type[Exception] = ConfigurationError,
) -> dict[str, Any]:
    """The options of ``given`` (by name) checked against their bounds, in table order:
    an ``int`` or ``float`` each, ``None`` kept where the default is derived; ``error``
    with one line naming the option (``--flag`` with ``flags``, which also accepts text)
    otherwise. Options absent from ``given`` are left out."""
    values: dict[str, Any] = {}
    for option in RELAY_OPTIONS:
        if option.name not in given:
            continue
        value = given[option.name]
        if value is None and option.default is None:
            values[option.name] = None
            continue
        name = option.option if flags else option.name
        number = bounds.number(value, name, option.bound_for(values), parse=flags, error=error)
        values[option.name] = option.type(number)
    return values
