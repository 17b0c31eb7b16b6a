"""Publishers: the brokers a relay publishes to, behind one small protocol.

A publisher's :meth:`Publisher.publish_batch` returns only after the broker confirmed
every message it was given. Otherwise it raises :class:`PublishError`, which says per
message what happened as far as the publisher knows: ``confirmed`` (sent and confirmed:
never sent again), ``rejected`` (the broker or its client can never accept it: the relay
marks it ``failed`` at once) and ``errors`` (it alone failed, for a reason the publisher
cannot classify, while the broker stayed reachable: the relay retries it a few times,
then marks it ``failed``); every other message of the batch is retried, uncounted (the
broker is down, timed out, refused for now). :class:`MessagesRejected` is the case where
only ``rejected`` messages failed. The relay never gives one batch two messages with the
same ordering key, so a publisher may pipeline a batch.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from django_taskclaim.exceptions import TaskClaimError
from django_taskclaim.outbox.limits import amqp_problem, nats_problem

logger = logging.getLogger("django_taskclaim.outbox")

#: Header carrying the ordering key, on every broker.
KEY_HEADER = "Outbox-Key"


class PublishError(TaskClaimError):
    """The broker did not confirm the whole batch.

    ``confirmed``: idempotency keys the broker confirmed before the error; ``rejected``:
    key → reason for messages it (or its client) can never accept; ``errors``: key →
    reason for messages that failed on their own while the broker stayed reachable.
    Every other message of the batch is to be retried (unreachable, timed out, refused
    for now)."""

    def __init__(
        self,
        message: str = "",
        *,
        confirmed: Iterable[str] = (),
        rejected: Mapping[str, str] | None = None,
        errors: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.confirmed = frozenset(confirmed)
        self.rejected = dict(rejected or {})
        self.errors = dict(errors or {})


class MessagesRejected(PublishError):
    """The broker refused some messages for good; ``rejected`` maps each one's
    idempotency key to the broker's reason. Every other message of the batch was
    confirmed."""

    def __init__(self, rejected: Mapping[str, str]) -> None:
        super().__init__(f"{len(rejected)} message(s) rejected by the broker", rejected=rejected)


@runtime_checkable
class Publisher(Protocol):
    """What a relay needs from a broker client."""

    def connect(self) -> None:
        """Connect now (the relay calls it at startup); :class:`PublishError` if the
        broker cannot be reached."""

    def publish_batch(self, messages: Sequence[Any]) -> None:
        """Publish ``messages`` (outbox rows) and return once the broker confirmed all of
        them; raise :class:`PublishError` or :class:`MessagesRejected` otherwise."""

    def close(self) -> None:
        """Close the connection (idempotent)."""


def body_of(message: Any) -> bytes:
    """The message body: its payload as compact UTF-8 JSON."""
    return json.dumps(message.payload, separators=(",", ":"), ensure_ascii=False).encode()


def headers_of(message: Any) -> dict[str, str]:
    """The message's headers plus the ordering key (:data:`KEY_HEADER`)."""
    return {**{str(k): str(v) for k, v in (message.headers or {}).items()}, KEY_HEADER: message.key}


def encoded_body(message: Any) -> bytes | str:
    """The message body, or why it has none (a payload a JSON column stored but UTF-8
    cannot encode)."""
    try:
        return body_of(message)
    except (TypeError, ValueError) as exc:  # UnicodeEncodeError is a ValueError
        return f"the payload cannot be encoded as UTF-8 JSON: {_reason(exc)}"


def refusal(
    message: Any,
    rule: Callable[[str, str, Mapping[str, str], str], str | None],
    extra_headers: Mapping[str, str] | None = None,
) -> str | None:
    """Why a broker whose rules are ``rule`` (see :mod:`.limits`) can never accept
    ``message``, its headers being :func:`headers_of` plus ``extra_headers``; ``None``
    when it can."""
    if not isinstance(message.headers or {}, Mapping):
        return "headers are not a JSON object"
    headers = {**headers_of(message), **(extra_headers or {})}
    problem = rule(message.topic, message.key, headers, message.idempotency_key)
    if problem is None:
        body = encoded_body(message)
        problem = body if isinstance(body, str) else None
    return problem


