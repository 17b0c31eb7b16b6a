"""Which optional fields each state change writes: one table, :data:`RESETS`.

A claimable model may have the optional fields of
:data:`~django_taskclaim.config.claim_meta.OPTIONAL_FIELDS` (the table names no other).
For each state change (:class:`Change`) the table says what happens to each of them
(:class:`Write`): set to the claiming worker, stamped with the database clock, cleared,
set to the error text or to when the row is due again; a field the table does not name
for a change is kept.
Every write site asks here — the claim strategies (``claim/``), the fenced transitions
and the batched completion (``settle/``), the operator's requeue, release and cancel
(``settle/bulk.py``), the reaper (``recovery/reap.py``) — through :func:`writes` (the
ORM values), :func:`plan` (the fields and what they get, for the vendor claim and
completion statements, whose columns :func:`~django_taskclaim.claim.base.claim_columns`
hands to ``backends/``) and :func:`apply_in_memory` (an instance as the write left it).

Why here, at the bottom of ``claim/``: the table is read by every write of a claimed row,
and the claim is the lowest of them; ``settle/`` and ``recovery/`` stand above ``claim/``
and read it from there. It reads the model's optional fields from ``config/`` and stamps
with ``db``'s clock, both below it (in ``config/`` it tied that folder to ``db``, which
reads the settings, in a circle). ``backends/`` sits lower still and never reads it: the
vendor SQL gets the (column, :class:`Write` value) pairs in
:class:`~django_taskclaim.backends.base.ClaimColumns`, and names the values it can write
(:data:`~django_taskclaim.backends.base.WRITE_HOLDER`, ``WRITE_CLOCK``, ``WRITE_CLEAR``).
"""

from __future__ import annotations

from datetime import timedelta
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from django.db import models
from django.db.models import F, Value
from django.db.models.functions import Coalesce, Concat

from django_taskclaim.backends.base import WRITE_CLEAR, WRITE_CLOCK, WRITE_HOLDER
from django_taskclaim.db import DbNow

if TYPE_CHECKING:
    from django_taskclaim.config.options import ClaimOptions

__all__ = [
    "RESETS",
    "Change",
    "Write",
    "apply_in_memory",
    "holder_text",
    "in_line_field",
    "plan",
    "writes",
]


class Write(StrEnum):
    """What a state change does to one optional field (a field not named: kept). The
    first three are what a vendor statement can write (their values are ``backends``'
    :data:`~django_taskclaim.backends.base.WRITE_HOLDER` and its two siblings)."""

    #: set to the claiming worker's name (a parameter of the statement)
    HOLDER = WRITE_HOLDER
    #: stamped with the database clock of the statement (``DbNow()``)
    CLOCK = WRITE_CLOCK
    #: set to ``NULL``
    CLEAR = WRITE_CLEAR
    #: set to the error text the change gives (kept when it gives none)
    ERROR = "error"
    #: set to when the row may run again: the clock plus the change's delay (``NULL``
    #: when there is no delay)
    DUE = "due"
    #: the row's place in line (the claim ordering's time key, ``created_at``): set to
    #: when the row is due, the clock plus the change's delay, so that it queues behind
    #: every row that was due before it. Written only where the model's claim ordering
    #: names the field ascending (:func:`in_line_field`); elsewhere the field is kept.
    IN_LINE = "in_line"


