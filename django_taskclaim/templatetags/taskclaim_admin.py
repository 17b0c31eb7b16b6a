"""Template tags of the admin integration."""

from __future__ import annotations

from typing import Any

from django import template
from django.urls import NoReverseMatch, reverse

register = template.Library()


@register.inclusion_tag("django_taskclaim/admin/app_index_dashboard.html", takes_context=True)
def taskclaim_dashboard(context: Any) -> dict[str, Any]:
    """Render the queue dashboard for the current admin site and user."""
    from django_taskclaim.admin.dashboard import dashboard_context
    from django_taskclaim.admin.display import site_by_name

    request = context["request"]
    site = site_by_name(getattr(request, "current_app", None))
    try:
        url = reverse("admin:taskclaim_dashboard", current_app=site.name)
    except NoReverseMatch:
        url = ""
    return {**dashboard_context(request, site), "taskclaim_dashboard_url": url}
