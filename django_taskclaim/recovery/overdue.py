"""Recovery after a ``--processes`` supervisor replaced a child whose task body ran past
its deadline and its grace (:mod:`django_taskclaim.worker.supervisor`).

The child is *proven* dead (the supervisor killed it and ``waitpid`` saw it go), so its
rows may be taken back at once (NO EARLY RE-RUN). Unlike a child that died on its own
(:func:`~django_taskclaim.recovery.reap.release_worker`), the culprit is known:

- the overdue row's attempt is a failure with ``TimeoutError`` (:func:`fail_overdue`),
  retried by the usual rules (``max_attempts``, backoff) — the attempt counts;
- every other row that child held (waiting to start, running beside it, or run with its
  completion not yet written) goes back ``ready`` at once, its attempt not counted and
  not marked recovered (:func:`give_back_held`): it did nothing wrong.

Every write is fenced on the token (and holder): a row settled or re-claimed meanwhile is
left alone.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from django.db import models

from django_taskclaim.config.options import get_options
from django_taskclaim.exceptions import ClaimLost
from django_taskclaim.rules import held_q
from django_taskclaim.settle.deadline import deadline_error
from django_taskclaim.settle.transitions import Outcome, release, retry

logger = logging.getLogger("django_taskclaim.recovery.overdue")


def fail_overdue(
    model: type[models.Model], pk: Any, version: int, *, using: str, timeout: float
) -> Outcome | None:
    """The attempt of row ``pk`` of ``model`` claimed under token ``version`` ran past its
    ``timeout``: record it as a failure with ``TimeoutError`` (``ready`` after the
    backoff, or ``failed`` once ``max_attempts`` claims were made). Fenced on the token
    and ``processing``: returns the outcome, or ``None`` when that claim is no longer
    current (the row was settled or taken back meanwhile) and nothing was written."""
    opts = get_options(model)
    row: Any = model._base_manager.using(using).filter(held_q(opts, [(pk, version)])).first()
    if row is None:
        return None
    try:
        return retry(row, error=deadline_error(timeout))
    except ClaimLost:
        return None


def give_back_held(
    worker_id: str, models_: Iterable[type[models.Model]], *, using: str, keep: Iterable[Any] = ()
) -> int:
    """Give back, at once, every row of ``models_`` that ``worker_id`` (a process proven
    dead) still holds, except the ``(model, pk)`` pairs in ``keep``: ``ready``, attempt
    not counted, token bumped (each write fenced on the token it read). Models without a
    ``locked_by`` field are skipped (their rows wait for their lease). Returns how many."""
    skip = {(m._meta.label, str(pk)) for m, pk in keep}
    done = 0
    for model in models_:
        opts = get_options(model)
        if not opts.has("locked_by"):
            continue
        held = (
            model._base_manager.using(using)
            .filter(opts.status_q("processing"))
            .filter(locked_by=worker_id)
        )
        rows: list[Any] = list(held)
        for row in rows:
            if (model._meta.label, str(row.pk)) in skip:
                continue
            try:
                release(row)
                done += 1
            except ClaimLost:
                pass
    return done
