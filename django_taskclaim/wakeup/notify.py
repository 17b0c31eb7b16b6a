"""PostgreSQL ``LISTEN/NOTIFY`` wake-ups: workers start ready rows without waiting to poll.

Senders: a ``post_save`` hook notifies when a row of a claimable model is saved in the
``ready`` state (connected by :func:`connect_signals` from the app's ``ready()``), and
:func:`notify` is the call to make after ``bulk_create()``, ``update()`` or raw inserts,
which send no ``post_save``. A notification is sent when the saving transaction commits
(never before: a worker woken earlier would not see the row), once per model and
transaction. The payload is the model label (``app_label.ModelName``) on the channel
``TASKCLAIM_NOTIFY_CHANNEL``.

Receiver: :class:`~django_taskclaim.worker.maintenance.listener.Listener`, a thread of
the worker on its own dedicated psycopg connection (this module imports nothing of the
worker). Notifications are only a hint: workers also poll (with jitter), so a lost
notification delays a task by at most one poll interval and never loses it.
"""

from __future__ import annotations

import logging
from typing import Any

from django.db import connections, models, router, transaction
from django.db.models.signals import post_save

from django_taskclaim.backends import for_alias, for_connection
from django_taskclaim.claim.paused import NOTICE_PREFIX
from django_taskclaim.config.discovery import is_claimable
from django_taskclaim.config.options import get_options
from django_taskclaim.config.settings import taskclaim_settings

logger = logging.getLogger("django_taskclaim.wakeup.notify")

_DISPATCH_UID = "django_taskclaim.wakeup.notify.on_save"
_claimable_cache: dict[type, bool] = {}


def _channel() -> str:
    return str(taskclaim_settings.NOTIFY_CHANNEL)


def _mode(model: type[models.Model]) -> bool | str:
    """The model's ``notify`` option (``False`` for a model that is not claimable)."""
    cached = _claimable_cache.get(model)
    if cached is None:
        cached = _claimable_cache[model] = bool(not model._meta.abstract and is_claimable(model))
    if not cached:
        return False
    return get_options(model).notify


def notify(model: type[models.Model], using: str | None = None) -> bool:
    """Wake the workers listening for ``model`` once the current transaction commits.

    Call it after ``bulk_create()``, ``QuerySet.update()`` or raw SQL that made rows of
    ``model`` ready: those send no ``post_save``. Outside a transaction the
    notification goes out at once. Returns whether a notification was (or will be)
    sent: only on PostgreSQL, and only if the model's ``notify`` option
    (``ClaimMeta.notify`` / ``TASKCLAIM_NOTIFY``) is on. Repeated calls inside one
    transaction send one notification. With ``notify = "trigger"`` the table's trigger
    has sent it already: nothing more is sent, and the answer is ``True``.
    """
    if model._meta.proxy:
        model = model._meta.concrete_model  # type: ignore[assignment]
    using = using or router.db_for_write(model)
    conn = connections[using]
    mode = _mode(model)
    if not for_connection(conn).supports_notify or not mode:
        return False
    if mode == "trigger":
        return True
    label = model._meta.label
    # One callback per model and transaction: look for ours among the pending ones.
    for entry in conn.run_on_commit:
        if getattr(entry[1], "taskclaim_label", None) == label:
            return True

    def send() -> None:
        try:
            statement = for_alias(using).notify(_channel(), label)
            with connections[using].cursor() as cursor:
                cursor.execute(statement.sql, statement.params)
        except Exception as exc:  # a lost hint only delays the task until the next poll
            logger.warning("notify failed model=%s database=%s error=%s", label, using, exc)

    send.taskclaim_label = label  # type: ignore[attr-defined]
    transaction.on_commit(send, using=using)
    return True


def notify_paused(label: str, using: str) -> bool:
    """Tell the listening workers that the pauses of the model ``label`` changed, once
    the current transaction commits (at once outside one): they re-read the paused
    queues and, for a model they serve, claim again. Only on PostgreSQL (``False``
    elsewhere: workers there see the change within one poll interval)."""
    if not for_alias(using).supports_notify:
        return False

    def send() -> None:
        try:
            statement = for_alias(using).notify(_channel(), NOTICE_PREFIX + label)
            with connections[using].cursor() as cursor:
                cursor.execute(statement.sql, statement.params)
        except Exception as exc:  # the workers see it at their next poll instead
            logger.warning("pause notify failed model=%s database=%s error=%s", label, using, exc)

    transaction.on_commit(send, using=using)
    return True


def _on_save(sender: type[models.Model], instance: models.Model, **kwargs: Any) -> None:
    if kwargs.get("raw") or _mode(sender) is not True:  # "trigger": the table sends it
        return
    opts = get_options(sender)
    if getattr(instance, opts.status_field) != opts.value("ready"):
        return
    notify(sender, using=kwargs.get("using"))


def connect_signals() -> None:
    """Connect the ``post_save`` hook that notifies workers of rows saved ``ready``.

    Idempotent; called from the app's ``ready()``.
    """
    post_save.connect(_on_save, dispatch_uid=_DISPATCH_UID, weak=False)


def disconnect_signals() -> None:
    """Undo :func:`connect_signals` (for projects that only want explicit notifies)."""
    post_save.disconnect(dispatch_uid=_DISPATCH_UID)
