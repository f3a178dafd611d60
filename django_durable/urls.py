"""The pages of durable views (django_durable.views), the Prometheus metrics
(django_durable.metrics) and the health probes (django_durable.health). In your project:
``path("durable/", include("django_durable.urls"))``."""

from django.urls import path

from . import health, metrics, views

app_name = "durable"

urlpatterns = [
    path("runs/<str:token>/", views.run_page, name="run-page"),
    path("runs/<str:token>/status/", views.run_status, name="run-status"),
    path("metrics/", metrics.metrics_view, name="metrics"),
    path("health/", health.health_view, name="health"),
]
