"""Pause and resume: stop every worker of the fleet from claiming a model's rows (all of
them, or one ``queue_name`` value), and let them claim again.

A pause is a row of :class:`~django_taskclaim.models.QueuePause` on the model's database;
resuming deletes it. The claims leave the paused rows out (:mod:`django_taskclaim.claim.scope`,
from a per-process snapshot of that table at most one poll interval old); rows already
``processing`` finish normally. Both calls log one INFO line with who and when (database
clock) and, on PostgreSQL, notify the listening workers so they see the change at once
(:func:`~django_taskclaim.wakeup.notify.notify_paused`); elsewhere they see it within one
poll interval. See docs/pause.md.
"""

from __future__ import annotations

import logging
from typing import Any

from django.db import DEFAULT_DB_ALIAS, models, router, transaction

from django_taskclaim.claim.paused import invalidate
from django_taskclaim.claim.scope import QUEUE_FIELD, has_queues
from django_taskclaim.config.discovery import is_claimable, resolve_model
from django_taskclaim.config.options import get_options
from django_taskclaim.db import db_now
from django_taskclaim.exceptions import ConfigurationError, NotClaimableError
from django_taskclaim.models import QueuePause
from django_taskclaim.wakeup.notify import notify_paused

__all__ = ["backlog", "describe", "is_paused", "pause", "paused", "report", "resume"]

logger = logging.getLogger("django_taskclaim.flow.pause")

#: The longest ``queue``, ``by`` and ``reason`` (the columns' ``max_length``).
MAX_TEXT = 255


def _model(model: Any) -> type[models.Model]:
    """The concrete claimable model named by ``model`` (a class or ``"app_label.Model"``)."""
    if isinstance(model, str):
        found = resolve_model(model)
    elif isinstance(model, type) and issubclass(model, models.Model):
        found = model
    else:
        raise ConfigurationError(
            f"model must be a model class or an 'app_label.ModelName' label, got {model!r}"
        )
    found = found._meta.concrete_model or found
    if found._meta.abstract or not is_claimable(found):
        get_options(found)  # raises NotClaimableError naming the missing fields
        raise NotClaimableError(f"{found._meta.label} is not claimable: it cannot be paused")
    return found


def _text(value: Any, what: str) -> str:
    if not isinstance(value, str) or len(value) > MAX_TEXT:
        raise ConfigurationError(f"{what} must be a string of at most {MAX_TEXT} characters")
    return value


def _queue(model: type[models.Model], queue: Any) -> str:
    """``""`` for the whole model, else the checked queue name."""
    if queue is None:
        return ""
    if not isinstance(queue, str) or not queue or len(queue) > MAX_TEXT:
        raise ConfigurationError(
            f"queue must be a non-empty string of at most {MAX_TEXT} characters "
            f"(None pauses every queue), got {queue!r}"
        )
    if not has_queues(model):
        raise ConfigurationError(
            f"{model._meta.label} has no {QUEUE_FIELD} field, so no queues: "
            "pause the whole model (no queue)"
        )
    return queue


def _using(model: type[models.Model], using: str | None) -> str:
    return using or router.db_for_write(model)


def _changed(label: str, using: str) -> None:
    """Once the write commits: this process's claims re-read the pauses, the workers
    listening (PostgreSQL) are told."""
    transaction.on_commit(lambda: invalidate(using), using=using)
    notify_paused(label, using)


def _scope(label: str, queue: str) -> str:
    # %r: a queue name is the user's, and a newline in it must not start a log line
    return f"model={label} queue={queue!r}" if queue else f"model={label} queue=*"


def pause(
    model: Any,
    queue: str | None = None,
    *,
    by: str = "",
    reason: str = "",
    using: str | None = None,
) -> QueuePause:
    """Pause ``model`` (a claimable model class or ``"app_label.Model"``): every queue of
    it, or only the rows whose ``queue_name`` is ``queue``. Returns the pause row.

    Guarantee: once this commits, no claim of the paused rows is decided later than one
    poll interval (``TASKCLAIM_POLL_INTERVAL``, a worker's ``--poll``) after the commit,
    on any host (at once in this process; within milliseconds for PostgreSQL workers
    that listen); such a claim returns nothing, it does not fail. Rows already
    ``processing`` finish normally. Idempotent: pausing what is paused returns the
    existing row unchanged (its ``paused_at``, ``paused_by`` and ``reason``).

    Raises :class:`NotClaimableError` for a model that cannot be claimed and
    :class:`ConfigurationError` for a bad label, a ``queue`` on a model without a
    ``queue_name`` field, or a ``queue`` / ``by`` / ``reason`` that is not a string of
    at most 255 characters.
    """
    cls = _model(model)
    name = _queue(cls, queue)
    by, reason = _text(by, "by"), _text(reason, "reason")
    using = _using(cls, using)
    label = cls._meta.label
    row, created = QueuePause.objects.using(using).get_or_create(
        model=label, queue=name, defaults={"paused_by": by, "reason": reason}
    )
    if created:
        row.refresh_from_db(fields=["paused_at"])  # the database clock's value
        _changed(label, using)
        logger.info(
            "queue paused %s by=%r at=%s reason=%r database=%s",
            _scope(label, name),
            by,
            row.paused_at.isoformat(),
            reason,
            using,
        )
    return row