def _reason(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


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
            raise PublishError(f"cannot reach RabbitMQ: {_reason(exc)}") from exc

    def refusal(self, message: Any) -> str | None:
        """Why RabbitMQ can never accept ``message`` (checked before sending), or ``None``."""
        return refusal(message, amqp_problem)

    def publish_batch(self, messages: Sequence[Any]) -> None:
        """Publish each message and wait for its confirm (in order, one channel)."""
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
            props = self._pika.BasicProperties(
                delivery_mode=2,
                content_type="application/json",
                message_id=ident,
                headers=headers_of(message),
            )
            try:
                self._channel.basic_publish(
                    self.exchange, message.topic, body_of(message), props, mandatory=True
                )
            except exceptions.UnroutableError:
                rejected[ident] = (
                    f"unroutable: no queue is bound to routing key {message.topic!r} "
                    f"on exchange {self.exchange!r}"
                )
            except exceptions.NackError as exc:
                raise trouble(f"RabbitMQ refused the message for now: {_reason(exc)}")
            except exceptions.ShortStringTooLong as exc:
                self.close()  # nothing was sent, but start the next one on a fresh channel
                size = len(exc.args[0]) if exc.args else "over 255"
                rejected[ident] = (
                    "the AMQP client cannot send it: ShortStringTooLong: a routing key, "
                    f"message id or header name is {size} bytes; AMQP allows at most 255"
                )
            except cannot_encode as exc:
                self.close()
                rejected[ident] = f"the AMQP client cannot send it: {_reason(exc)}"
            except exceptions.ChannelClosedByBroker as exc:
                if exc.reply_code != 406:  # e.g. 404: the exchange does not exist
                    raise trouble(f"RabbitMQ publish failed: {_reason(exc)}") from exc
                self.close()  # PRECONDITION_FAILED: this message (its size, ...)
                errors[ident] = f"RabbitMQ closed the channel on it: {_reason(exc)}"
            except broker_trouble as exc:
                raise trouble(f"RabbitMQ publish failed: {_reason(exc)}") from exc
            except Exception as exc:
                self.close()
                errors[ident] = f"RabbitMQ publish failed: {_reason(exc)}"
            else:
                confirmed.append(ident)
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

    def close(self) -> None:
        """Close the connection; never raises."""
        connection, self._connection, self._channel = self._connection, None, None
        if connection is not None:
            try:
                if connection.is_open:
                    connection.close()
            except Exception:
                pass


class NatsPublisher:
    """Publishes to NATS JetStream with ``nats-py``, waiting for each message's
    JetStream acknowledgement; the idempotency key is sent as ``Nats-Msg-Id``, so the
    stream drops a duplicate published within its duplicate window (two minutes by
    default) and the consumer sees it once.

    ``url`` is a NATS URL (``nats://127.0.0.1:4222``); the topic is the subject, which a
    stream must capture. A message over the server's payload limit, one the client
    cannot send (a subject with whitespace, a bad header name, a header value with a
    line break) or one the stream refuses with a client error (4xx) is rejected for
    good; a lost connection, a timeout or no stream answering (503) is retried.
    """

    def __init__(self, url: str, *, timeout: float = 10.0) -> None:
        import nats  # the "outbox" extra

        self._nats = nats
        self.url = url
        self.timeout = timeout
        self._loop: asyncio.AbstractEventLoop | None = None
        self._nc: Any = None
        self._js: Any = None
        self._last_error: BaseException | None = None

    def _run(self, coro: Any) -> Any:
        if self._loop is None or self._loop.is_closed():
            self._loop = asyncio.new_event_loop()
        return self._loop.run_until_complete(coro)

    def connect(self) -> None:
        """Connect (no background reconnects: a lost connection is re-opened by the next
        batch), unless connected."""
        if self._nc is not None and self._nc.is_connected:
            return
        self._disconnect()
        self._last_error = None
        try:
            # nats-py keeps trying a server that refuses the first connection: bound it.
            self._nc = self._run(
                asyncio.wait_for(
                    self._nats.connect(
                        self.url,
                        allow_reconnect=False,
                        connect_timeout=self.timeout,
                        max_reconnect_attempts=0,
                        error_cb=self._note_error,
                    ),
                    self.timeout,
                )
            )
            self._js = self._nc.jetstream(timeout=self.timeout)
        except Exception as exc:
            self._nc = None
            cause = self._last_error or exc
            raise PublishError(f"cannot reach NATS: {_reason(cause)}") from exc

    async def _note_error(self, exc: Exception) -> None:
        self._last_error = exc
        logger.debug("nats error=%s", exc)

    def refusal(self, message: Any) -> str | None:
        """Why NATS can never accept ``message`` (checked before sending), or ``None``."""
        return refusal(message, nats_problem, {"Nats-Msg-Id": message.idempotency_key})

    def publish_batch(self, messages: Sequence[Any]) -> None:
        """Publish the batch pipelined on one connection; wait for every ack."""
        from nats import errors as nats_errors  # the "outbox" extra
        from nats.js import errors as js_errors  # the "outbox" extra

        rejected: dict[str, str] = {}
        todo = []
        for message in messages:
            problem = self.refusal(message)
            if problem is None:
                todo.append(message)
            else:
                rejected[message.idempotency_key] = problem
        if todo:
            try:
                self.connect()
            except PublishError as exc:
                raise PublishError(str(exc), rejected=rejected) from exc

        async def one(message: Any) -> Any:
            headers = {**headers_of(message), "Nats-Msg-Id": message.idempotency_key}
            return await self._js.publish(
                message.topic, body_of(message), timeout=self.timeout, headers=headers
            )

        async def all_of() -> list[Any]:
            return list(await asyncio.gather(*(one(m) for m in todo), return_exceptions=True))

        results = self._run(all_of()) if todo else []
        # Refused by the client before sending, or by the stream with a client error.
        client_refused = (
            nats_errors.MaxPayloadError,
            nats_errors.BadSubjectError,
            nats_errors.BadHeaderError,
            TypeError,
            ValueError,
        )
        # The connection, the server or no stream: never this message's fault.
        broker_trouble = (
            nats_errors.ConnectionClosedError,
            nats_errors.TimeoutError,
            nats_errors.NoRespondersError,
            nats_errors.OutboundBufferLimitError,
            nats_errors.StaleConnectionError,
            nats_errors.UnexpectedEOF,
            nats_errors.ConnectionDrainingError,
            js_errors.ServiceUnavailableError,
            js_errors.NoStreamResponseError,
            asyncio.TimeoutError,
            OSError,
        )
        confirmed: list[str] = []
        errors: dict[str, str] = {}
        retry: BaseException | None = None
        for message, result in zip(todo, results, strict=True):
            ident = message.idempotency_key
            if not isinstance(result, BaseException):
                confirmed.append(ident)
            elif isinstance(result, client_refused) or (
                isinstance(result, js_errors.APIError)
                and not isinstance(result, js_errors.ServiceUnavailableError)
                and isinstance(result.code, int)
                and 400 <= result.code < 500
            ):
                rejected[ident] = _reason(result)
            elif (
                isinstance(result, (*broker_trouble, js_errors.APIError))  # 5xx: the server's
                or not isinstance(result, Exception)
            ):
                retry = retry or result
            else:
                errors[ident] = f"NATS publish failed: {_reason(result)}"
        if retry is not None:
            if not isinstance(retry, js_errors.NoStreamResponseError):
                self._disconnect()
            # Errors seen beside a broken connection may have been the broker's too.
            raise PublishError(
                f"NATS publish failed: {_reason(retry)}", confirmed=confirmed, rejected=rejected
            ) from retry
        if errors:
            raise PublishError(
                f"{len(errors)} message(s) failed", confirmed=confirmed, rejected=rejected,
                errors=errors,
            )  # fmt: skip
        if rejected:
            raise MessagesRejected(rejected)

    def _disconnect(self) -> None:
        nc, self._nc, self._js = self._nc, None, None
        if nc is not None:
            try:
                self._run(nc.close())
            except Exception:
                pass

    def close(self) -> None:
        """Close the connection and its event loop; never raises."""
        self._disconnect()
        loop, self._loop = self._loop, None
        if loop is not None and not loop.is_closed():
            loop.close()


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
            raise PublishError(f"cannot reach Kafka: {_reason(exc)}") from exc

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
