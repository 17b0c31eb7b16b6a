"""URLs of the metrics tests: the admin and the Prometheus scrape view, as a project
adds them (docs/observability.md)."""

from django.contrib import admin
from django.urls import path

from django_taskclaim.ops.metrics.views import metrics_view

urlpatterns = [
    path("admin/", admin.site.urls),
    path("metrics/taskclaim", metrics_view, name="taskclaim-metrics"),
]
