"""Models for the outboxapp tests."""

from django.db import models

from django_taskclaim.outbox import OutboxMessage


class Message(OutboxMessage):
    """The outbox of the tests."""


class Order(models.Model):
    """A domain row written in the same transaction as its message."""

    number = models.CharField(max_length=64)
