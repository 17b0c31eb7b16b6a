"""Task deadlines: how long one attempt's body may run, and what the attempt becomes
when it runs past that.

A model's deadline is ``ClaimMeta.timeout`` (else ``TASKCLAIM_TIMEOUT``; ``None``, the
default: no deadline). A model that declares a nullable field named ``task_timeout``
(seconds as a number, or a ``DurationField``) lets each row set its own; a row that
leaves it ``NULL`` gets the model's. The deadline counts from the start of the body, on
the clock of the machine that runs it (a duration, not a point in time).

What the worker does with it (:mod:`django_taskclaim.worker.deadlines`): at the deadline
the body's cancellation flag is set (an async body gets ``CancelledError``) and the
instance is marked overdue (:func:`mark_overdue`); whatever the body then returns or
raises, the attempt is the failure :func:`deadline_error`, retried by the usual rules
(``max_attempts``, backoff), fenced like every outcome. A ``ClaimMeta.atomic`` body that
returns past its deadline is rolled back with it (:mod:`.outcome`). A body that ignores
the flag for :func:`grace` more seconds is handled by the worker (see
``docs/deadlines.md``).
"""

from __future__ import annotations

import logging
from decimal import Decimal
from typing import Any

from django_taskclaim.config import bounds
from django_taskclaim.config.options import get_options
from django_taskclaim.config.settings import taskclaim_settings
from django_taskclaim.exceptions import ConfigurationError
from django_taskclaim.row.claimable import Claimable

logger = logging.getLogger("django_taskclaim.settle.deadline")

#: The optional field through which a row sets its own deadline.
TIMEOUT_FIELD = "task_timeout"
#: The attribute of an instance whose body ran past its deadline: that deadline (seconds).
OVERDUE_ATTR = "_taskclaim_overdue"


def timeout_of(task: Claimable) -> float | None:
    """Seconds the body of ``task`` may run, or ``None`` (no deadline): the row's own
    ``task_timeout`` where the model has that field and the row sets it, else the
    model's ``ClaimMeta.timeout`` / ``TASKCLAIM_TIMEOUT``. A row value out of
    :data:`~django_taskclaim.config.bounds.TIMEOUT` is logged and the model's used: one
    bad row never stops a worker."""
    opts = get_options(task)
    if opts.has(TIMEOUT_FIELD):
        value: Any = getattr(task, TIMEOUT_FIELD, None)
        if value is not None:
            if isinstance(value, Decimal):
                value = float(value)
            try:
                return float(
                    bounds.number(
                        value, f"{opts.label} pk={task.pk} {TIMEOUT_FIELD}", bounds.TIMEOUT,
                        seconds=True,
                    )
                )  # fmt: skip
            except ConfigurationError as exc:
                logger.warning("%s: the model's timeout applies", exc)
    return opts.timeout


def grace(lease: float) -> float:
    """Seconds a body past its deadline has to stop before a ``--processes`` supervisor
    replaces its process: ``TASKCLAIM_TIMEOUT_GRACE``, or ``lease`` (the model's lease)
    when it is ``None``. Within :data:`~django_taskclaim.config.bounds.TIMEOUT_GRACE`."""
    value = taskclaim_settings.TIMEOUT_GRACE
    if value is None:
        return float(lease)
    return float(bounds.number(value, "TASKCLAIM_TIMEOUT_GRACE", bounds.TIMEOUT_GRACE))


def uses_deadlines(model: Any) -> bool:
    """Whether a row of ``model`` can have a deadline (a timeout, or a ``task_timeout``
    field): the worker and its supervisor watch nothing for a model that cannot."""
    opts = get_options(model)
    return opts.timeout is not None or opts.has(TIMEOUT_FIELD)


def deadline_error(timeout: float) -> TimeoutError:
    """The failure of an attempt whose body ran past its ``timeout``, as stored in
    ``last_error``: ``TimeoutError: ran past its 30s deadline``."""
    return TimeoutError(f"ran past its {timeout:g}s deadline")


def mark_overdue(task: Claimable, timeout: float) -> None:
    """Record on the instance that its body ran past ``timeout`` (set by the worker at the
    deadline, before the cancellation flag)."""
    task.__dict__[OVERDUE_ATTR] = timeout


def overdue(task: Claimable) -> float | None:
    """The deadline the body of ``task`` ran past, or ``None`` if it did not."""
    value = task.__dict__.get(OVERDUE_ATTR)
    return None if value is None else float(value)