def resume(
    model: Any,
    queue: str | None = None,
    *,
    by: str = "",
    using: str | None = None,
) -> bool:
    """Lift the pause of ``model`` (``queue=None``: the pause of the whole model; a
    pause of one of its queues stays until it is resumed by name) or of its queue
    ``queue``. Returns whether it was paused.

    Guarantee: once this commits, claims see the rows again within one poll interval on
    any host (at once in this process); idle workers are woken (PostgreSQL ``NOTIFY``)
    or find the rows at their next poll. Idempotent: resuming what is not paused
    returns ``False`` and changes nothing. Raises as :func:`pause` does.
    """
    cls = _model(model)
    name = _queue(cls, queue)
    by = _text(by, "by")
    using = _using(cls, using)
    label = cls._meta.label
    deleted, _ = QueuePause.objects.using(using).filter(model=label, queue=name).delete()
    if not deleted:
        return False
    _changed(label, using)
    logger.info(
        "queue resumed %s by=%r at=%s database=%s",
        _scope(label, name),
        by,
        db_now(using).isoformat(),
        using,
    )
    return True


def paused(model: Any = None, *, using: str | None = None) -> list[QueuePause]:
    """Every pause (of ``model`` only, when given) on ``using`` (default: the model's
    database, else ``default``), read now from the database, ordered by model and queue
    (the whole-model pause, ``queue = ""``, first)."""
    qs = QueuePause.objects.all()
    if model is not None:
        cls = _model(model)
        qs = qs.filter(model=cls._meta.label)
        using = _using(cls, using)
    return list(qs.using(using or DEFAULT_DB_ALIAS).order_by("model", "queue"))


def is_paused(model: Any, queue: str | None = None, *, using: str | None = None) -> bool:
    """Whether claims of ``model`` (of its queue ``queue``, when given) are paused, read
    now from the database: the whole model is paused, or that queue is."""
    cls = _model(model)
    name = _queue(cls, queue)
    using = _using(cls, using)
    queues = [""] if not name else ["", name]
    rows = QueuePause.objects.using(using).filter(model=cls._meta.label, queue__in=queues)
    return rows.exists()


def backlog(row: QueuePause, *, using: str | None = None) -> int | None:
    """How many ``ready`` rows the pause ``row`` keeps waiting (due now or later): the
    model's ready rows, of its queue when it names one. ``None`` when the model is no
    longer installed or claimable (a stale pause row)."""
    try:
        cls = _model(row.model)
    except ConfigurationError:
        return None
    using = using or row._state.db or _using(cls, None)
    qs = cls._default_manager.db_manager(using).filter(get_options(cls).status_q("ready"))
    if row.queue and has_queues(cls):
        qs = qs.filter(**{QUEUE_FIELD: row.queue})
    return int(qs.count())


def describe(row: QueuePause, *, using: str | None = None) -> str:
    """One line about the pause ``row`` for operators: what is paused, since when (the
    database clock), by whom, why, and how many ready rows wait (:func:`backlog`)."""
    return _describe(row, backlog(row, using=using))


def _describe(row: QueuePause, waiting: int | None) -> str:
    what = f"queue {row.queue}" if row.queue else "every queue"
    text = f"{row.model} {what} paused since {row.paused_at:%Y-%m-%d %H:%M:%S%z}"
    text += f" by {row.paused_by}" if row.paused_by else " (by whom not recorded)"
    if row.reason:
        text += f" ({row.reason})"
    if waiting is None:
        return text + ": the model is no longer installed or claimable"
    return text + f", {waiting} ready row{'s' if waiting != 1 else ''} waiting"


def report(models: Any = None, *, using: str | None = None) -> list[dict[str, Any]]:
    """Every pause on ``using`` (of ``models`` only, when given: model classes or labels),
    as JSON-ready dictionaries: ``model``, ``queue`` (``""``: every queue), ``paused_at``
    (ISO 8601, database clock), ``paused_by``, ``reason``, ``ready`` (:func:`backlog`)
    and ``text`` (:func:`describe`)."""
    using = using or DEFAULT_DB_ALIAS
    rows = QueuePause.objects.using(using).order_by("model", "queue")
    if models is not None:
        rows = rows.filter(model__in=[_model(m)._meta.label for m in models])
    out = []
    for row in rows:
        waiting = backlog(row, using=using)
        out.append(
            {
                "model": row.model,
                "queue": row.queue,
                "paused_at": row.paused_at.isoformat(),
                "paused_by": row.paused_by,
                "reason": row.reason,
                "ready": waiting,
                "text": _describe(row, waiting),
            }
        )
    return out
