"""Writing outbox messages: :func:`publish`, inside the caller's transaction."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from django.apps import apps
from django.db import router

from django_taskclaim.exceptions import ConfigurationError
from django_taskclaim.outbox.limits import message_problem
from django_taskclaim.outbox.models import OutboxMessage, key_hash, new_idempotency_key

#: Longest topic, key and idempotency key (the columns' lengths).
MAX_TOPIC = MAX_KEY = 255
MAX_IDEMPOTENCY_KEY = 64


def _text(value: Any, name: str, limit: int) -> str:
    if not isinstance(value, str) or not value or len(value) > limit or "\x00" in value:
        raise ValueError(f"{name} must be a non-empty string of at most {limit} characters")
    return value


def outbox_model(model: Any) -> type[OutboxMessage]:
    """``model`` if it is a concrete outbox model; :class:`ConfigurationError` otherwise."""
    if not isinstance(model, type) or not issubclass(model, OutboxMessage) or model._meta.abstract:
        label = getattr(getattr(model, "_meta", None), "label", repr(model))
        raise ConfigurationError(
            f"{label} is not an outbox model: inherit django_taskclaim.outbox.OutboxMessage"
        )
    return model


def outbox_models() -> list[type[OutboxMessage]]:
    """The installed concrete outbox models."""
    return [m for m in apps.get_models() if issubclass(m, OutboxMessage)]


def default_outbox_model() -> type[OutboxMessage]:
    """The one installed outbox model; :class:`ConfigurationError` when there are none or
    several (then pass ``model=``)."""
    found = outbox_models()
    if len(found) != 1:
        names = ", ".join(m._meta.label for m in found) or "none installed"
        raise ConfigurationError(
            f"publish() needs model= when there is not exactly one outbox model ({names})"
        )
    return found[0]


def publish(
    topic: str,
    payload: Any,
    *,
    key: str | None = None,
    headers: Mapping[str, str] | None = None,
    idempotency_key: str | None = None,
    model: type[OutboxMessage] | None = None,
    using: str | None = None,
) -> OutboxMessage:
    """Write one message to the outbox table; return the saved row.

    ``model`` is the outbox model (default: the only one installed).

    Call it inside the ``transaction.atomic()`` block that makes the change the message
    announces: the message then commits with the change or not at all, and the relay
    only ever sees committed rows. Outside a transaction the row is simply committed
    at once (autocommit), like any other ``save()``.

    ``topic`` is the RabbitMQ routing key / NATS subject; ``key`` the ordering key
    (default: the topic): messages with one key are published in the order of their
    ids. ``payload`` must be JSON-serialisable; ``headers`` is a mapping of strings.
    ``idempotency_key`` (default: a random UUID) is unique in the table and is the
    broker's message id, so a consumer can drop the duplicates at-least-once delivery
    allows. Bad arguments raise ``ValueError``, and so does a message one of the
    model's ``outbox_brokers`` could never accept (a RabbitMQ routing key over 255 bytes
    of UTF-8, a NATS subject with whitespace, ...): it would never be delivered.
    """
    model = default_outbox_model() if model is None else outbox_model(model)
    _text(topic, "topic", MAX_TOPIC)
    key = topic if key is None else _text(key, "key", MAX_KEY)
    try:
        # The relay sends the payload as UTF-8 JSON: a lone surrogate cannot be encoded.
        json.dumps(payload, allow_nan=False, ensure_ascii=False).encode("utf-8")
    except (TypeError, ValueError) as exc:
        raise ValueError(f"payload is not JSON-serialisable: {exc}") from None
    heads = dict(headers or {})
    for name, value in heads.items():
        if not isinstance(name, str) or not name or not isinstance(value, str):
            raise ValueError("headers must map non-empty strings to strings")
    if idempotency_key is None:
        idempotency_key = new_idempotency_key()
    else:
        _text(idempotency_key, "idempotency_key", MAX_IDEMPOTENCY_KEY)
    problem = message_problem(topic, key, heads, idempotency_key, model.outbox_brokers)
    if problem is not None:
        raise ValueError(f"the broker would refuse this message: {problem}")
    message = model(
        topic=topic,
        key=key,
        key_hash=key_hash(key),
        payload=payload,
        headers=heads,
        idempotency_key=idempotency_key,
    )
    message.save(force_insert=True, using=using or router.db_for_write(model))
    return message
