"""Admin of the ``django.tasks`` table: states, attempts, errors, and the claim actions.

Failed tasks are retried from the changelist with the "retry failed" action of
:class:`~django_taskclaim.admin.ClaimableAdminMixin` (fenced, batched, permission-checked).
"""

from __future__ import annotations

import json
from typing import Any

from django.contrib import admin
from django.http import HttpRequest
from django.utils.html import format_html, format_html_join
from django.utils.translation import gettext_lazy as _

from django_taskclaim.admin import ClaimableAdminMixin
from django_taskclaim.admin.display import dotted
from django_taskclaim.contrib.tasks.models import QueuedTask


def _pretty(value: Any) -> str:
    return format_html(
        '<pre class="taskclaim-json">{}</pre>',
        json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str),
    )


@admin.register(QueuedTask)
class QueuedTaskAdmin(ClaimableAdminMixin, admin.ModelAdmin):  # type: ignore[misc]
    """Tasks enqueued through Django's Tasks API; arguments and results are read-only."""

    list_display = ["task", "queue_name", "created_at"]
    #: Priority and "run after" are on each task's page: the list fits the admin's width.
    claim_list_display = ("status_badge", "attempts", "holder", "lease_remaining", "short_error")
    list_filter = ["queue_name", "backend_name"]
    search_fields = ["task_path", "=id"]
    ordering = ["-created_at"]
    date_hierarchy = None
    readonly_fields = [
        "id",
        "task_path",
        "queue_name",
        "backend_name",
        "priority",
        "run_after",
        "max_attempts",
        "arguments",
        "result",
        "attempt_errors",
        "worker_ids",
        "started_at",
        "last_attempted_at",
    ]
    exclude = ["args", "kwargs", "return_value", "errors", "attempt_open"]

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """Tasks are created by ``enqueue()``, never by hand."""
        return False

    @admin.display(description=_("task"), ordering="task_path")
    def task(self, obj: QueuedTask) -> str:
        """The task's dotted path, free to wrap after each dot (never inside a name)."""
        return dotted(obj.task_path)

    @admin.display(description=_("arguments"))
    def arguments(self, obj: QueuedTask) -> str:
        """Positional and keyword arguments as stored (JSON)."""
        return _pretty({"args": obj.args, "kwargs": obj.kwargs})

    @admin.display(description=_("return value"))
    def result(self, obj: QueuedTask) -> str:
        """The stored return value (only meaningful once the task succeeded)."""
        return _pretty(obj.return_value) if obj.status == "done" else "—"

    @admin.display(description=_("errors"))
    def attempt_errors(self, obj: QueuedTask) -> str:
        """One block per failed or lost attempt: exception class and traceback."""
        entries = [e for e in (obj.errors or []) if isinstance(e, dict)]
        if not entries:
            return "—"
        return format_html_join(
            "",
            '<p><strong>{}</strong></p><pre class="taskclaim-error">{}</pre>',
            ((e.get("exception_class_path", "?"), e.get("traceback", "")) for e in entries),
        )
