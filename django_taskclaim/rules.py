"""The shared predicates: one definition of each rule the claim, the recovery, the
figures, the admin and the worker registry apply.

- a lease has expired / is running (database clock): :func:`lease_expired_q`,
  :func:`lease_running_q`, and :func:`lease_ended` for a value already read;
- a write that finds its row by primary key re-checks its status: :func:`status_recheck`;
- a registered worker is live / silent: :func:`live_worker_q`, :func:`silent_worker_q`,
  :func:`heard_from_recently` (display only: silence is not death).

Below everything that uses them (``claim/``, ``settle/``, ``recovery/``, ``ops/``,
``admin/``, ``worker/``); above ``config/`` and ``db``.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING, cast

from django.db import connections, models
from django.db.models import F, Q
from django.db.models.expressions import CombinedExpression, RawSQL
from django.db.models.functions import Coalesce, Greatest

from django_taskclaim.backends import for_connection
from django_taskclaim.config.settings import taskclaim_settings
from django_taskclaim.db import DbNow

if TYPE_CHECKING:
    from django_taskclaim.config.options import ClaimOptions

__all__ = [
    "heard_from_recently",
    "lease_ended",
    "lease_expired_q",
    "lease_running_q",
    "live_worker_q",
    "ready_since",
    "silence_cutoff",
    "silent_after",
    "silent_worker_q",
    "status_recheck",
]


# -- leases --------------------------------------------------------------------------


def lease_expired_q(opts: ClaimOptions) -> Q:
    """The "lease expired" rule: ``processing`` rows whose ``locked_until`` is before the
    database's ``now()`` (never the caller's clock).

    Exactly the rows :func:`~django_taskclaim.recovery.reap.reap` takes back; also the
    ``expired()`` filter, the ``expired`` figures and the admin's lease filter and
    "reap now" action. Usable on any queryset of the model and inside UPDATEs.
    """
    return opts.status_q("processing") & Q(locked_until__lt=DbNow())


def lease_running_q(opts: ClaimOptions) -> Q:
    """``processing`` rows whose lease has not expired by :func:`lease_expired_q`:
    ``locked_until`` at or after the database's ``now()``."""
    return opts.status_q("processing") & Q(locked_until__gte=DbNow())


def lease_ended(locked_until: datetime, now: datetime) -> bool:
    """:func:`lease_expired_q` for a value already read: whether a lease ending at
    ``locked_until`` has expired at ``now``, which must be the database's clock (for
    example the admin's per-row annotation of it)."""
    return locked_until < now


# -- waiting ----------------------------------------------------------------------------


def ready_since(opts: ClaimOptions) -> F | Greatest:
    """When a ``ready`` row became ready: the later of its ``created_at`` and its
    ``run_after`` (the time a retry, a requeue or the enqueuer set it to run from), so
    that a row retried after days waits from its retry, not from its creation. Needs
    ``created_at``. The "oldest ready" figures (the admin, ``taskclaim_stats``, the
    doctor's ``TC-D020`` and ``taskclaim_oldest_ready_age_seconds``) age from it."""
    if not opts.has("run_after"):
        return F("created_at")
    return Greatest(F("created_at"), Coalesce(F("run_after"), F("created_at")))


# -- status re-check ------------------------------------------------------------------


def status_recheck(opts: ClaimOptions, state: str, using: str) -> Q:
    """``status = <state>`` for a write that finds its row by primary key, written so
    that no planner takes it for a reason to scan a partial index (see
    :meth:`~django_taskclaim.backends.base.DatabaseSQL.opaque_param_sql`)."""
    field = cast(models.Field, opts.model._meta.get_field(opts.status_field))
    conn = connections[using]
    sql = for_connection(conn).opaque_param_sql(str(field.cast_db_type(conn)))
    return Q(**{opts.status_field: RawSQL(sql, [opts.value(state)], output_field=field)})


# -- live and silent workers --------------------------------------------------------


def silent_after() -> float:
    """Seconds of registry silence after which a worker is *shown* as silent
    (``TASKCLAIM_WORKER_SILENT_AFTER``). Display only: silence is not death, and no row
    is taken from a silent worker before its lease ends."""
    return float(taskclaim_settings.WORKER_SILENT_AFTER)


def silence_cutoff() -> CombinedExpression:
    """The database's ``now()`` minus :func:`silent_after`: a registered worker whose
    last heartbeat (``last_seen``) is before it is silent, at or after it live."""
    return DbNow() - timedelta(seconds=silent_after())


def live_worker_q() -> Q:
    """Registered workers that are not stopped and were heard from at or after
    :func:`silence_cutoff` (database clock): the dashboard's and ``taskclaim_stats``'
    live workers, the admin's "live" filter and badge."""
    return Q(stopped_at__isnull=True, last_seen__gte=silence_cutoff())


def silent_worker_q() -> Q:
    """Registered workers that are not stopped and were last heard from before
    :func:`silence_cutoff`: the complement of :func:`live_worker_q` among the workers
    not stopped. Shown to operators, never taken as proof of death."""
    return Q(stopped_at__isnull=True, last_seen__lt=silence_cutoff())


def heard_from_recently(last_seen: datetime, now: datetime) -> bool:
    """:func:`live_worker_q`'s heartbeat test for a value already read: whether
    ``last_seen`` is at or after :func:`silence_cutoff` when the database's clock reads
    ``now``."""
    return last_seen >= now - timedelta(seconds=silent_after())
