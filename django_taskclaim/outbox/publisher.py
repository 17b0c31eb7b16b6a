"""The publisher protocol: what a relay needs from a broker client.

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

Here: the protocol, its errors, and what every publisher shares (a message's body and
headers, :func:`refusal`). The publishers: :mod:`.rabbitmq`, :mod:`.nats`, :mod:`.kafka`;
by name: :mod:`.brokers`; their caller: :mod:`.relay`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from django_taskclaim.exceptions import TaskClaimError
from django_taskclaim.redact import redact

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
        return f"the payload cannot be encoded as UTF-8 JSON: {reason(exc)}"


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


def reason(exc: BaseException) -> str:
    """``exc`` as one line: its class and the first line of its text (any password in
    it hidden: :func:`~django_taskclaim.redact.redact`)."""
    full = redact(str(exc)).strip()
    text = full.splitlines()[0] if full else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
