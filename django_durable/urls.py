"""The pages of durable views (django_durable.views) and the Prometheus metrics
(django_durable.metrics). In your project:
``path("durable/", include("django_durable.urls"))``."""

from django.urls import path

from . import metrics, views

app_name = "durable"

urlpatterns = [
    path("runs/<str:token>/", views.run_page, name="run-page"),
    path("runs/<str:token>/status/", views.run_status, name="run-status"),
    path("metrics/", metrics.metrics_view, name="metrics"),
]
