"""The fenced operations of a claimable model's admin: the changelist actions (batched,
over a selection) and the buttons of a task's change page (one row, fenced on the token
the page showed) run the same :data:`CLAIM_ACTIONS`, and both write a ``LogEntry``."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db import models
from django.http import HttpRequest
from django.utils.functional import Promise
from django.utils.translation import gettext_lazy as _

from django_taskclaim.admin.audit import log_model_action
from django_taskclaim.admin.display import state_label
from django_taskclaim.config.options import ClaimOptions, get_options
from django_taskclaim.model.queryset import as_claim_queryset

__all__ = ["CLAIM_ACTIONS", "ClaimAction", "ClaimActionsMixin"]

logger = logging.getLogger("django_taskclaim.admin")


@dataclass(frozen=True)
class ClaimAction:
    """One fenced operation an operator runs from the admin.

    ``run(queryset, batch_size)`` changes the rows of ``queryset`` where the operation
    is legal with a state-conditioned UPDATE that bumps the claim token (``batch_size``
    ``None``: one UPDATE whose WHERE keeps every filter of ``queryset``, such as the
    token a change page showed) and returns how many rows it changed.
    """

    title: Promise
    legal: tuple[str, ...]
    rule: Promise
    run: Callable[[Any, int | None], int]
    #: Narrows ``legal`` further (reap: only expired leases), for the report.
    legal_filter: Callable[[Any], Any] | None = None
    #: A state the model must map for the action to exist (cancel: ``cancelled``).
    needs: str | None = None

    def available(self, opts: ClaimOptions) -> bool:
        """Whether the model maps the states this action needs."""
        return self.needs is None or opts.statuses.get(self.needs) is not None


#: The operations, by name; the changelist actions and the change-page buttons both run
#: these (one home for each rule).
CLAIM_ACTIONS: dict[str, ClaimAction] = {
    "requeue": ClaimAction(
        title=_("Requeue"),
        legal=("failed", "cancelled", "done"),
        rule=_("only failed, cancelled or done tasks can be requeued"),
        run=lambda qs, batch: qs.requeue(batch_size=batch),
    ),
    "retry_failed": ClaimAction(
        title=_("Retry failed"),
        legal=("failed",),
        rule=_("only failed tasks are retried"),
        run=lambda qs, batch: qs.failed().requeue(batch_size=batch),
    ),
    "cancel": ClaimAction(
        title=_("Cancel"),
        legal=("ready", "processing"),
        rule=_("only ready or processing tasks can be cancelled"),
        run=lambda qs, batch: qs.cancel(batch_size=batch),
        needs="cancelled",
    ),
    "release": ClaimAction(
        title=_("Release lease"),
        legal=("processing",),
        rule=_("only processing tasks hold a lease"),
        run=lambda qs, batch: qs.release(batch_size=batch),
    ),
    "reap": ClaimAction(
        title=_("Reap now"),
        legal=("processing",),
        rule=_("only processing tasks with an expired lease are reaped"),
        run=lambda qs, batch: qs.reap(batch_size=batch).total,
        legal_filter=lambda qs: qs.expired(),
    ),
}


class ClaimActionsMixin:
    """The five claim actions of :class:`~django_taskclaim.admin.ClaimableAdminMixin`.

    Guarantees: every action requires the change permission, changes only the rows
    where it is legal with a state-conditioned UPDATE that bumps the claim token
    (fencing any worker holding the row), processes "select all" in batches of
    ``claim_action_batch_size`` primary keys without loading rows, reports
    "N done, M skipped (why)" and, when it changed rows, writes one ``LogEntry`` (who,
    when, what) for the model.
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
        self, request: HttpRequest, queryset: models.QuerySet, action: ClaimAction
    ) -> None:
        if not self.has_change_permission(request):  # type: ignore[attr-defined]
            raise PermissionDenied
        qs = as_claim_queryset(queryset)
        opts = self.claim_options
        legal, legal_filter = action.legal, action.legal_filter
        before = {s: n for s, n in qs.state_counts().items() if n}
        total = sum(before.values())
        legal_before = (
            legal_filter(qs).count()
            if legal_filter
            else sum(n for s, n in before.items() if s in legal)
        )
        done = action.run(qs, self.claim_action_batch_size)
        reasons = [f"{n} {state_label(s)}" for s, n in sorted(before.items()) if s not in legal]
        if legal_filter:
            unexpired = sum(n for s, n in before.items() if s in legal) - legal_before
            if unexpired > 0:
                reasons.insert(0, str(_("%(n)s with a running lease") % {"n": unexpired}))
        if legal_before > done:
            reasons.append(
                str(_("%(n)s changed by someone else meanwhile") % {"n": legal_before - done})
            )
        # Rows can become legal between the count and the UPDATE (a worker failed one
        # more row of a "select all"): more done than counted, never a negative skip.
        skipped = max(0, total - done)
        text = _("%(title)s: %(done)s done") % {"title": action.title, "done": done}
        if done > legal_before:
            text += " " + _("(%(n)s of them changed state meanwhile)") % {"n": done - legal_before}
        text += ", " + _("%(skipped)s skipped") % {"skipped": skipped}
        if skipped:
            why = f"{', '.join(reasons)}: {action.rule}" if reasons else str(action.rule)
            text += f" ({why})"
        text += "."
        logger.info(
            "admin action model=%s action=%s user=%s done=%s skipped=%s",
            opts.label,
            action.title,
            getattr(request.user, "pk", None),
            done,
            skipped,
        )
        if done:
            log_model_action(request, self.model, text)
        self.message_user(  # type: ignore[attr-defined]
            request, text, messages.SUCCESS if done else messages.WARNING
        )

    @admin.action(
        description=_("Requeue selected tasks (failed, cancelled or done → ready)"),
        permissions=("change",),
    )
    def taskclaim_requeue(self, request: HttpRequest, queryset: models.QuerySet) -> None:
        """Put failed / cancelled / done rows back to ready, attempts reset."""
        self._run_claim_action(request, queryset, CLAIM_ACTIONS["requeue"])

    @admin.action(
        description=_("Retry selected failed tasks"),
        permissions=("change",),
    )
    def taskclaim_retry_failed(self, request: HttpRequest, queryset: models.QuerySet) -> None:
        """Put failed rows back to ready with a fresh retry budget."""
        self._run_claim_action(request, queryset, CLAIM_ACTIONS["retry_failed"])

    @admin.action(
        description=_("Cancel selected tasks (ready or processing)"),
        permissions=("change",),
    )
    def taskclaim_cancel(self, request: HttpRequest, queryset: models.QuerySet) -> None:
        """Cancel ready and processing rows; a worker holding one loses its claim."""
        action = CLAIM_ACTIONS["cancel"]
        if not action.available(self.claim_options):
            self.message_user(  # type: ignore[attr-defined]
                request,
                _("%(model)s has no cancelled status; nothing was changed.")
                % {"model": self.claim_options.label},
                messages.ERROR,
            )
            return
        self._run_claim_action(request, queryset, action)

    @admin.action(
        description=_("Release the lease of selected tasks (processing → ready)"),
        permissions=("change",),
    )
    def taskclaim_release(self, request: HttpRequest, queryset: models.QuerySet) -> None:
        """Take processing rows back from their holders (who are fenced); ready now."""
        self._run_claim_action(request, queryset, CLAIM_ACTIONS["release"])

    @admin.action(
        description=_("Reap selected tasks whose lease expired"),
        permissions=("change",),
    )
    def taskclaim_reap(self, request: HttpRequest, queryset: models.QuerySet) -> None:
        """Recover selected processing rows whose lease ran out (ready, or failed if spent)."""
        self._run_claim_action(request, queryset, CLAIM_ACTIONS["reap"])
