"""The relay as a process: what ``manage.py taskclaim_relay`` calls once it has parsed
and validated its options.

:func:`open_relay` builds the named publisher, connects it (an unreachable broker or a
missing client library is a :class:`~django_taskclaim.exceptions.ConfigurationError`:
one line, before anything runs) and the :class:`~django_taskclaim.outbox.relay.Relay`;
:func:`serve` runs it until SIGTERM / SIGINT (a second signal exits at once) or, with
``burst``, until it drained. Neighbours: :mod:`.options` (the validated values),
:mod:`.brokers` (publishers by name), :mod:`.relay`.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Mapping
from typing import Any

from django_taskclaim.exceptions import ConfigurationError
from django_taskclaim.outbox.brokers import make_publisher
from django_taskclaim.outbox.models import OutboxMessage
from django_taskclaim.outbox.options import PUBLISHER_OPTIONS
from django_taskclaim.outbox.publisher import PublishError
from django_taskclaim.outbox.relay import Relay
from django_taskclaim.redact import redact


def open_relay(
    model: type[OutboxMessage],
    publisher: str,
    url: str,
    values: Mapping[str, Any],
    *,
    exchange: str = "",
    using: str | None = None,
) -> Relay:
    """A relay of ``model`` to the connected ``publisher`` (``rabbitmq``, ``nats``) at
    ``url``, with ``values`` (validated :data:`~.options.RELAY_OPTIONS`; ``timeout`` goes
    to the publisher, ``exchange`` too for RabbitMQ). :class:`ConfigurationError` when the
    client library is missing or the broker cannot be reached."""
    extra: dict[str, Any] = {"timeout": float(values["timeout"])}
    if publisher == "rabbitmq":
        extra["exchange"] = exchange
    client = None
    try:
        client = make_publisher(publisher, url, **extra)
        client.connect()
    except ImportError as exc:
        raise ConfigurationError(redact(str(exc))) from None
    except (PublishError, ValueError) as exc:
        if client is not None:
            client.close()  # its event loop and sockets too (NATS), not left to the collector
        raise ConfigurationError(
            redact(f"{publisher} broker at {url} is unreachable: {exc}")
        ) from None
    relay_values = {k: v for k, v in values.items() if k not in PUBLISHER_OPTIONS}
    return Relay(model, client, using=using, **relay_values)


def serve(
    relay: Relay, publisher: str, *, burst: bool = False, write: Callable[[str], None] = print
) -> int:
    """Run ``relay`` with SIGTERM / SIGINT stopping it gracefully (a second one exits at
    once: the leases end by themselves); ``write`` says when it starts (naming
    ``publisher``) and when it stops. Returns the number of messages published."""

    def on_signal(signum: int, _frame: Any) -> None:
        if relay.stopping:  # second signal: exit now (leases end by themselves)
            os._exit(128 + signum)
        relay.stop()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    write(
        f"taskclaim relay {relay.owner} model={relay.model._meta.label} "
        f"publisher={publisher} partitions={relay.partitions}"
    )
    published = relay.run(burst=burst)
    write(f"taskclaim relay stopped: {published} message(s) published")
    return published
