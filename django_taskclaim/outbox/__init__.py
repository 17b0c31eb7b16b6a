"""The transactional outbox: messages written with the change they announce, relayed
to a broker at least once, in order per key.

- :class:`OutboxMessage` — the abstract model of a message (claimable).
- :func:`publish` — write one, inside the caller's ``transaction.atomic()``.
- :class:`Relay` — claims, publishes and completes (fenced) the committed rows,
  partitioned by key hash, one relay per partition at a time.
- :mod:`.limits` — what each broker can never accept (``publish()`` checks it).
- Publishers: :class:`RabbitMQPublisher` (``pika``), :class:`NatsPublisher`
  (``nats-py``), :class:`KafkaPublisher` (untested), behind :class:`Publisher`.

See ``docs/outbox.md``.
"""

from __future__ import annotations

from django_taskclaim.outbox.models import KEY_HASH_SPACE, OutboxMessage, key_hash, partition_range
from django_taskclaim.outbox.publishers import (
    KEY_HEADER,
    PUBLISHERS,
    KafkaPublisher,
    MessagesRejected,
    NatsPublisher,
    Publisher,
    PublishError,
    RabbitMQPublisher,
    make_publisher,
)
from django_taskclaim.outbox.relay import MAX_PARTITIONS, MESSAGE_ATTEMPTS, Relay, rounds
from django_taskclaim.outbox.write import default_outbox_model, outbox_model, outbox_models, publish

__all__ = [
    "KEY_HASH_SPACE",
    "KEY_HEADER",
    "MAX_PARTITIONS",
    "MESSAGE_ATTEMPTS",
    "PUBLISHERS",
    "KafkaPublisher",
    "MessagesRejected",
    "NatsPublisher",
    "OutboxMessage",
    "PublishError",
    "Publisher",
    "RabbitMQPublisher",
    "Relay",
    "default_outbox_model",
    "key_hash",
    "make_publisher",
    "outbox_model",
    "outbox_models",
    "partition_range",
    "publish",
    "rounds",
]
