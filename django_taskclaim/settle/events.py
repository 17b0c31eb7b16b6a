"""Waiting for an event: a body parks its row until a named event is emitted (or a
deadline passes); ``emit()`` — from a web request, inside its transaction — makes the
waiting rows due at once. See docs/workflows.md, "Waiting for an event".

Emit and wait meet at one row per event name (``TaskEvent``), which both lock: a wait
either sees the emit (and returns its payload without parking) or parks first and is
then found and woken by the emit. There is no moment where an emit can pass a wait by.
An event emitted before anyone waits is kept: a later wait returns its payload at once.
The first emit of a name wins; later ones change nothing and return ``False``.

Any number of waits and emits of one name take turns at that row's lock, exclusive from
the start (:func:`_locked_event`): none waits for another's share lock, so they do not
deadlock each other, on MySQL / MariaDB either. A deadlock or serialization failure that
still happens (with locks the caller's own transaction holds, say) is retried whole, as
the settles are (:func:`~django_taskclaim.db.retry_transient`), except inside the
caller's transaction, which only the caller can run again.

A parked row is ``ready`` with ``run_after`` at the wait's deadline (database clock):
the timeout needs no poller of its own, the claim takes the row when it is due. The
emit moves ``run_after`` to now, and the row's place in line (``created_at``) from the
deadline back to now (``Change.WAKE`` of ``claim/resets.py``). The parked attempt is not
counted (as ``Snooze``), and the row's durable steps are kept, so its next run finds the
payload — or, past the deadline, :class:`~django_taskclaim.exceptions.EventTimeout` from
the same call.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from django.apps import apps
from django.core.serializers.json import DjangoJSONEncoder
from django.db import connections, models, transaction
from django.db.models import F

from django_taskclaim.backends import for_connection
from django_taskclaim.claim.resets import Change, writes
from django_taskclaim.config import bounds
from django_taskclaim.config.options import get_options
from django_taskclaim.db import DbNow, retry_transient
from django_taskclaim.exceptions import EventTimeout, Parked
from django_taskclaim.settle import transitions
from django_taskclaim.wakeup.notify import notify

#: The longest event name (its column's length).
NAME_LENGTH = 191
EVENT_MODEL = "taskclaim.TaskEvent"
WAIT_MODEL = "taskclaim.TaskEventWait"


def _events(using: str) -> models.QuerySet:
    return apps.get_model(EVENT_MODEL)._base_manager.using(using)


def _waits(using: str) -> models.QuerySet:
    return apps.get_model(WAIT_MODEL)._base_manager.using(using)


def _check_name(name: Any) -> str:
    if not isinstance(name, str) or not name or len(name) > NAME_LENGTH:
        raise ValueError(
            f"an event name is a non-empty text of at most {NAME_LENGTH} characters, got {name!r}"
        )
    return name


def _locked_event(name: str, using: str) -> tuple[Any, Any, Any]:
    """The event row of ``name``, created if missing, locked until the transaction
    ends: (pk, emitted_at, payload).

    A row already there is locked ``FOR UPDATE`` at once (a plain read finds it first);
    a missing one is inserted by the vendor's
    :meth:`~django_taskclaim.backends.base.DatabaseSQL.event_insert`, which on a
    duplicate never takes a share lock. A share lock and then ``FOR UPDATE`` of the same
    row is what deadlocked two waits on InnoDB: each held the share lock that the
    other's exclusive lock waited for."""
    if not _events(using).filter(name=name).exists():
        conn = connections[using]
        with conn.cursor() as cursor:
            cursor.execute(*for_connection(conn).event_insert(conn, name))
    found = (
        _events(using)
        .select_for_update()
        .filter(name=name)
        .values_list("pk", "emitted_at", "payload")
        .get()
    )
    return found[0], found[1], found[2]


