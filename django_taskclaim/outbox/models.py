"""The abstract outbox model: a claimable row per message to publish."""

from __future__ import annotations

import hashlib
import uuid
from typing import Any, ClassVar

from django.db import models
from django.utils.translation import gettext_lazy as _

from django_taskclaim.model.mixins import ClaimableModel

#: Key hashes lie in ``[0, KEY_HASH_SPACE)``; partition ``p`` of ``n`` owns the range
#: ``[p * KEY_HASH_SPACE // n, (p + 1) * KEY_HASH_SPACE // n)``.
KEY_HASH_SPACE = 2**31


def key_hash(key: str) -> int:
    """The stable hash of an ordering key: the first 31 bits of its SHA-256, the same on
    every machine and Python version (never Python's salted ``hash()``)."""
    digest = hashlib.sha256(key.encode("utf-8")).digest()
    return int.from_bytes(digest[:4], "big") & (KEY_HASH_SPACE - 1)


def partition_range(partition: int, partitions: int) -> tuple[int, int]:
    """The half-open range of key hashes partition ``partition`` of ``partitions`` owns."""
    if not 0 <= partition < partitions:
        raise ValueError(f"partition {partition} is not in 0..{partitions - 1}")
    return (
        partition * KEY_HASH_SPACE // partitions,
        (partition + 1) * KEY_HASH_SPACE // partitions,
    )


def new_idempotency_key() -> str:
    """A fresh idempotency key: a random UUID as 32 hex digits."""
    return uuid.uuid4().hex


class OutboxMessage(ClaimableModel):
    """A message to publish, written in the same transaction as the change it announces.

    Adds ``topic`` (the routing key or subject), ``key`` (the ordering key: messages
    with one key are published in ``id`` order), ``key_hash`` (its stable hash, which
    picks the relay partition), ``payload`` (JSON), ``headers`` (JSON object of string
    values) and ``idempotency_key`` (unique; sent as the broker's message id so a
    consumer or the broker can drop duplicates), on top of everything
    :class:`~django_taskclaim.models.ClaimableModel` adds (``created_at`` is written by
    the database clock). Write rows with :func:`django_taskclaim.outbox.publish`; the
    relay (``manage.py taskclaim_relay``) claims them in ``id`` order, publishes them and
    marks them ``done`` (or ``failed`` with the reason when the broker or its client can
    never accept one).
    """

    topic = models.CharField(_("topic"), max_length=255)
    key = models.CharField(_("ordering key"), max_length=255)
    key_hash = models.PositiveIntegerField(_("ordering key hash"), editable=False)
    payload = models.JSONField(_("payload"))
    headers = models.JSONField(_("headers"), default=dict, blank=True)
    idempotency_key = models.CharField(
        _("idempotency key"), max_length=64, unique=True, default=new_idempotency_key
    )

    #: The brokers this outbox's relay publishes to (publisher names): ``publish()``
    #: refuses, up front, a message one of them could never accept (see
    #: :mod:`django_taskclaim.outbox.limits`). Name only yours, e.g. ``("rabbitmq",)``, to
    #: allow what only the others refuse (whitespace in a RabbitMQ routing key); ``()``
    #: checks nothing.
    outbox_brokers: ClassVar[tuple[str, ...]] = ("rabbitmq", "nats")

    #: Rows are published by ``manage.py taskclaim_relay``, never run by a worker (the
    #: model has no handler; the system check's W004 knows this attribute).
    taskclaim_runner = "taskclaim_relay"

    class ClaimMeta:
        # Per-key order needs claims in id order; a message is retried by the relay
        # itself while it holds it, never dead-lettered for its attempts.
        ordering = ("pk",)
        max_attempts = 1_000_000

    class Meta(ClaimableModel.Meta):
        abstract = True
        indexes = [
            *ClaimableModel.Meta.indexes,
            models.Index(
                fields=["key_hash", "id"],
                condition=models.Q(status="ready"),
                name="%(app_label).9s_%(class).12s_relay",
            ),
        ]

    def save(self, *args: Any, **kwargs: Any) -> None:
        """Save the message; ``key_hash`` always follows ``key``."""
        self.key_hash = key_hash(self.key)
        update_fields = kwargs.get("update_fields")
        if update_fields is not None and "key" in update_fields:
            kwargs["update_fields"] = {*update_fields, "key_hash"}
        super().save(*args, **kwargs)

    def __str__(self) -> str:
        return f"{self.topic} key={self.key} id={self.idempotency_key}"
