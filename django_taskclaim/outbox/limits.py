"""What each broker can never accept: the rules :func:`~django_taskclaim.outbox.publish`
checks before writing a row, and each publisher checks again before sending one (rows
written by other means, or before these rules existed).

Pure Python: no broker client is imported, so ``publish()`` checks them in a web process
that has none installed. Each rule returns the first problem as one line, or ``None``.

- RabbitMQ (AMQP 0-9-1): the routing key, the ``message_id`` and header names are short
  strings, at most :data:`AMQP_SHORT_STRING` bytes of UTF-8.
- NATS: a subject is non-empty, has no whitespace or control characters, no empty
  token, no wildcard token (``*``, ``>``) and at most :data:`NATS_MAX_SUBJECT` bytes;
  header names are RFC 7230 tokens; header values hold no CR or LF.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping

from django_taskclaim.exceptions import ConfigurationError

#: Longest AMQP short string (routing key, message id, header name), in bytes.
AMQP_SHORT_STRING = 255
#: Longest NATS subject the relay sends, in bytes (far below the server's 4 KiB
#: control line, which also carries the reply subject and sizes).
NATS_MAX_SUBJECT = 1024

_NATS_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_CONTROL_OR_SPACE = re.compile(r"[\s\x00-\x1f\x7f]")


def _utf8(value: str, what: str) -> bytes | str:
    """``value`` as UTF-8 bytes, or the problem (a lone surrogate has no encoding)."""
    try:
        return value.encode("utf-8")
    except UnicodeEncodeError:
        return f"{what} is not valid Unicode text (it cannot be encoded as UTF-8)"


def amqp_problem(
    topic: str, key: str, headers: Mapping[str, str], idempotency_key: str
) -> str | None:
    """The first reason RabbitMQ can never accept this message, or ``None``."""
    texts = [("topic (the routing key)", topic), ("idempotency_key (the message id)",
             idempotency_key)]  # fmt: skip
    texts += [(f"header name {name!r}", name) for name in headers]
    for what, value in texts:
        encoded = _utf8(value, what)
        if isinstance(encoded, str):
            return encoded
        if len(encoded) > AMQP_SHORT_STRING:
            return (
                f"{what} is {len(encoded)} bytes of UTF-8; RabbitMQ (AMQP) accepts at most "
                f"{AMQP_SHORT_STRING}"
            )
    for what, value in [("key", key), *((f"header {n!r}", v) for n, v in headers.items())]:
        encoded = _utf8(value, what)
        if isinstance(encoded, str):
            return encoded
    return None


def nats_problem(
    topic: str, key: str, headers: Mapping[str, str], idempotency_key: str
) -> str | None:
    """The first reason NATS can never accept this message, or ``None``."""
    encoded = _utf8(topic, "topic (the subject)")
    if isinstance(encoded, str):
        return encoded
    if _CONTROL_OR_SPACE.search(topic):
        return "topic (the NATS subject) contains whitespace or a control character"
    if len(encoded) > NATS_MAX_SUBJECT:
        return (
            f"topic (the NATS subject) is {len(encoded)} bytes of UTF-8; the relay sends "
            f"at most {NATS_MAX_SUBJECT}"
        )
    tokens = topic.split(".")
    if not all(tokens):
        return "topic (the NATS subject) has an empty token (a leading, trailing or double dot)"
    if any(t in ("*", ">") for t in tokens):
        return "topic (the NATS subject) has a wildcard token: publish to a literal subject"
    for name in headers:
        if not _NATS_HEADER_NAME.fullmatch(name):
            return (
                f"header name {name!r} is not a NATS header name "
                "(letters, digits and -_.!#$%&'*+^`|~ only)"
            )
    values = [("key", key), ("idempotency_key", idempotency_key)]
    values += [(f"header {n!r}", v) for n, v in headers.items()]
    for what, value in values:
        encoded = _utf8(value, what)
        if isinstance(encoded, str):
            return encoded
        if "\r" in value or "\n" in value:
            return f"{what} contains a line break, which NATS headers cannot carry"
    return None


#: The rules of each broker, by publisher name.
RULES: dict[str, Callable[[str, str, Mapping[str, str], str], str | None]] = {
    "rabbitmq": amqp_problem,
    "nats": nats_problem,
}


def message_problem(
    topic: str,
    key: str,
    headers: Mapping[str, str],
    idempotency_key: str,
    brokers: Iterable[str],
) -> str | None:
    """The first reason one of ``brokers`` can never accept this message, or ``None``.

    Raises :class:`ConfigurationError` for a broker name without rules."""
    for broker in brokers:
        try:
            rule = RULES[broker]
        except KeyError:
            raise ConfigurationError(
                f"outbox_brokers names {broker!r}; choose among {', '.join(RULES)}"
            ) from None
        problem = rule(topic, key, headers, idempotency_key)
        if problem is not None:
            return f"{problem} ({broker})"
    return None
