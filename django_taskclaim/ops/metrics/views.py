"""The Prometheus scrape view: the gauges of :mod:`.gauges` as text (:mod:`.exposition`).

Add it to your ``urls.py``; it answers only a request that carries
``Authorization: Bearer <TASKCLAIM_METRICS_TOKEN>`` (compared in constant time) or comes
from a logged-in active staff user with the permission :data:`PERMISSION`, and ``403``
to anyone else. See docs/observability.md.
"""

from __future__ import annotations

import hmac
import logging

from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse, HttpResponseForbidden
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_safe

from django_taskclaim.config.settings import taskclaim_settings
from django_taskclaim.ops.metrics.exposition import CONTENT_TYPE, render
from django_taskclaim.ops.metrics.gauges import collect

__all__ = ["PERMISSION", "allowed", "metrics_view"]

#: The permission a staff user needs to read the metrics (every model's queue names and
#: figures): a permission of its own, on the dashboard's proxy model.
PERMISSION = "taskclaim.view_metrics"

logger = logging.getLogger("django_taskclaim.ops.metrics")


def allowed(request: HttpRequest) -> bool:
    """Whether ``request`` may read the metrics: it carries the bearer token of
    ``TASKCLAIM_METRICS_TOKEN`` (when that is set), or its user is an active staff
    member (with ``AuthenticationMiddleware``) who holds :data:`PERMISSION` (a superuser
    does). Nothing else passes."""
    token = taskclaim_settings.METRICS_TOKEN
    header = request.headers.get("Authorization", "")
    scheme, _, given = header.partition(" ")
    given = given.strip()
    if (
        token
        and scheme.lower() == "bearer"
        and given
        and hmac.compare_digest(given.encode(), str(token).encode())
    ):
        return True
    user = getattr(request, "user", None)
    return bool(user is not None and user.is_active and user.is_staff and user.has_perm(PERMISSION))


@never_cache
@require_safe
def metrics_view(request: HttpRequest) -> HttpResponse:
    """Prometheus text of every claimable model's gauges, the paused queues and the
    workers (database clock), read fresh on each request: ``403`` unless
    :func:`allowed`, ``503`` with one line when the database cannot be read."""
    if not allowed(request):
        return HttpResponseForbidden(
            "forbidden: send Authorization: Bearer <TASKCLAIM_METRICS_TOKEN> or log in as "
            f"staff with the permission {PERMISSION}\n",
            content_type="text/plain; charset=utf-8",
        )
    try:
        text = render(collect())
    except DatabaseError as exc:
        logger.warning("metrics not read: database error=%s", " ".join(str(exc).split()))
        return HttpResponse(
            "database unavailable\n", status=503, content_type="text/plain; charset=utf-8"
        )
    response = HttpResponse(text, content_type=CONTENT_TYPE)
    response["Vary"] = "Authorization, Cookie"
    return response