def emit(name: str, payload: Any = None, *, using: str = "default") -> bool:
    """Emit the event ``name`` with the JSON ``payload``: the rows waiting for it become
    due at once (and the workers are woken after the commit); a later wait returns the
    payload without parking. Runs in the caller's transaction if there is one (a
    rolled-back emit never happened). Returns ``False`` when the event was emitted
    before: the first emit wins, its payload stays."""
    name = _check_name(name)
    try:
        value = json.loads(json.dumps(payload, cls=DjangoJSONEncoder))
    except (TypeError, ValueError) as exc:
        raise TypeError(f"emit({name!r}): the payload is not JSON ({exc})") from None
    return retry_transient(lambda: _emit(name, value, using), using, what=f"emit {name!r}")


def _emit(name: str, value: Any, using: str) -> bool:
    """One try of :func:`emit`, in one transaction (or the caller's)."""
    with transaction.atomic(using=using):
        pk, emitted_at, _ = _locked_event(name, using)
        if emitted_at is not None:
            return False
        _events(using).filter(pk=pk).update(emitted_at=DbNow(), payload=value)
        # A locking read: the latest waits, whatever snapshot the caller's transaction
        # holds (MariaDB's repeatable read).
        waiting = _waits(using).select_for_update().filter(name=name)
        for label, key in waiting.values_list("task_model", "task_pk"):
            model = apps.get_model(label)
            opts = get_options(model)
            rows = model._base_manager.using(using).filter(pk=model._meta.pk.to_python(key))
            if rows.filter(opts.status_q("ready")).update(**writes(opts, Change.WAKE)):
                notify(model, using=using)  # after the commit, as for a new row
    return True


def wait_for_event(task: Any, name: str, timeout: float | timedelta) -> Any:
    """The payload of the event ``name`` for the running ``task``'s body.

    Emitted already: its payload, at once. Otherwise the row is parked until the event
    or ``timeout`` (seconds or ``timedelta``, counted from the first wait of this row
    for ``name``, database clock) and this call raises :class:`Parked`, which ends the
    attempt (the worker frees the slot; the attempt is not counted). The row's next run
    calls it again: the payload then, or :class:`EventTimeout` past the deadline, which
    the body may catch. The model needs ``run_after``."""
    name = _check_name(name)
    transitions.require_run_after(get_options(task), "wait for an event")
    seconds = bounds.number(
        timeout, "event timeout", bounds.RETRY_DELAY, seconds=True, error=ValueError
    )
    using = task._state.db or "default"
    model = type(task)._meta.concrete_model or type(task)
    where = {"task_model": str(model._meta.label), "task_pk": str(task.pk), "name": name}
    what = f"wait for event {name!r}"
    emitted, found = retry_transient(lambda: _wait(task, where, seconds, using), using, what=what)
    if emitted:
        return found
    if found is None:
        raise EventTimeout(name, seconds)
    raise Parked(found, f"waiting for event {name!r}")


def _wait(task: Any, where: dict[str, str], seconds: float, using: str) -> tuple[bool, Any]:
    """One try of :func:`wait_for_event`, in one transaction (or the caller's):
    ``(True, payload)`` when the event was emitted; else ``(False, seconds left)`` with
    the row parked for them, or ``(False, None)`` past the deadline. The row is parked
    last, and ``task``'s token moves only once that write is done: a try that fails
    before leaves ``task`` as it was, for the next one."""
    name = where["name"]
    with transaction.atomic(using=using):
        _pk, emitted_at, payload = _locked_event(name, using)
        if emitted_at is not None:
            _waits(using).filter(**where).delete()  # done with: a new wait starts afresh
            return True, payload
        wait = apps.get_model(WAIT_MODEL)
        _waits(using).bulk_create(
            [wait(**where, deadline=DbNow() + timedelta(seconds=seconds))], ignore_conflicts=True
        )
        left = (
            _waits(using)
            .filter(**where)
            .annotate(left=F("deadline") - DbNow())
            .values_list("left", flat=True)
            .get()
        )
        remaining = left.total_seconds()
        if remaining <= 0:
            _waits(using).filter(**where).delete()  # a new wait starts a new deadline
            return False, None
        transitions.snooze(task, remaining, floor=0.0)
    return False, remaining
