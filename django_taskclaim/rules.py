"""The shared predicates: one definition of each rule the claim, the recovery, the
figures, the admin and the worker registry apply.

- a lease has expired / is running (database clock): :func:`lease_expired_q`,
  :func:`lease_running_q`, and :func:`lease_ended` for a value already read;
- a write that finds its row by primary key re-checks its status: :func:`status_recheck`;
- the fence, what makes a write of a claimed row fenced (token matches, still
  ``processing``): :func:`held_q`, :func:`held_many_q` for a large batch;
- a registered worker is live / silent: :func:`live_worker_q`, :func:`silent_worker_q`,
  :func:`heard_from_recently` (display only: silence is not death).

Below everything that uses them (``claim/``, ``settle/``, ``recovery/``, ``ops/``,
``admin/``, ``worker/``); above ``config/`` and ``db``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, cast

from django.db import connections, models
from django.db.models import F, Q
from django.db.models.expressions import CombinedExpression, RawSQL
from django.db.models.functions import Coalesce, Greatest

from django_taskclaim.backends import for_connection
from django_taskclaim.config.settings import taskclaim_settings
from django_taskclaim.db import DbNow
from django_taskclaim.exceptions import ConfigurationError

if TYPE_CHECKING:
    from django_taskclaim.config.options import ClaimOptions

__all__ = [
    "HELD_STATE",
    "heard_from_recently",
    "held_many_q",
    "held_q",
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


# -- the fence ---------------------------------------------------------------------------

#: The state a claimed row is held in: a fenced write lands only on a row still in it.
HELD_STATE = "processing"


def _held_status(opts: ClaimOptions, using: str | None) -> Q:
    if using is None:
        return opts.status_q(HELD_STATE)
    return status_recheck(opts, HELD_STATE, using)


def held_q(opts: ClaimOptions, tokens: Iterable[tuple[Any, int]], using: str | None = None) -> Q:
    """The fence: the rows still held under the claim tokens given (``(pk, version)``
    pairs), that is, with that primary key and token and still :data:`HELD_STATE`.

    Every write of a claimed row (the transitions, the fenced block's lock, the lease
    renewals, the give-backs) updates exactly these rows, so a lost claim writes nothing.
    ``using``: the database of a write, whose status condition is then
    :func:`status_recheck`; ``None`` for a read (the plain status condition). No tokens:
    no row. A large batch uses :func:`held_many_q`; the statement text of the vendors'
    own batched completion is :meth:`~django_taskclaim.backends.base.DatabaseSQL.held_sql`."""
    match = Q()
    for pk, token in tokens:
        match |= Q(pk=pk, version=token)
    if not match:
        return Q(pk__in=[])
    return match & _held_status(opts, using)


def held_many_q(opts: ClaimOptions, tokens: Mapping[Any, int], using: str) -> Q:
    """:func:`held_q` for a write of many rows (``tokens``: pk → claimed token): the
    primary keys (an index lookup), then ``(pk, version) IN ((%s, %s), …)``, a row-value
    comparison (standard SQL, supported by PostgreSQL, MySQL/MariaDB and SQLite) that the
    ORM has no public way to say and that compiles once per batch instead of many
    ``OR``-ed conditions, then the status re-check.

    The parameters bypass the ORM's lookups, so each is converted here exactly as a
    lookup would: ``get_db_prep_value`` of its field (a UUID primary key is a 32-digit
    hex string on databases without a native UUID type, for instance)."""
    model = opts.model
    connection = connections[using]
    qn = connection.ops.quote_name
    table = qn(model._meta.db_table)
    pk_field = model._meta.pk
    version_field = model._meta.get_field("version")
    pk_column = getattr(pk_field, "column", None)
    version_column = getattr(version_field, "column", None)
    if (
        not isinstance(pk_field, models.Field)
        or not isinstance(version_field, models.Field)
        or not pk_column
        or not version_column
    ):
        raise ConfigurationError(f"{model._meta.label} needs concrete pk and version columns")
    pairs = [
        (
            pk_field.get_db_prep_value(key, connection),
            version_field.get_db_prep_value(token, connection),
        )
        for key, token in tokens.items()
    ]
    sql, params = for_connection(connection).tokens_match(
        ".".join((table, qn(pk_column))), ".".join((table, qn(version_column))), pairs
    )
    match = RawSQL(sql, params, output_field=models.BooleanField())
    return Q(pk__in=list(tokens)) & Q(match) & _held_status(opts, using)


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
