"""Transitions of every row of a queryset: the operator's requeue, release and cancel.

What ``ClaimQuerySetMixin.requeue`` / ``release`` / ``cancel`` (the admin actions, the
commands) run. Each is one UPDATE of the rows in the states it moves from (or one per
``batch_size`` rows, by primary key, the state re-checked): the state condition is the
fence, and every row's token moves on, so a holder of a moved row writes nothing after.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import partial
from typing import Any

from django.db import models
from django.db.models import F

from django_taskclaim.claim.resets import Change, holder_text, writes
from django_taskclaim.config import bounds
from django_taskclaim.config.options import get_options
from django_taskclaim.db import retry_transient
from django_taskclaim.exceptions import ConfigurationError
from django_taskclaim.row.status import TERMINAL_STATES
from django_taskclaim.settle.dependents import settle_and_release


def _transition(
    qs: models.QuerySet,
    from_states: Iterable[str],
    to_state: str,
    extra: dict[str, Any] | None = None,
    *,
    batch_size: int | None = None,
) -> int:
    """Move the rows of ``qs`` in ``from_states`` to ``to_state`` with the ``extra``
    values, the token + 1; return how many rows moved."""
    opts = get_options(qs.model)
    using = qs.db
    from_states = tuple(from_states)
    updates = {opts.status_field: opts.value(to_state), "version": F("version") + 1}
    updates.update(extra or {})
    base = qs.model._base_manager.using(using)
    scope = qs.filter(opts.status_q(*from_states))
    if to_state in TERMINAL_STATES and opts.dependents:
        return _settling(qs.model, scope, base, from_states, to_state, updates, batch_size)
    if batch_size is None:
        return retry_transient(lambda: scope.update(**updates), using, what="transition")
    batch_size = bounds.number(batch_size, "batch_size", bounds.BATCH_SIZE, error=ValueError)
    total, last = 0, None
    pk_name = qs.model._meta.pk.name
    while True:
        page = scope.order_by("pk")
        if last is not None:
            page = page.filter(pk__gt=last)
        pks = list(page.values_list("pk", flat=True)[:batch_size])
        if not pks:
            return total
        last = pks[-1]
        target = base.filter(**{f"{pk_name}__in": pks}).filter(opts.status_q(*from_states))
        total += retry_transient(partial(target.update, **updates), using, what="transition")


def _settling(
    model: type[models.Model],
    scope: models.QuerySet,
    base: models.QuerySet,
    from_states: tuple[str, ...],
    to_state: str,
    updates: dict[str, Any],
    batch_size: int | None,
) -> int:
    """:func:`_transition` to a final state of a model whose rows may have dependents:
    each page's rows are locked, moved and their dependents released in one transaction
    (:mod:`.dependents`), so the release sees exactly the rows that moved."""
    opts = get_options(model)
    using = scope.db
    size = (
        None
        if batch_size is None
        else int(bounds.number(batch_size, "batch_size", bounds.BATCH_SIZE, error=ValueError))
    )
    total, last = 0, None

    def page() -> tuple[Any, list[Any]]:
        found = scope.order_by("pk")
        if last is not None:
            found = found.filter(pk__gt=last)
        pks = list(
            found.values_list("pk", flat=True)[:size]
            if size
            else found.values_list("pk", flat=True)
        )
        locked = list(
            base.filter(pk__in=pks)
            .filter(opts.status_q(*from_states))
            .select_for_update()
            .values_list("pk", flat=True)
        )
        base.filter(pk__in=locked).update(**updates)
        return (pks[-1] if pks else None), locked

    while True:
        last, moved = settle_and_release(
            model, using, page, lambda r: (r[1], to_state), what="transition"
        )
        total += len(moved)
        if last is None or size is None:
            return total


def requeue(
    qs: models.QuerySet, *, reset_attempts: bool = True, batch_size: int | None = None
) -> int:
    """``failed`` / ``cancelled`` / ``done`` rows of ``qs`` back to ``ready`` now; return
    how many. With ``reset_attempts`` the retry budget starts over."""
    opts = get_options(qs.model)
    extra: dict[str, Any] = {"locked_until": None}
    if reset_attempts:
        extra["attempts"] = 0
    # run_after: due now, and ready since now (the "oldest ready" figures age from it)
    extra.update(writes(opts, Change.REQUEUE))
    states = [s for s in ("failed", "cancelled", "done") if opts.statuses.get(s) is not None]
    return _transition(qs, states, "ready", extra, batch_size=batch_size)


def release(qs: models.QuerySet, *, batch_size: int | None = None) -> int:
    """``processing`` rows of ``qs`` taken back from their holders, ``ready`` now; return
    how many. ``locked_until`` is kept (the rows are marked recovered) and ``last_error``
    names the worker each was taken from."""
    opts = get_options(qs.model)
    extra = writes(opts, Change.RELEASE, error=holder_text(opts, "released from worker "))
    return _transition(qs, ["processing"], "ready", extra, batch_size=batch_size)


def cancel(qs: models.QuerySet, *, batch_size: int | None = None) -> int:
    """``ready``, ``processing`` and ``waiting`` rows of ``qs`` to ``cancelled``; return how many.
    Needs a cancelled state (``ConfigurationError``)."""
    opts = get_options(qs.model)
    if opts.statuses.get("cancelled") is None:
        raise ConfigurationError(f"{opts.label} maps no 'cancelled' status")
    extra = {"locked_until": None, **writes(opts, Change.CANCEL)}
    # a row waiting for its prerequisites is cancelled as a ready one is
    states = [s for s in ("ready", "processing", "waiting") if opts.statuses.get(s) is not None]
    return _transition(qs, states, "cancelled", extra, batch_size=batch_size)
