"""Lease renewals of many claimed rows: the heartbeats' fenced writes.

:func:`extend_leases` moves the leases of many claimed rows in one fenced UPDATE;
:func:`renew_leases` does the same without waiting for a row another session holds
locked (the worker's heartbeat). Each row is written only while it is held under the
token its instance carries (:func:`~django_taskclaim.rules.held_q`); the token does not
move. What ``ClaimQuerySetMixin.extend_leases`` / ``renew_leases`` run; the single-row
:func:`~django_taskclaim.settle.transitions.extend_lease` is a transition.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

from django.db import connections, models, transaction

from django_taskclaim.claim import validate_lease
from django_taskclaim.config.options import get_options
from django_taskclaim.db import DbNow, retry_transient
from django_taskclaim.rules import held_q


def _held_by(
    model: type[models.Model], using: str, tasks: Sequence[Any], seconds: float | timedelta | None
) -> tuple[float, models.QuerySet, Callable[[], set[Any]]]:
    """For a lease write on ``tasks``: the lease (validated), their rows still under
    each task's token (the fence), and a plain read of which of them are still
    ``processing`` under it, as ``(pk, token)`` pairs (no lock waited for: MVCC). Pairs,
    not keys: an earlier attempt of a row held beside its current claim is lost."""
    opts = get_options(model)
    lease = validate_lease(opts.lease if seconds is None else seconds)
    tokens = [(t.pk, t.version) for t in tasks]
    base = model._base_manager.using(using)
    fenced = base.filter(held_q(opts, tokens, using))
    rows = base.filter(held_q(opts, tokens))
    return lease, fenced, lambda: set(rows.values_list("pk", "version"))


def extend_leases(
    model: type[models.Model],
    using: str,
    tasks: Sequence[Any],
    seconds: float | timedelta | None = None,
) -> list[Any]:
    """Extend the leases of the claimed ``tasks`` (rows of ``model`` on ``using``) in one
    statement; return those lost (their token no longer matches), which are not touched.
    The token does not move."""
    if not tasks:
        return []
    lease, fenced, alive = _held_by(model, using, tasks, seconds)
    n = retry_transient(
        lambda: fenced.update(locked_until=DbNow() + timedelta(seconds=lease)),
        using,
        what="extend leases",
    )
    if n == len(tasks):
        return []
    still = alive()
    return [t for t in tasks if (t.pk, t.version) not in still]


def renew_leases(
    model: type[models.Model],
    using: str,
    tasks: Sequence[Any],
    seconds: float | timedelta | None = None,
) -> tuple[list[Any], list[Any]]:
    """Extend the leases of the claimed ``tasks`` without waiting for any row lock;
    return ``(lost, busy)`` (see ``ClaimQuerySetMixin.renew_leases``).

    On databases with ``SKIP LOCKED`` the rows no other session holds locked are picked
    in one transaction (``SELECT … FOR UPDATE SKIP LOCKED``, then the ``UPDATE``);
    elsewhere (SQLite, which locks the whole file) one ``UPDATE``."""
    if not tasks:
        return [], []
    lease, fenced, alive_now = _held_by(model, using, tasks, seconds)
    base = model._base_manager.using(using)
    until = DbNow() + timedelta(seconds=lease)
    features = connections[using].features
    if not (features.has_select_for_update and features.has_select_for_update_skip_locked):
        n = retry_transient(lambda: fenced.update(locked_until=until), using, what="renew leases")
        if n == len(tasks):
            return [], []
        renewed = None  # one statement: which rows it hit is not known
    else:

        def renew() -> set[Any]:
            with transaction.atomic(using=using):
                held = list(fenced.select_for_update(skip_locked=True).values_list("pk", "version"))
                if held:
                    base.filter(pk__in=[pk for pk, _ in held]).update(locked_until=until)
            return set(held)

        renewed = retry_transient(renew, using, what="renew leases")
        if len(renewed) == len(tasks):
            return [], []
    alive = alive_now()  # tells lost from busy
    lost = [t for t in tasks if (t.pk, t.version) not in alive]
    if renewed is None:
        return lost, []
    return lost, [
        t for t in tasks if (t.pk, t.version) in alive and (t.pk, t.version) not in renewed
    ]