class Change(StrEnum):
    """The state changes of a claimable row that write its optional fields."""

    #: ``ready`` → ``processing`` (every strategy, and the vendor claim statements)
    CLAIM = "claim"
    #: ``processing`` → ``done`` (one row, a batch, the vendor completion statement)
    COMPLETE = "complete"
    #: ``processing`` → ``failed`` (``fail()``, ``Fail``)
    FAIL = "fail"
    #: ``processing`` → ``ready`` after a backoff (``retry()``, ``Retry``, an error)
    RETRY = "retry"
    #: ``processing`` → ``failed`` by ``retry()`` once the attempts are used up
    GIVE_UP = "give_up"
    #: ``processing`` → ``ready`` now, the attempt not counted (``release()``,
    #: ``give_back()``)
    GIVE_BACK = "give_back"
    #: ``processing`` → ``ready`` after a delay, the attempt not counted (``Snooze``)
    SNOOZE = "snooze"
    #: the operator's requeue: ``failed`` / ``cancelled`` / ``done`` → ``ready``
    REQUEUE = "requeue"
    #: the operator's release: ``processing`` → ``ready``, taken from its holder
    RELEASE = "release"
    #: the operator's cancel: ``ready`` / ``processing`` → ``cancelled``
    CANCEL = "cancel"
    #: the reaper: ``processing`` → ``ready`` (lease expired, or holder proven dead)
    REAP_TO_READY = "reap_to_ready"
    #: the reaper: ``processing`` → ``failed`` (and the attempts used up)
    REAP_TO_FAILED = "reap_to_failed"
    #: the last prerequisite settled: ``waiting`` → ``ready``
    UNBLOCK = "unblock"
    #: a prerequisite ended ``failed`` / ``cancelled`` and the dependent's policy is
    #: ``cancel``: ``waiting`` → ``cancelled``, the error text naming the prerequisite
    PREREQUISITE_FAILED = "prerequisite_failed"
    #: the same with the policy ``hold``: the row stays ``waiting``, the text says why
    HOLD = "hold"
    #: ``emit()`` wakes a row parked by ``wait_for_event()``: due now, in line from now
    WAKE = "wake"
    #: the last prerequisite settled while another active row holds the row's unique
    #: key: ``waiting`` → ``cancelled`` (skipped as a duplicate), the text naming the key
    DUPLICATE = "duplicate"


#: The table: per state change, the optional fields it writes, in the order they are
#: written. Every other optional field is kept: ``locked_by`` keeps the last holder
#: (the reaper's and the release's error text names it); ``claimed_at`` the start of the
#: last attempt (a finished row's runtime is ``finished_at - claimed_at``) until the
#: operator's requeue clears it; ``priority`` and ``task_timeout`` are the producer's and
#: no state change writes them. ``created_at`` is the row's place in line: set when it is
#: enqueued, moved to the due time by the changes a run asks for to come back later
#: (``Snooze``, a park of ``wait_for_event()``, and the emit that wakes it), so
#: that a row that comes back never overtakes rows that were due before it; a row given
#: back or reaped without asking (release, give-back, the reaper) keeps its place, and so
#: does a retry (it counts an attempt: ``max_attempts`` ends any loop).
RESETS: dict[Change, dict[str, Write]] = {
    Change.CLAIM: {"locked_by": Write.HOLDER, "claimed_at": Write.CLOCK},
    Change.COMPLETE: {"finished_at": Write.CLOCK},
    Change.FAIL: {"finished_at": Write.CLOCK, "last_error": Write.ERROR},
    Change.RETRY: {"last_error": Write.ERROR, "run_after": Write.DUE},
    Change.GIVE_UP: {"finished_at": Write.CLOCK, "last_error": Write.ERROR},
    Change.GIVE_BACK: {},
    Change.SNOOZE: {"run_after": Write.DUE, "created_at": Write.IN_LINE},
    Change.REQUEUE: {
        "run_after": Write.CLOCK,
        "claimed_at": Write.CLEAR,
        "finished_at": Write.CLEAR,
    },
    Change.RELEASE: {"last_error": Write.ERROR},
    Change.CANCEL: {"finished_at": Write.CLOCK},
    Change.REAP_TO_READY: {"last_error": Write.ERROR},
    Change.REAP_TO_FAILED: {"last_error": Write.ERROR, "finished_at": Write.CLOCK},
    Change.UNBLOCK: {},
    Change.PREREQUISITE_FAILED: {"finished_at": Write.CLOCK, "last_error": Write.ERROR},
    Change.HOLD: {"last_error": Write.ERROR},
    Change.WAKE: {"run_after": Write.CLOCK, "created_at": Write.IN_LINE},
    Change.DUPLICATE: {"finished_at": Write.CLOCK, "last_error": Write.ERROR},
}

