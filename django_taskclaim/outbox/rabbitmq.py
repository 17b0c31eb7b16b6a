"""The RabbitMQ publisher (``pika``, publisher confirms).

One of the brokers behind :class:`~django_taskclaim.outbox.publisher.Publisher`; its
neighbours: :mod:`.nats`, :mod:`.kafka`, the rules of :mod:`.limits` it checks before
sending, :mod:`.brokers` (by name).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal

from django_taskclaim.outbox.limits import amqp_problem
from django_taskclaim.outbox.publisher import (
    MessagesRejected,
    PublishError,
    body_of,
    headers_of,
    reason,
    refusal,
)


class RabbitMQPublisher:
    """Publishes to RabbitMQ with ``pika``: publisher confirms, persistent messages
    (``delivery_mode=2``), the idempotency key as ``message_id``, ``mandatory`` so an
    unroutable message is reported instead of dropped.

    ``url`` is an AMQP URL (``amqp://guest:guest@127.0.0.1:5672/%2F``); messages go to
    ``exchange`` (default: the default exchange, where the topic names the queue) with
    the topic as routing key. A message no queue is bound for (returned unroutable), or
    one the AMQP client cannot encode (a routing key, message id or header name over 255
    bytes, a payload that is not UTF-8), is rejected for good; a message on which the
    broker closes the channel with ``406 PRECONDITION_FAILED`` (over its size limit) is a
    message error; a negative acknowledgement, a lost connection, a closed channel or a
    timeout is retried.
    """

    def __init__(self, url: str, *, exchange: str = "", timeout: float = 10.0) -> None:
        import pika  # the "outbox" extra

        self._pika = pika
        self.params = pika.URLParameters(url)
        self.params.socket_timeout = timeout
        self.params.blocked_connection_timeout = timeout
        self.params.connection_attempts = 1
        self.exchange = exchange
        self._connection: Any = None
        self._channel: Any = None

    def connect(self) -> None:
        """Open the connection and a confirming channel, unless open."""
        if self._channel is not None and self._channel.is_open:
            try:
                # Services heartbeats missed while idle; a connection the broker dropped
                # meanwhile shows up here and is replaced before anything is published.
                self._connection.process_data_events(0)
                return
            except Exception:
                pass
        self.close()
        try:
            self._connection = self._pika.BlockingConnection(self.params)
            self._channel = self._connection.channel()
            self._channel.confirm_delivery()
        except Exception as exc:  # pika raises many unrelated classes for "no broker"
            self.close()
            raise PublishError(f"cannot reach RabbitMQ: {reason(exc)}") from exc

    def refusal(self, message: Any) -> str | None:
        """Why RabbitMQ can never accept ``message`` (checked before sending), or ``None``."""
        return refusal(message, amqp_problem)

    def publish_batch(self, messages: Sequence[Any]) -> None:
        """Publish each message and wait for its confirm (in order, one channel)."""
        confirmed: list[str] = []
        rejected: dict[str, str] = {}
        errors: dict[str, str] = {}

        def trouble(text: str) -> PublishError:
            self.close()
            # Errors seen before the connection broke may have been the broker's too.
            return PublishError(text, confirmed=confirmed, rejected=rejected)

        for message in messages:
            ident = message.idempotency_key
            problem = self.refusal(message)
            if problem is not None:
                rejected[ident] = problem
                continue
            try:
                self.connect()
            except PublishError as exc:
                raise trouble(str(exc)) from exc
            outcome = self._send(message, trouble)
            if outcome is None:
                confirmed.append(ident)
            elif outcome[0] == "rejected":
                rejected[ident] = outcome[1]
            else:
                errors[ident] = outcome[1]
        if errors:
            try:
                self.connect()  # an error counts against its message only if the broker is up
            except PublishError as exc:
                raise trouble(str(exc)) from exc
            raise PublishError(
                f"{len(errors)} message(s) failed", confirmed=confirmed, rejected=rejected,
                errors=errors,
            )  # fmt: skip
        if rejected:
            raise MessagesRejected(rejected)

    def _send(
        self, message: Any, trouble: Callable[[str], PublishError]
    ) -> tuple[Literal["rejected", "error"], str] | None:
        """Publish ``message`` on the open channel and wait for its confirm: ``None`` once
        confirmed, ``("rejected", why)`` where it can never be delivered, ``("error",
        why)`` for its own error; raises ``trouble(why)`` where the connection, the
        channel or the broker failed (not this message)."""
        exceptions = self._pika.exceptions
        # The client refuses these before anything is sent, whatever the message.
        cannot_encode = (TypeError, ValueError)
        # These say the connection or channel is gone, not that this message is bad.
        broker_trouble = (
            exceptions.AMQPConnectionError,
            exceptions.ChannelClosed,
            exceptions.ChannelWrongStateError,
            OSError,
        )
        props = self._pika.BasicProperties(
            delivery_mode=2,
            content_type="application/json",
            message_id=message.idempotency_key,
            headers=headers_of(message),
        )
        try:
            self._channel.basic_publish(
                self.exchange, message.topic, body_of(message), props, mandatory=True
            )
        except exceptions.UnroutableError:
            return "rejected", (
                f"unroutable: no queue is bound to routing key {message.topic!r} "
                f"on exchange {self.exchange!r}"
            )
        except exceptions.NackError as exc:
            raise trouble(f"RabbitMQ refused the message for now: {reason(exc)}")
        except exceptions.ShortStringTooLong as exc:
            self.close()  # nothing was sent, but start the next one on a fresh channel
            size = len(exc.args[0]) if exc.args else "over 255"
            return "rejected", (
                "the AMQP client cannot send it: ShortStringTooLong: a routing key, "
                f"message id or header name is {size} bytes; AMQP allows at most 255"
            )
        except cannot_encode as exc:
            self.close()
            return "rejected", f"the AMQP client cannot send it: {reason(exc)}"
        except exceptions.ChannelClosedByBroker as exc:
            if exc.reply_code != 406:  # e.g. 404: the exchange does not exist
                raise trouble(f"RabbitMQ publish failed: {reason(exc)}") from exc
            self.close()  # PRECONDITION_FAILED: this message (its size, ...)
            return "error", f"RabbitMQ closed the channel on it: {reason(exc)}"
        except broker_trouble as exc:
            raise trouble(f"RabbitMQ publish failed: {reason(exc)}") from exc
        except Exception as exc:
            self.close()
            return "error", f"RabbitMQ publish failed: {reason(exc)}"
        return None

    def close(self) -> None:
        """Close the connection; never raises."""
        connection, self._connection, self._channel = self._connection, None, None
        if connection is not None:
            try:
                if connection.is_open:
                    connection.close()
            except Exception:
                pass
