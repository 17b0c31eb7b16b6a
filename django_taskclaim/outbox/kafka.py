"""The Kafka publisher (``confluent-kafka``): untested, no Kafka broker runs in the tests.

One of the brokers behind :class:`~django_taskclaim.outbox.publisher.Publisher`; its
neighbours: :mod:`.rabbitmq`, :mod:`.nats`, :mod:`.brokers` (by name).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django_taskclaim.outbox.publisher import (
    MessagesRejected,
    PublishError,
    body_of,
    headers_of,
    reason,
)


class KafkaPublisher:
    """Publishes to Kafka with ``confluent-kafka`` (idempotent producer, ``acks=all``;
    the idempotency key as the ``Idempotency-Key`` header, the ordering key as the
    Kafka key so one key stays in one partition). **Untested**: no Kafka broker runs in
    the test suite. It follows the same protocol as the others."""

    def __init__(self, url: str, *, timeout: float = 10.0) -> None:
        import confluent_kafka  # not part of the "outbox" extra

        self._kafka = confluent_kafka
        self.timeout = timeout
        self._producer = confluent_kafka.Producer(
            {"bootstrap.servers": url, "enable.idempotence": True, "acks": "all"}
        )

    def connect(self) -> None:
        """Ask the cluster for its metadata; :class:`PublishError` if it does not answer."""
        try:
            self._producer.list_topics(timeout=self.timeout)
        except Exception as exc:
            raise PublishError(f"cannot reach Kafka: {reason(exc)}") from exc

    def publish_batch(self, messages: Sequence[Any]) -> None:
        """Produce the batch and flush; every delivery report must be a success."""
        failures: dict[str, Any] = {}

        def report(message: Any) -> Any:
            def done(err: Any, _msg: Any) -> None:
                if err is not None:
                    failures[message.idempotency_key] = err

            return done

        for message in messages:
            headers = {**headers_of(message), "Idempotency-Key": message.idempotency_key}
            self._producer.produce(
                message.topic,
                value=body_of(message),
                key=message.key.encode(),
                headers=list(headers.items()),
                on_delivery=report(message),
            )
        if self._producer.flush(self.timeout) > 0:
            raise PublishError("Kafka did not confirm every message in time")
        retriable = {k: e for k, e in failures.items() if e.retriable()}
        if retriable:
            raise PublishError(f"Kafka refused {len(retriable)} message(s) for now")
        if failures:
            raise MessagesRejected({k: str(e) for k, e in failures.items()})

    def close(self) -> None:
        """Flush what is left (bounded by the timeout)."""
        self._producer.flush(self.timeout)
