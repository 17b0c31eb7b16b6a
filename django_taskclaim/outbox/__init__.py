"""The transactional outbox: messages written with the change they announce, relayed
to a broker at least once, in order per key.

- :mod:`.models` — :class:`OutboxMessage`, the abstract model of a message (claimable),
  and the key-hash partitions.
- :mod:`.write` — :func:`publish`: write one, inside the caller's ``transaction.atomic()``.
- :mod:`.limits` — what each broker can never accept (``publish()`` checks it).
- :mod:`.relay` — :class:`Relay`: claims, publishes and completes (fenced) the committed
  rows in rounds; :mod:`.partitions` — which key-hash partitions it holds, one relay per
  partition at a time (lease); :mod:`.options` — its numeric options, declared once;
  :mod:`.runner` — the relay as a process (``manage.py taskclaim_relay``).
- :mod:`.publisher` — the :class:`Publisher` protocol and its errors; the publishers:
  :mod:`.rabbitmq` (``pika``), :mod:`.nats` (``nats-py``), :mod:`.kafka` (untested);
  :mod:`.brokers` — them by name (``make_publisher``).

This package names what a user writes (``OutboxMessage``, ``publish``, ``Relay``, and
for a publisher of one's own ``Publisher``, ``PublishError``, ``MessagesRejected``);
import the rest from its module.
"""

from __future__ import annotations

from django_taskclaim.outbox.models import OutboxMessage
from django_taskclaim.outbox.publisher import MessagesRejected, Publisher, PublishError
from django_taskclaim.outbox.relay import Relay
from django_taskclaim.outbox.write import publish

__all__ = ["MessagesRejected", "OutboxMessage", "PublishError", "Publisher", "Relay", "publish"]
