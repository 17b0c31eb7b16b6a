"""The wake-up statements every vendor class has: ``NOTIFY`` / ``LISTEN`` and the notify
trigger.

:class:`NotifySQL` is the part of :class:`~django_taskclaim.backends.base.DatabaseSQL`
(which subclasses it) that :mod:`django_taskclaim.wakeup` asks. The defaults here say
"not supported"; ``postgresql_notify.py`` implements them. The conventions are those of
``base.py``.
"""

from __future__ import annotations

from typing import Any, ClassVar

from django_taskclaim.backends.statement import Statement


class NotifySQL:
    """The wake-up statements of one database vendor (see the module docstring)."""

    #: Django's ``connection.vendor`` this class speaks to (set by ``DatabaseSQL``).
    vendor: str

    # -------------------------------------------------------------------- wake-ups

    #: Whether workers can be woken by the database (``NOTIFY`` / ``LISTEN``).
    supports_notify: ClassVar[bool] = False

    def notify(self, channel: str, payload: str) -> Statement:
        """Send ``payload`` on ``channel`` (delivered when the transaction commits)."""
        raise NotImplementedError(f"{self.vendor} cannot notify workers")

    def listen_sql(self, quoted_channel: str) -> str:
        """Start listening on the (quoted) channel, on a dedicated connection."""
        raise NotImplementedError(f"{self.vendor} cannot notify workers")

    #: Whether the database itself can notify workers, from a trigger on the table
    #: (``ClaimMeta.notify = "trigger"``; :mod:`django_taskclaim.wakeup.trigger`).
    supports_notify_trigger: ClassVar[bool] = False

    def notify_trigger_sql(
        self, *, table: str, status: str, ready: str, channel: str, label: str
    ) -> list[str]:
        """The statements that create (or replace) the trigger notifying ``channel`` with
        ``label`` when a row of ``table`` is inserted ``ready``, or updated to it (all
        quoted: identifiers ``table`` and ``status``, literals ``ready``, ``channel`` and
        ``label``)."""
        raise NotImplementedError(f"{self.vendor} cannot notify workers from a trigger")

    def notify_trigger_comment_sql(self, table: str, comment: str) -> str:
        """Record ``comment`` (a quoted literal) on the notify trigger of ``table``."""
        raise NotImplementedError(f"{self.vendor} cannot notify workers from a trigger")

    def drop_notify_trigger_sql(self, table: str) -> str:
        """Drop the notify trigger of the (quoted) ``table``, if it has one."""
        raise NotImplementedError(f"{self.vendor} cannot notify workers from a trigger")

    def notify_trigger_fingerprints(self, cursor: Any) -> dict[str, str]:
        """Table name → the comment recorded on its notify trigger, for every table that
        has one."""
        raise NotImplementedError(f"{self.vendor} cannot notify workers from a trigger")
