"""The relay's numeric options, declared once: name, flag, type, default, bound, help.

:data:`RELAY_OPTIONS` (each a :class:`~django_taskclaim.config.commandline.Option`, the
type every command's options share) drives both ``manage.py taskclaim_relay``'s argparse
(the options with ``flags``: ``--partitions``, ``--max-partitions``, …) and the validation of
:class:`~django_taskclaim.outbox.relay.Relay`'s arguments (:func:`validate`), so one
option has one range wherever it is given. A bound may depend on an option declared
before it (``max_partitions`` ≤ ``partitions``; ``backoff_max`` ≥ ``backoff``).

Neighbours: :mod:`django_taskclaim.config.bounds` (the shared :class:`Bound` and its
validator), :mod:`.runner` (what the command calls with the validated values).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from django_taskclaim.config import bounds
from django_taskclaim.config.bounds import Bound
from django_taskclaim.config.commandline import Option
from django_taskclaim.exceptions import ConfigurationError

#: Most partitions a relay layout may have.
MAX_PARTITIONS = 4096
#: The options the publisher takes, not :class:`~django_taskclaim.outbox.relay.Relay`.
PUBLISHER_OPTIONS = frozenset({"timeout"})


def _flag(name: str) -> tuple[str, ...]:
    return ("--" + name.replace("_", "-"),)


#: Every numeric option of the relay, in validation order. ``default`` ``None`` means
#: "derived" (see ``help``); one without ``flags`` is not offered by the command.
RELAY_OPTIONS: tuple[Option, ...] = (
    Option(
        "partitions", _flag("partitions"), int, 1,
        "key-hash partitions; every relay of the model must use the same number",
        Bound(1, MAX_PARTITIONS, whole=True),
    ),
    Option(
        "max_partitions", _flag("max_partitions"), int, None,
        "hold at most this many (default: all)",
        lambda values: Bound(1, values["partitions"], whole=True),
    ),
    Option("batch", _flag("batch"), int, 100, "rows claimed per batch", bounds.CLAIM_SIZE),
    Option(
        "lease", _flag("lease"), float, 30.0, "partition and row lease in seconds (default 30)",
        Bound(1.0, 3600.0),
    ),
    Option("poll", _flag("poll"), float, 0.5, "seconds between idle passes", Bound(0.01, 60.0)),
    Option(
        "backoff", (), float, 0.5, "first wait before a failed round is retried, doubling",
        Bound(0.01, 60.0),
    ),
    Option(
        "backoff_max", (), float, 30.0, "longest wait between retries of a failed round",
        lambda values: Bound(values["backoff"], 3600.0),
    ),
    Option(
        "timeout", _flag("timeout"), float, 10.0,
        "seconds to wait for the broker: connecting, confirming a batch (default 10)",
        Bound(0.1, 300.0),
    ),
)  # fmt: skip


def flag_options() -> Iterable[Option]:
    """The options ``manage.py taskclaim_relay`` offers."""
    return (o for o in RELAY_OPTIONS if o.flags)


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
        label = option.flag if flags else option.name
        values[option.name] = option.check(
            value, earlier=values, label=label, parse=flags, error=error
        )
    return values
