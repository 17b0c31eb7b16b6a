"""The publishers by name: :data:`PUBLISHERS` and :func:`make_publisher`.

Neighbours: the publishers (:mod:`.rabbitmq`, :mod:`.nats`, :mod:`.kafka`, each importing
its client library only when built), the protocol they follow (:mod:`.publisher`) and
:mod:`.runner` (which builds the one the command names).
"""

from __future__ import annotations

from typing import Any

from django_taskclaim.outbox.kafka import KafkaPublisher
from django_taskclaim.outbox.nats import NatsPublisher
from django_taskclaim.outbox.publisher import Publisher
from django_taskclaim.outbox.rabbitmq import RabbitMQPublisher

PUBLISHERS: dict[str, type] = {
    "rabbitmq": RabbitMQPublisher,
    "nats": NatsPublisher,
    "kafka": KafkaPublisher,
}


def make_publisher(name: str, url: str, **options: Any) -> Publisher:
    """The publisher called ``name`` (``rabbitmq``, ``nats``, ``kafka``) for ``url``.

    Raises ``ValueError`` for an unknown name and ``ImportError`` (naming the package to
    install) when its client library is missing."""
    try:
        cls = PUBLISHERS[name]
    except KeyError:
        raise ValueError(
            f"unknown publisher {name!r}; choose one of {', '.join(PUBLISHERS)}"
        ) from None
    try:
        publisher: Publisher = cls(url, **options)
    except ImportError as exc:
        package = {"rabbitmq": "pika", "nats": "nats-py", "kafka": "confluent-kafka"}[name]
        raise ImportError(
            f"the {name} publisher needs {package}: pip install {package} "
            "(or django-taskclaim[outbox])"
        ) from exc
    return publisher
