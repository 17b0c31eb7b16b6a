"""The fenced, batched actions of a claimable model's changelist, and their report."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db import models
from django.http import HttpRequest
from django.utils.translation import gettext_lazy as _

from django_taskclaim.admin.display import state_label
from django_taskclaim.config.options import ClaimOptions, get_options
from django_taskclaim.model.queryset import as_claim_queryset

__all__ = ["ClaimActionsMixin"]

logger = logging.getLogger("django_taskclaim.admin")


class ClaimActionsMixin:
    """The five claim actions of :class:`~django_taskclaim.admin.ClaimableAdminMixin`.

    Guarantees: every action requires the change permission, changes only the rows
    where it is legal with a state-conditioned UPDATE that bumps the claim token
    (fencing any worker holding the row), processes "select all" in batches of
    ``claim_action_batch_size`` primary keys without loading rows, and reports
    "N done, M skipped (why)".
    """

    #: Rows per UPDATE when an action runs (also on "select all" over huge tables).
    claim_action_batch_size: int = 1000
    claim_action_names = (
        "taskclaim_requeue",
        "taskclaim_retry_failed",
        "taskclaim_cancel",
        "taskclaim_release",
        "taskclaim_reap",
    )

    # These come from ModelAdmin at runtime.
    model: type[models.Model]

    @property
    def claim_options(self) -> ClaimOptions:
        """The resolved claim options of the administered model."""
        return get_options(self.model)

    def _run_claim_action(
        self,
        request: HttpRequest,
        queryset: models.QuerySet,
        *,
        title: str,
        legal: tuple[str, ...],
        rule: str,
        operation: Callable[[Any], int],
        legal_filter: Callable[[Any], Any] | None = None,
    ) -> None:
        if not self.has_change_permission(request):  # type: ignore[attr-defined]
            raise PermissionDenied
        qs = as_claim_queryset(queryset)
        opts = self.claim_options
        before = {s: n for s, n in qs.state_counts().items() if n}
        total = sum(before.values())
        legal_before = (
            legal_filter(qs).count()
            if legal_filter
            else sum(n for s, n in before.items() if s in legal)
        )
        done = operation(qs)
        reasons = [f"{n} {state_label(s)}" for s, n in sorted(before.items()) if s not in legal]
        if legal_filter:
            unexpired = sum(n for s, n in before.items() if s in legal) - legal_before
            if unexpired > 0:
                reasons.insert(0, str(_("%(n)s with a running lease") % {"n": unexpired}))
        if legal_before > done:
            reasons.append(
                str(_("%(n)s changed by someone else meanwhile") % {"n": legal_before - done})
            )
        skipped = total - done
        text = _("%(title)s: %(done)s done, %(skipped)s skipped") % {
            "title": title,
            "done": done,
            "skipped": skipped,
        }
        if skipped:
            text += f" ({', '.join(reasons)}: {rule})"
        text += "."
        logger.info(
            "admin action model=%s action=%s user=%s done=%s skipped=%s",
            opts.label,
            title,
            getattr(request.user, "pk", None),
            done,
            skipped,
        )
        self.message_user(  # type: ignore[attr-defined]
            request, text, messages.SUCCESS if done else messages.WARNING
        )

    @admin.action(
        description=_("Requeue selected tasks (failed, cancelled or done → ready)"),
        permissions=("change",),
    )
    def taskclaim_requeue(self, request: HttpRequest, queryset: models.QuerySet) -> None:
        """Put failed / cancelled / done rows back to ready, attempts reset."""
        batch = self.claim_action_batch_size
        self._run_claim_action(
            request,
            queryset,
            title=str(_("Requeue")),
            legal=("failed", "cancelled", "done"),
            rule=str(_("only failed, cancelled or done tasks can be requeued")),
            operation=lambda qs: qs.requeue(batch_size=batch),
        )

    @admin.action(
        description=_("Retry selected failed tasks"),
        permissions=("change",),
    )
    def taskclaim_retry_failed(self, request: HttpRequest, queryset: models.QuerySet) -> None:
        """Put failed rows back to ready with a fresh retry budget."""
        batch = self.claim_action_batch_size
        self._run_claim_action(
            request,
            queryset,
            title=str(_("Retry failed")),
            legal=("failed",),
            rule=str(_("only failed tasks are retried")),
            operation=lambda qs: qs.failed().requeue(batch_size=batch),
        )

    @admin.action(
        description=_("Cancel selected tasks (ready or processing)"),
        permissions=("change",),
    )
    def taskclaim_cancel(self, request: HttpRequest, queryset: models.QuerySet) -> None:
        """Cancel ready and processing rows; a worker holding one loses its claim."""
        batch = self.claim_action_batch_size
        if self.claim_options.statuses.get("cancelled") is None:
            self.message_user(  # type: ignore[attr-defined]
                request,
                _("%(model)s has no cancelled status; nothing was changed.")
                % {"model": self.claim_options.label},
                messages.ERROR,
            )
            return
        self._run_claim_action(
            request,
            queryset,
            title=str(_("Cancel")),
            legal=("ready", "processing"),
            rule=str(_("only ready or processing tasks can be cancelled")),
            operation=lambda qs: qs.cancel(batch_size=batch),
        )

    @admin.action(
        description=_("Release the lease of selected tasks (processing → ready)"),
        permissions=("change",),
    )
    def taskclaim_release(self, request: HttpRequest, queryset: models.QuerySet) -> None:
        """Take processing rows back from their holders (who are fenced); ready now."""
        batch = self.claim_action_batch_size
        self._run_claim_action(
            request,
            queryset,
            title=str(_("Release lease")),
            legal=("processing",),
            rule=str(_("only processing tasks hold a lease")),
            operation=lambda qs: qs.release(batch_size=batch),
        )

    @admin.action(
        description=_("Reap selected tasks whose lease expired"),
        permissions=("change",),
    )
    def taskclaim_reap(self, request: HttpRequest, queryset: models.QuerySet) -> None:
        """Recover selected processing rows whose lease ran out (ready, or failed if spent)."""
        batch = self.claim_action_batch_size
        self._run_claim_action(
            request,
            queryset,
            title=str(_("Reap now")),
            legal=("processing",),
            rule=str(_("only processing tasks with an expired lease are reaped")),
            operation=lambda qs: qs.reap(batch_size=batch).total,
            legal_filter=lambda qs: qs.expired(),
        )