#: One step of a plan: the field's name, its attribute name, what it gets.
Step = tuple[str, str, Write]

_PLANS: dict[type[models.Model], tuple[ClaimOptions, dict[Change, tuple[Step, ...]]]] = {}


def in_line_field(opts: ClaimOptions) -> str | None:
    """The field :attr:`Write.IN_LINE` moves for ``opts``'s model: ``created_at`` when
    the model's claim ordering names it ascending (the default ordering does), else
    ``None`` (the place in line is not a time the library may move)."""
    return "created_at" if opts.has("created_at") and "created_at" in opts.ordering else None


def plan(opts: ClaimOptions, change: Change) -> tuple[Step, ...]:
    """The rows of :data:`RESETS` for ``change`` that the model of ``opts`` has fields
    for (an :attr:`Write.IN_LINE` row only where :func:`in_line_field` names it), in
    table order. Worked out once per model while its options are the same
    object (options are rebuilt when settings change)."""
    model = opts.model
    kept = _PLANS.get(model)
    if kept is None or kept[0] is not opts:
        kept = _PLANS[model] = (opts, {})
    found = kept[1].get(change)
    if found is None:
        found = kept[1][change] = tuple(
            (name, str(getattr(model._meta.get_field(name), "attname", name)), what)
            for name, what in RESETS[change].items()
            if opts.has(name) and (what is not Write.IN_LINE or name == in_line_field(opts))
        )
    return found


def writes(
    opts: ClaimOptions,
    change: Change,
    *,
    holder: str | None = None,
    error: Any = None,
    delay: float = 0.0,
) -> dict[str, Any]:
    """The values ``change`` writes to the optional fields of ``opts``'s model, as an
    ORM update mapping (field name → value or expression), in table order.

    ``holder``: the claiming worker (:attr:`Write.HOLDER`); ``error``: the error text, a
    string or an expression (:attr:`Write.ERROR`; ``None``: the field is kept);
    ``delay``: seconds until the row is due (:attr:`Write.DUE`; ``0``: due now, ``NULL``;
    :attr:`Write.IN_LINE`: the clock plus ``delay``, the clock alone on a model without
    ``run_after``, whose rows are due at once whatever the delay).
    """
    out: dict[str, Any] = {}
    for name, _attname, what in plan(opts, change):
        if what is Write.HOLDER:
            out[name] = holder
        elif what is Write.CLOCK:
            out[name] = DbNow()
        elif what is Write.CLEAR:
            out[name] = None
        elif what is Write.ERROR:
            if error is not None:
                out[name] = error
        elif what is Write.IN_LINE:  # without run_after the row is due now, whatever delay
            due = delay if delay > 0 and opts.has("run_after") else 0.0
            out[name] = DbNow() + timedelta(seconds=due) if due else DbNow()
        else:  # Write.DUE
            out[name] = DbNow() + timedelta(seconds=delay) if delay > 0 else None
    return out


def apply_in_memory(obj: Any, steps: tuple[Step, ...], *, holder: str | None = None) -> None:
    """Set on the instance ``obj`` what a write of ``steps`` left in its row: the holder,
    ``None`` for a cleared field; a value made by the database (the clock, a due time,
    an error text) is dropped from the instance and loaded on access."""
    for _name, attname, what in steps:
        if what is Write.HOLDER:
            setattr(obj, attname, holder)
        elif what is Write.CLEAR:
            setattr(obj, attname, None)
        else:
            obj.__dict__.pop(attname, None)


def holder_text(opts: ClaimOptions, prefix: str, suffix: str | None = None) -> Concat:
    """The error text of a row taken from its holder (:attr:`Write.ERROR` of
    :attr:`Change.RELEASE` and the reaper's changes), built in SQL from the row's own
    ``locked_by`` (``?`` where it has none): ``prefix``, the holder, then ``suffix``
    when one is given."""
    holder = Coalesce(F("locked_by"), Value("?")) if opts.has("locked_by") else Value("?")
    parts = [Value(prefix), holder] if suffix is None else [Value(prefix), holder, Value(suffix)]
    return Concat(*parts, output_field=models.TextField())
