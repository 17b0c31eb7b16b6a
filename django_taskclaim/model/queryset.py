"""``ClaimQuerySetMixin``: claims, filters and fenced bulk operations on claimable rows.

Filters are adjectives (``claimable()``, ``expired()``), mutations are verbs
(``claim()``, ``requeue()``, ``reap()``). Every method composes with the caller's own
filters: ``Document.objects.filter(kind="invoice").claim(10)``. Each method is a thin
call into the layer that owns its rule: ``claim/`` claims, ``settle/`` writes (``leases``
the renewals, ``bulk`` the operator's transitions, ``batch`` the batched completions),
``recovery/`` reaps.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Self

from asgiref.sync import sync_to_async
from django.db import models
from django.db.models import Count, Q

from django_taskclaim.claim import claim_rows
from django_taskclaim.config.options import ClaimOptions, get_options
from django_taskclaim.db import DbNow
from django_taskclaim.exceptions import DependencyError
from django_taskclaim.model.enqueue import create_after, enqueue_rows
from django_taskclaim.model.unique_insert import insert_unique
from django_taskclaim.recovery.reap import ReapResult, reap_queryset
from django_taskclaim.row.status import UNKNOWN_STATE
from django_taskclaim.rules import lease_expired_q
from django_taskclaim.settle import batch, bulk, leases

logger = logging.getLogger("django_taskclaim.claim")


def as_claim_queryset(queryset: models.QuerySet) -> Any:
    """``queryset`` itself when it has the claim methods, else the same query (same
    filters, annotations and database) as a :class:`ClaimQuerySet`. For querysets from a
    plain manager or ``_base_manager`` of a claimable model."""
    if isinstance(queryset, ClaimQuerySetMixin):
        return queryset
    return ClaimQuerySet(model=queryset.model, query=queryset.query.chain(), using=queryset.db)


if TYPE_CHECKING:
    _QuerySetBase = models.QuerySet[Any]
else:
    _QuerySetBase = object


class ClaimQuerySetMixin(_QuerySetBase):
    """Mix into your own ``QuerySet`` to make its model's rows claimable."""

    # -- helpers ------------------------------------------------------------------
    @property
    def claim_options(self) -> ClaimOptions:
        """The model's resolved claim options (raises ``NotClaimableError`` if none)."""
        return get_options(self.model)

    def _qs(self) -> models.QuerySet:
        return self

    # -- filters --------------------------------------------------------------------
    def in_state(self, *states: str) -> Self:
        """Rows whose status is one of the logical ``states`` (``"ready"``, ``"done"``…)."""
        return self._qs().filter(self.claim_options.status_q(*states))  # type: ignore[return-value]

    def claimable(self) -> Self:
        """Rows that can be claimed now: ``ready`` and ``run_after`` passed (database clock)."""
        opts = self.claim_options
        qs = self._qs().filter(opts.status_q("ready"))
        if opts.has("run_after"):
            qs = qs.filter(Q(run_after__isnull=True) | Q(run_after__lte=DbNow()))
        return qs  # type: ignore[return-value]

    def ready(self) -> Self:
        """Rows in the ``ready`` state, including those deferred by ``run_after``."""
        return self.in_state("ready")

    def processing(self) -> Self:
        """Rows currently held under a lease (or whose lease expired but were not reaped)."""
        return self.in_state("processing")

    def expired(self) -> Self:
        """``processing`` rows whose lease ended before the database's ``now()``: the
        rows a reap takes back (:func:`lease_expired_q`)."""
        return self._qs().filter(lease_expired_q(self.claim_options))  # type: ignore[return-value]

    def done(self) -> Self:
        return self.in_state("done")

    def failed(self) -> Self:
        return self.in_state("failed")

    def cancelled(self) -> Self:
        return self.in_state("cancelled")

    # -- claiming ---------------------------------------------------------------------
    def claim(
        self,
        n: int = 1,
        *,
        lease: float | timedelta | None = None,
        worker: str | None = None,
        strategy: str | None = None,
    ) -> list[Any]:
        """Claim up to ``n`` claimable rows of this queryset for ``lease`` seconds.

        Guarantees: no row is handed to two claimers at once (on every strategy and
        database); each returned row is ``processing`` with its token (``version``)
        and ``attempts`` bumped and ``locked_until = now() + lease`` on the database
        clock; rows come oldest first within priority. Fewer than ``n`` (or none) may
        come back when rows are scarce or held by others (with ``serializable``, also
        when every retry lost the race to other claimers). Refused inside the caller's
        own ``atomic()`` block (except with ``strategy="hold"``, which requires one).
        """
        return claim_rows(self, n, lease=lease, worker=worker, strategy=strategy)

    def claim_next(self, **kwargs: Any) -> Any | None:
        """Claim the oldest claimable row, or return ``None``. Same guarantees as ``claim``."""
        rows = self.claim(1, **kwargs)
        return rows[0] if rows else None

    async def aclaim(self, n: int = 1, **kwargs: Any) -> list[Any]:
        """Async twin of :meth:`claim` (runs it in a thread)."""
        return await sync_to_async(self.claim)(n, **kwargs)

    async def aclaim_next(self, **kwargs: Any) -> Any | None:
        """Async twin of :meth:`claim_next`."""
        return await sync_to_async(self.claim_next)(**kwargs)

    # -- bulk enqueue -----------------------------------------------------------------
    def create(self, **kwargs: Any) -> Any:
        """Django's ``create()``; with ``after=[rows…]`` (and ``on_failure=``) the new row
        waits for those rows: see :func:`django_taskclaim.model.enqueue.create_after`
        and docs/workflows.md. A model with a field of either name keeps Django's
        meaning (use ``enqueue_many([...], after=…)`` there)."""
        names = {f.name for f in self.model._meta.concrete_fields}
        after = None if "after" in names else kwargs.pop("after", None)
        on_failure = None if "on_failure" in names else kwargs.pop("on_failure", None)
        if after is None:
            if on_failure is not None:
                raise DependencyError(f"{self.model._meta.label}: on_failure= needs after=")
            return super().create(**kwargs)
        self._for_write = True
        return create_after(self._qs(), kwargs, after, on_failure or "cancel")

    def enqueue_many(
        self,
        rows: Iterable[Any],
        *,
        batch_size: int | None = None,
        after: Any = None,
        on_failure: str = "cancel",
    ) -> list[Any]:
        """Enqueue many rows (unsaved instances or dicts of field values) in one INSERT
        per ``batch_size`` rows on this queryset's database; return the instances.

        Every row is written ``ready`` with the claim state ``create()`` leaves; the
        rows commit together and the workers are woken once, after the commit. No
        ``pre_save`` / ``post_save`` is sent. Bad input raises a one-line error before
        anything is written. See :func:`django_taskclaim.model.enqueue.enqueue_many`.
        """
        self._for_write = True
        return enqueue_rows(
            self._qs(), rows, batch_size=batch_size, after=after, on_failure=on_failure
        )

    async def aenqueue_many(
        self,
        rows: Iterable[Any],
        *,
        batch_size: int | None = None,
        after: Any = None,
        on_failure: str = "cancel",
    ) -> list[Any]:
        """Async twin of :meth:`enqueue_many` (runs it in a thread)."""
        return await sync_to_async(self.enqueue_many)(
            list(rows), batch_size=batch_size, after=after, on_failure=on_failure
        )

    # -- unique enqueue ---------------------------------------------------------------
    def enqueue_unique(self, *, key_field: str | None = None, **fields: Any) -> tuple[Any, bool]:
        """Create a row from ``fields`` unless an active (``ready`` / ``processing``) row
        has the same key; return ``(row, created)``, the existing row when not created.

        The model needs an :class:`~django_taskclaim.model.unique.ActiveKeyField` on the key
        field and a unique constraint on it; ``key_field`` names the key when the model
        has several. The database's unique constraint decides, so concurrent callers
        never create two active rows with one key; other integrity errors are raised.
        Works inside and outside ``transaction.atomic()``. See
        :func:`django_taskclaim.model.unique_insert.insert_unique` and ``docs/unique.md``.
        """
        model = self.model
        self._for_write = True
        using = self.db
        return insert_unique(lambda: model(**fields), using=using, key_field=key_field)

    async def aenqueue_unique(
        self, *, key_field: str | None = None, **fields: Any
    ) -> tuple[Any, bool]:
        """Async twin of :meth:`enqueue_unique` (runs it in a thread)."""
        return await sync_to_async(self.enqueue_unique)(key_field=key_field, **fields)

    # -- heartbeats -------------------------------------------------------------------
    def extend_leases(
        self, tasks: Sequence[Any], seconds: float | timedelta | None = None
    ) -> list[Any]:
        """Extend the leases of the claimed ``tasks`` in one statement; return those lost.

        A task is lost when its token no longer matches (reaped, re-claimed, changed).
        Lost tasks are not touched. Does not bump the token.
        """
        return leases.extend_leases(self.model, self.db, tasks, seconds)

    def renew_leases(
        self, tasks: Sequence[Any], seconds: float | timedelta | None = None
    ) -> tuple[list[Any], list[Any]]:
        """Extend the leases of the claimed ``tasks`` without waiting for any row lock;
        return ``(lost, busy)``.

        Like :meth:`extend_leases` (fenced on each task's token, token unchanged), but a
        row that another session holds locked (a web request's ``select_for_update()``,
        an outcome write waiting on one) is skipped instead of waited for: it is
        ``busy``, its claim still current, its lease not extended this time. ``lost``
        are the tasks whose claim was taken back. The worker's heartbeat uses this, so
        one locked row never delays the renewal of the others. On databases with
        ``SKIP LOCKED`` (PostgreSQL, MariaDB ≥ 10.6, MySQL 8) the locked rows are
        picked in one transaction (``SELECT … FOR UPDATE SKIP LOCKED``, then the
        ``UPDATE``); elsewhere (SQLite, which locks the whole file) one ``UPDATE``.
        """
        return leases.renew_leases(self.model, self.db, tasks, seconds)

    # -- batched acknowledgements -----------------------------------------------------
    def complete_many(self, tasks: Iterable[Any]) -> list[Any]:
        """Mark many claimed ``tasks`` ``done`` in one fenced UPDATE; return those lost.

        Same guarantee as ``task.complete()`` for each task (a row is written only
        while it still carries the claimed token), in one round trip per 500 tasks.
        Result fields are not supported here: complete such tasks one by one.
        """
        tasks = list(tasks)
        for t in tasks:
            if not isinstance(t, self.model):
                raise TypeError(f"complete_many() got {t!r}, not a {self.model._meta.label}")
        return batch.complete_many(tasks)

    # -- bulk operations (fenced by the state condition, token bumped) ---------------
    def requeue(self, *, reset_attempts: bool = True, batch_size: int | None = None) -> int:
        """Put ``failed``/``cancelled``/``done`` rows back to ``ready`` now; return how many.

        ``processing`` rows are left alone (use :meth:`release`). With
        ``reset_attempts`` the retry budget starts over.
        """
        return bulk.requeue(self._qs(), reset_attempts=reset_attempts, batch_size=batch_size)

    def release(self, *, batch_size: int | None = None) -> int:
        """Take ``processing`` rows back from their holders (who are fenced); ``ready`` now.

        An operator's tool, whatever the leases: a holder that is still running its task
        body keeps running it while another worker may start the row again. Released
        rows are marked recovered (``locked_until`` kept), so workers run each alone, and
        ``last_error`` names the worker they were taken from.
        """
        return bulk.release(self._qs(), batch_size=batch_size)

    def cancel(self, *, batch_size: int | None = None) -> int:
        """Cancel ``ready`` and ``processing`` rows; holders are fenced. Needs a cancelled state."""
        return bulk.cancel(self._qs(), batch_size=batch_size)

    def reap(self, **kwargs: Any) -> ReapResult:
        """Recover this queryset's expired leases (:func:`~django_taskclaim.recovery.reap.reap`)."""
        return reap_queryset(self._qs(), **kwargs)

    def state_counts(self) -> dict[str, int]:
        """Rows of this queryset per logical state, in one ``GROUP BY`` query.

        Every state the model maps is present (0 when no row has it); rows whose stored
        status maps to no state are counted under :data:`UNKNOWN_STATE`, present only
        when there are some. The values add up to the number of rows. The one count per
        state behind ``stats()``, the dashboard, ``taskclaim_stats`` and the admin.
        """
        opts = self.claim_options
        counts = {state: 0 for state, v in opts.statuses.items() if v is not None}
        for row in self._qs().order_by().values(opts.status_field).annotate(n=Count("*")):
            state = opts.state_of(row[opts.status_field]) or UNKNOWN_STATE
            counts[state] = counts.get(state, 0) + row["n"]
        return counts

    def stats(self) -> dict[str, int]:
        """:meth:`state_counts` plus ``expired`` (processing with a lapsed lease)."""
        return {**self.state_counts(), "expired": self.expired().count()}


class ClaimQuerySet(ClaimQuerySetMixin, models.QuerySet):
    """A ``QuerySet`` with claims; attach with ``objects = ClaimQuerySet.as_manager()``."""


ClaimManager = models.Manager.from_queryset(ClaimQuerySet)
