"""The NATS JetStream publisher (``nats-py``, a JetStream ack per message).

One of the brokers behind :class:`~django_taskclaim.outbox.publisher.Publisher`; its
neighbours: :mod:`.rabbitmq`, :mod:`.kafka`, the rules of :mod:`.limits` it checks before
sending, :mod:`.brokers` (by name).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

from django_taskclaim.outbox.limits import nats_problem
from django_taskclaim.outbox.publisher import (
    MessagesRejected,
    PublishError,
    body_of,
    headers_of,
    reason,
    refusal,
)
from django_taskclaim.redact import redact

logger = logging.getLogger("django_taskclaim.outbox")


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
            raise PublishError(f"cannot reach NATS: {reason(cause)}") from exc

    async def _note_error(self, exc: Exception) -> None:
        self._last_error = exc
        logger.debug("nats error=%s", redact(str(exc)))

    def refusal(self, message: Any) -> str | None:
        """Why NATS can never accept ``message`` (checked before sending), or ``None``."""
        return refusal(message, nats_problem, {"Nats-Msg-Id": message.idempotency_key})

    def publish_batch(self, messages: Sequence[Any]) -> None:
        """Publish the batch pipelined on one connection; wait for every ack."""
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
        results = self._run(self._publish_all(todo)) if todo else []
        confirmed, errors, retry = _sort_results(todo, results, rejected)
        if retry is not None:
            if not isinstance(retry, js_errors.NoStreamResponseError):
                self._disconnect()
            # Errors seen beside a broken connection may have been the broker's too.
            raise PublishError(
                f"NATS publish failed: {reason(retry)}", confirmed=confirmed, rejected=rejected
            ) from retry
        if errors:
            raise PublishError(
                f"{len(errors)} message(s) failed", confirmed=confirmed, rejected=rejected,
                errors=errors,
            )  # fmt: skip
        if rejected:
            raise MessagesRejected(rejected)

    async def _publish_all(self, todo: Sequence[Any]) -> list[Any]:
        """Publish ``todo`` at once; each one's JetStream ack, or the exception it got."""

        async def one(message: Any) -> Any:
            headers = {**headers_of(message), "Nats-Msg-Id": message.idempotency_key}
            return await self._js.publish(
                message.topic, body_of(message), timeout=self.timeout, headers=headers
            )

        return list(await asyncio.gather(*(one(m) for m in todo), return_exceptions=True))

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


def _sort_results(
    todo: Sequence[Any], results: Sequence[Any], rejected: dict[str, str]
) -> tuple[list[str], dict[str, str], BaseException | None]:
    """Sort each message of ``todo`` by its result: confirmed (its key in the list
    returned), rejected for good (added to ``rejected``: refused by the client before
    sending, or by the stream with a client error), its own error (the dict returned), or
    the trouble of the connection, the server or no stream (the first one returned: the
    batch is retried)."""
    from nats import errors as nats_errors  # the "outbox" extra
    from nats.js import errors as js_errors  # the "outbox" extra

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
            rejected[ident] = reason(result)
        elif (
            isinstance(result, (*broker_trouble, js_errors.APIError))  # 5xx: the server's
            or not isinstance(result, Exception)
        ):
            retry = retry or result
        else:
            errors[ident] = f"NATS publish failed: {reason(result)}"
    return confirmed, errors, retry
