"""Abstract model mixins that make a model claimable. No concrete models live here.

The one-line path is :class:`ClaimableModel`. Tables that already own some of these
columns combine the finer mixins (at least :class:`ClaimFieldsMixin`, a status column and
:class:`ClaimableMixin`) and map their own status values in ``ClaimMeta.statuses``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import models
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from django_taskclaim.config.claim_meta import CLAIM_STATE_FIELDS
from django_taskclaim.config.options import get_options
from django_taskclaim.db import DbNow
from django_taskclaim.model.indexes import claim_indexes
from django_taskclaim.model.queryset import ClaimQuerySet
from django_taskclaim.row.status import Status
from django_taskclaim.settle import events, outcome, steps, transitions


class StatusFieldMixin(models.Model):
    """Adds ``status`` (:class:`~django_taskclaim.row.status.Status`, default ``ready``)."""

    status = models.CharField(
        _("status"),
        max_length=16,
        choices=Status.choices,
        default=Status.READY,
        db_default=Status.READY.value,
    )

    class Meta:
        abstract = True


class ClaimFieldsMixin(models.Model):
    """Adds the claim bookkeeping: ``version``, ``locked_until``, ``locked_by``, ``attempts``.

    ``version`` is the claim token: bumped by every claim and every state change, and
    every write a worker makes after its claim is conditioned on it.
    """

    version = models.PositiveBigIntegerField(
        _("claim token"), default=0, db_default=0, editable=False
    )
    locked_until = models.DateTimeField(_("lease until"), null=True, blank=True, editable=False)
    locked_by = models.CharField(
        _("held by"), max_length=255, blank=True, default="", db_default="", editable=False
    )
    attempts = models.PositiveIntegerField(_("attempts"), default=0, db_default=0, editable=False)

    class Meta:
        abstract = True


class ScheduleFieldsMixin(models.Model):
    """Adds ``run_after`` (not before; ``NULL`` = now) and ``priority`` (higher first)."""

    run_after = models.DateTimeField(_("run after"), null=True, blank=True)
    priority = models.SmallIntegerField(_("priority"), default=0, db_default=0)

    class Meta:
        abstract = True


class TimestampFieldsMixin(models.Model):
    """Adds ``created_at`` (database clock; the FIFO key), ``claimed_at`` (when the
    current or last attempt was claimed, by the database clock of the claim's own
    statement; cleared by the operator's requeue) and ``finished_at``."""

    created_at = models.DateTimeField(_("created at"), db_default=DbNow(), editable=False)
    claimed_at = models.DateTimeField(_("claimed at"), null=True, blank=True, editable=False)
    finished_at = models.DateTimeField(_("finished at"), null=True, blank=True, editable=False)

    class Meta:
        abstract = True


class ErrorFieldMixin(models.Model):
    """Adds ``last_error``: why the last attempt failed, was retried or reaped."""

    last_error = models.TextField(_("last error"), blank=True, default="", db_default="")

    class Meta:
        abstract = True


class ClaimableMixin(models.Model):
    """Behaviour of a claimed row: the fenced lifecycle methods. Adds no fields.

    Every method writes with a condition on the claim token (``version``) the row was
    claimed with; if the claim was lost meanwhile nothing is written and
    :class:`~django_taskclaim.exceptions.ClaimLost` is raised.
    """

    objects = ClaimQuerySet.as_manager()

    if TYPE_CHECKING:  # fields the claim mixins add (ClaimFieldsMixin); no field here
        version: int
        attempts: int
        locked_until: datetime | None

    class Meta:
        abstract = True

    # -- save() never clobbers the claim state ------------------------------------
    def save(self, *args: Any, **kwargs: Any) -> None:
        """Save the row; an existing row's claim bookkeeping is written only when named.

        A plain ``save()`` of an existing row writes every field but the claim state
        (status, token, lease, attempts, …), so editing a row's data while a worker
        holds it cannot un-claim or re-open it. Naming any of those fields in
        ``update_fields`` writes them and bumps the claim token (fencing any holder).
        """
        opts = get_options(self)
        if opts.has("run_after"):
            when = getattr(self, "run_after", None)
            if isinstance(when, datetime) and settings.USE_TZ and timezone.is_naive(when):
                raise ValueError(
                    f"run_after must be timezone-aware (USE_TZ is on), got naive {when!r}; "
                    "use django.utils.timezone.now() + timedelta(...)"
                )
        protected = CLAIM_STATE_FIELDS | {opts.status_field}
        if not self._state.adding and self.pk is not None and not kwargs.get("force_insert"):
            update_fields = kwargs.get("update_fields")
            if update_fields is None:
                kwargs["update_fields"] = [
                    f.name
                    for f in self._meta.concrete_fields
                    if not f.primary_key and f.name not in protected
                ]
            elif set(update_fields) & protected:
                fields = set(update_fields) | {"version"}
                vars(self)["version"] = models.F("version") + 1
                kwargs["update_fields"] = list(fields)
                super().save(*args, **kwargs)
                self.refresh_from_db(fields=["version"])
                return
        super().save(*args, **kwargs)

    # -- fenced lifecycle -------------------------------------------------------
    def complete(self, **fields: Any) -> None:
        """Mark the claimed task ``done``, saving ``fields`` in the same fenced UPDATE.

        ``fields`` are result fields: naming the primary key or the claim bookkeeping
        (status, token, lease, holder, attempts, ``claimed_at``, ``finished_at``,
        ``last_error``) raises
        ``ValueError`` before anything is written."""
        transitions.complete(self, **fields)

    def fail(self, error: BaseException | str = "", **fields: Any) -> None:
        """Mark the claimed task ``failed`` for good (the dead-letter state)."""
        transitions.fail(self, error, **fields)

    def retry(
        self, delay: float | timedelta | None = None, error: BaseException | str = "", **fields: Any
    ) -> str:
        """Give the task back to run again after ``delay`` (default: the model's backoff).

        Ends ``failed`` instead when ``max_attempts`` is exhausted. Returns the new
        logical state (``"ready"`` or ``"failed"``).
        """
        return transitions.retry(self, delay=delay, error=error, **fields)

    def release(self) -> None:
        """Give the task back untouched: ``ready`` now, and this attempt is not counted."""
        transitions.release(self)

    def step(self, name: str, fn: Callable[[], Any]) -> Any:
        """A durable step of this task's body: ``fn()``'s result, run once per row.

        If an earlier attempt of the row completed the step ``name``, its stored result
        is returned and ``fn`` is not called. Otherwise ``fn`` runs inside a fenced
        transaction with the storing of its result: its database writes and the step
        commit together, only while this worker still holds the claim
        (:class:`ClaimLost` otherwise, nothing committed). The result must be JSON; the
        value returned is always the stored one. Effects outside the database are at
        least once (docs/workflows.md, "Durable steps")."""
        return steps.run_step(self, name, fn)

    def wait_for_event(self, name: str, timeout: float | timedelta) -> Any:
        """The payload of the event ``name`` (``emit(name, payload)``), for this body.

        Emitted already (before or after this row first waited): its payload, at once.
        Otherwise the row is parked until the event or ``timeout`` after its first wait
        (database clock), and :class:`Parked` ends this attempt (not counted; the slot
        is freed; durable steps kept). The next run calls it again and gets the payload,
        or :class:`EventTimeout` once the deadline passed (the body may catch it).
        Needs ``run_after`` (docs/workflows.md, "Waiting for an event")."""
        return events.wait_for_event(self, name, timeout)

    def completed_steps(self) -> dict[str, Any]:
        """The durable steps this row completed so far: name → stored result."""
        return steps.completed_steps(self)

    def forget_steps(self) -> int:
        """Delete this row's stored steps, so that its next run starts over."""
        return steps.forget_steps(self)

    def extend_lease(self, seconds: float | timedelta | None = None) -> None:
        """Push the lease to ``now() + seconds`` (database clock; default: the model's lease)."""
        transitions.extend_lease(self, seconds)

    @contextmanager
    def fenced(self, *, using: str | None = None, complete: bool = False) -> Iterator[None]:
        """A transaction that commits only while this worker still holds the claim.

        On entry the row is re-checked and row-locked inside a new transaction; if the
        claim was lost, :class:`ClaimLost` is raised before the block runs. The reaper
        and other writers wait for the lock, so writes made in the block (to any table)
        commit only if the claim was still held. While the database is busy (SQLite's
        single write lock, a deadlock) taking the lock is retried, at most
        ``TASKCLAIM_DB_RETRIES`` times each waiting up to the database's lock timeout,
        then the error is raised saying so.

        ``complete=True`` makes the block exactly-once: leaving it normally also marks
        the task ``done`` in the same transaction (unless the block finished it itself),
        writing with it the fields of this object the block changed (``self.text =
        …``), so its writes and the completion commit together or not at all. A block
        that changed the primary key or a claim field gets ``ValueError`` and nothing
        commits. Without ``complete=True``, the writes commit at the end of the block and
        the completion comes later: a crash in between runs the task again and repeats
        them (at least once); fields set on this object are not saved by the block. If
        the block raises, nothing it wrote commits and the task object is as it was on
        entry.
        """
        with transitions.fenced(self, using=using, complete=complete):
            yield

    def cancel_requested(self, *, check: bool = False) -> bool:
        """Whether this claim has been taken back (cancelled, released by an operator,
        taken by another worker), so the running body should stop.

        In a worker the heartbeat sets it within one heartbeat interval of the change;
        asking costs nothing. ``check=True`` also asks the database (one ``SELECT``),
        e.g. outside a worker. Once ``True`` it stays ``True``. Stopping is cooperative:
        a body that goes on is not interrupted, but none of its fenced writes lands.
        """
        return outcome.cancel_requested(self, check=check)

    @property
    def claim_state(self) -> str | None:
        """The logical state of the row (``"ready"``, ``"processing"``, …)."""
        opts = get_options(self)
        return opts.state_of(getattr(self, opts.status_field))


class ClaimableModel(
    ClaimableMixin,
    StatusFieldMixin,
    ClaimFieldsMixin,
    ScheduleFieldsMixin,
    TimestampFieldsMixin,
    ErrorFieldMixin,
):
    """A model whose rows are tasks: inherit it and its rows can be claimed.

    Adds ``status``, ``version``, ``locked_until``, ``locked_by``, ``attempts``,
    ``run_after``, ``priority``, ``created_at``, ``claimed_at``, ``finished_at`` and
    ``last_error``;
    the manager ``objects`` (:class:`~django_taskclaim.model.queryset.ClaimQuerySet`); and
    partial indexes matching the claim query (``status = 'ready'`` ordered by
    ``-priority, created_at``) and the reaper query (``status = 'processing'`` by
    ``locked_until``). If your model declares its own ``Meta``, inherit
    ``ClaimableModel.Meta`` to keep the indexes.
    """

    class Meta:
        abstract = True
        indexes = claim_indexes("%(app_label).9s_%(class).12s")
