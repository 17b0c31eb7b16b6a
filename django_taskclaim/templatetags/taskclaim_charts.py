"""Template tags of the admin's charts (:mod:`django_taskclaim.admin.charts`): the
dashboard's and a changelist's, each rendering ``charts.html`` with the data it needs, so
that a page includes its charts with one line."""

from __future__ import annotations

from typing import Any

from django import template

register = template.Library()

TEMPLATE = "django_taskclaim/admin/charts.html"


def _request(context: Any) -> Any:
    return getattr(context, "request", None) or context.get("request")


@register.inclusion_tag(TEMPLATE, takes_context=True)
def taskclaim_dashboard_charts(context: Any, rows: Any) -> dict[str, Any]:
    """The charts of the dashboard's models: ``rows`` are the dashboard's
    (``taskclaim_rows``), so a chart is shown exactly for a model the dashboard shows."""
    # Deferred: Django imports every tag library when the template engine starts, and
    # the admin package needs django.contrib.admin installed.
    from django_taskclaim.admin.charts import dashboard_charts
    from django_taskclaim.admin.display import site_by_name

    request = _request(context)
    if request is None or not rows:
        return {"taskclaim_charts": []}
    site = site_by_name(getattr(request, "current_app", None))
    labels = [row["label"] for row in rows]
    return {"taskclaim_charts": dashboard_charts(request, site, labels), "where": "dashboard"}


@register.inclusion_tag(TEMPLATE, takes_context=True)
def taskclaim_changelist_charts(context: Any, cl: Any) -> dict[str, Any]:
    """The charts of a changelist's model (``cl``, the changelist), over what its admin
    shows; nothing when the admin sets ``claim_charts = False``."""
    from django_taskclaim.admin.charts import changelist_charts

    request = _request(context)
    model_admin = getattr(cl, "model_admin", None)
    if request is None or model_admin is None:
        return {"taskclaim_charts": []}
    charts = changelist_charts(request, model_admin)
    return {"taskclaim_charts": [charts] if charts else [], "where": "changelist"}
